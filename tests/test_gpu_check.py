"""benchmarks/gpu_check.py: its package logic, and its CPU dry run end to end (so the GPU check
cannot rot between GPU runs)."""
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parent.parent


def test_requirements_are_setup_cfgs_and_unmet_names_missing_and_out_of_range():
    reqs = gpu_check.requirements()
    names = [r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for r in reqs]
    for name in ("jax", "flax", "optax", "orbax-checkpoint", "grain", "pybullet"):
        assert name in names
    installed = {"jax": "0.12.0", "flax": "0.12.8", "optax": "0.2.8"}

    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    got = dict(gpu_check.unmet(["jax>=0.11.2,<0.13", "flax>=0.12.10,<0.13", "optax>=0.2.4", "grain>=0.2.10",
                                "nowhere>=1; python_version < '3'"], version=version))
    assert got == {"flax>=0.12.10,<0.13": "installed 0.12.8", "grain>=0.2.10": "missing"}


def test_installs_come_from_the_wheel_folder_only(tmp_path):
    command = gpu_check.install_command("grain>=0.2.10", tmp_path)
    assert "--no-index" in command and command[command.index("--find-links") + 1] == str(tmp_path)
    assert "--index-url" not in command and "--extra-index-url" not in command
    # No folder: nothing is tried, each unmet requirement says why.
    result = gpu_check.install_missing(tmp_path / "absent", 10, reqs=["surely-not-installed-pkg>=1"])
    assert result["installed"] == []
    assert "no wheel folder" in result["failed"]["surely-not-installed-pkg>=1"]


def test_a_part_past_its_limit_is_stopped_and_recorded(tmp_path):
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    run = gpu_check.run_limited(sleeper, 1.0, tmp_path / "log", env=None)
    assert run["timed_out"] and run["seconds"] < 30
    assert (tmp_path / "log").read_text().startswith("up")


@pytest.mark.slow
@pytest.mark.e2e  # ~80 CPU s; make test: the check's requirement, install and limit tests above
def test_dry_run_on_cpu_runs_every_part_and_writes_the_table(tmp_path, deepmimic_dir, user_env):
    """The check end to end with --cpu: tiny sizes, DeepMimic, every part ok or skipped with a reason. On
    one CPU device (``user_env``), as the check runs on a one-GPU host: less CPU than on the suite's
    eight, whose meshes other tests prove."""
    out = tmp_path / "gc"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--out", str(out),
                           "--corpus", "deepmimic", "--data-dir", str(deepmimic_dir), "--wheels",
                           str(tmp_path / "no_wheels")], cwd=ROOT, env=user_env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    parts = results["parts"]
    assert results["mode"] == "cpu" and results["ok"]
    assert list(parts) == list(gpu_check.PARTS)
    environment = parts["environment"]
    assert environment["backend"] == "cpu" and environment["corpus"]["variant"] == "deepmimic"
    assert parts["tests"]["counts"].get("passed", 0) >= 1 and not parts["tests"]["failed"]  # CPU halos
    ae = parts["autoencoder"]
    assert ae["steps"] == gpu_check.MODES["cpu"].steps and ae["steps_per_s"] > 0 and ae["compile_s"] > 0
    # The input's cost measured where it runs (fed vs fixed batch), and the host's time per step.
    assert -1 < ae["input_overhead"] < 1 and ae["input_check"]["fixed_steps_per_s"] > 0
    assert ae["input_check"]["steps"] == gpu_check.MODES["cpu"].input_check_steps
    # The trainer's own speed line (motionjax train's stdout, in the part's log) says it with its interval.
    assert re.search(r"^speed: .* input overhead -?[\d.]+% \[-?[\d.]+, -?[\d.]+\] \(fed vs fixed batch\)",
                     (out / "logs" / "autoencoder.log").read_text(), re.M)
    assert ae["host"]["dispatch_ms_p50"] > 0 and "input overhead" in (out / "gpu_check.md").read_text()
    assert 0 < parts["mfu"]["mfu"] < 1 and parts["mfu"]["flops_per_step"] > 0
    assert parts["dynamics"]["blocked_compile_s"] > 0 and parts["dynamics"]["jvp_ms"] > 0
    assert "skipped" in parts["bench"]
    table = (out / "gpu_check.md").read_text()
    for name in gpu_check.PARTS:
        assert f"| {name} |" in table
