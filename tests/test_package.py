"""motionjax as a user installs it: the wheel, in a fresh virtual environment, used from a folder that
is not the checkout. Only ``motionjax`` lands at the top of site-packages (the shipped experiments go
inside it), and ``motionjax train`` runs an experiment file given by path, or by name.

The wheel is built without build isolation and installed without dependencies; the new environment
sees this test's own environment's packages through a ``.pth`` line (after its own site-packages,
so its ``motionjax`` is the wheel's): nothing is downloaded, and the check takes a minute.
"""
import json
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from runs import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the checkout's wheel installed in it; returns the venv directory."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"  # setuptools builds in the tree (build/, *.egg-info): a copy, not the checkout
    for name in ("motionjax", "experiments"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(root / "dist"), str(source)], check=True, capture_output=True, cwd=root)
    (wheel,) = (root / "dist").glob("motionjax-*.whl")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    (own_site,) = (env_dir / "lib").glob("python3*/site-packages")
    (own_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
                    "-q", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    return env_dir


@pytest.mark.slow  # pip subprocesses
def test_the_wheel_holds_motionjax_alone_with_its_experiments(installed):
    (own_site,) = (installed / "lib").glob("python3*/site-packages")
    top = {p.name for p in own_site.iterdir() if not p.name.endswith((".dist-info", ".pth"))}
    assert top == {"motionjax"}, top
    (wheel,) = installed.parent.glob("dist/motionjax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"motionjax", "motionjax-0.1.0.dist-info"}
    shipped = sorted(p.name for p in (REPO / "experiments").glob("*.py"))
    assert sorted(n.split("/")[-1] for n in names if n.startswith("motionjax/experiments/")) == shipped
    assert not any(n.startswith(("benchmarks/", "experiments/", "tests/", "scripts/")) for n in names)


@pytest.mark.slow  # builds a wheel, then a trainer subprocess
def test_motionjax_train_from_the_wheel_in_another_folder(installed, tmp_path, deepmimic_dir, env):
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    shown = subprocess.run([installed / "bin" / "motionjax", "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert shown.returncode == 0 and "deepmimic_denoise" in shown.stdout, shown.stdout
    config = f"{REPO / 'experiments/deepmimic_denoise.py'}:runlocal"
    # The runlocal schedule as it is (6 steps): the programs the suite's other runlocal runs compile.
    trained = subprocess.run([installed / "bin" / "motionjax", "train", "--config", config,
                              f"--config.data.dir={deepmimic_dir}", "--config.evals.final.splits=('test',)"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    # No --workdir: the run directory is runs/<config name>_<variant>, under the folder it ran from.
    assert "run directory: runs/deepmimic_denoise_runlocal" in trained.stdout, trained.stdout[-3000:]
    summary = json.loads((tmp_path / "runs/deepmimic_denoise_runlocal/summary.json").read_text())
    # Trained to 6, evaluated at 3 and 6, the checkpoint chosen by validation (which one: the noise's).
    assert summary["status"] == "done" and summary["steps"] == 6, summary
    assert summary["evaluated_step"] in (3, 6), summary
    assert summary["results"]["test"]  # trained and evaluated (the final table's test split)
    # By name, the experiment is the copy inside the wheel (the command resolves it so, then trains as above).
    probe = "from motionjax import configs; print(configs.resolve('deepmimic_denoise:runlocal'))"
    by_name = subprocess.run([installed / "bin" / "python", "-c", probe], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    (own_site,) = (installed / "lib").glob("python3*/site-packages")
    assert by_name == f"{own_site / 'motionjax/experiments/deepmimic_denoise.py'}:runlocal"
