"""The GPU check: one command for a GPU host, offline ones included, that says in <= 8 minutes whether
motionjax runs there and how fast, in one JSON and one markdown table.

    python -m benchmarks.gpu_check [--out results/gpu_check] [--wheels .whl] [--cpu] [--parts a,b]
    scripts/gpu_check.sh [the same flags]     # the same, with the interpreter chosen for you

It runs with the interpreter that starts it and that interpreter's own jax (a GPU image's jax and
CUDA plugin stay as they are). Packages ``setup.cfg`` needs that are missing, or outside its
bounds, are installed from the wheel folder (``pip install --no-index --find-links WHEELS``;
docs/gpu.md has the ``pip download`` line that makes one) and listed; no package index is ever
asked. Without pybullet (DeepMimic) or PyAV (videos) what needs them is skipped and says so.

Parts, each a subprocess with its own time limit (a part that hangs or fails is recorded and the
next one starts; the whole check stops starting parts at ``budget_s``):

``environment``  missing packages installed from the wheel folder; versions, devices, corpus found
``tests``        the GPU numerics (tests/test_backend_numerics.py: loss and gradient against float64
                 CPU references, blocked Jacobian against jax.jacfwd, shard_map halos) and the FK,
                 Jacobian and dynamics tests, with the default backend on the accelerator
``autoencoder``  the headline model (experiments/autoencoder.py, Bandai if present, else DeepMimic)
                 trained by motionjax train for a fixed number of steps: steps/s, input overhead (the
                 trainer's fed vs fixed-batch check), host ms per step, compile s (its summary.json)
``mfu``          that model's train step: XLA's FLOPs / step time against a float32 and a bfloat16
                 matmul peak measured here (as ``benchmarks/bench.py`` part e does)
``dynamics``     the dynamics loss + gradient at J = 24, 4,096 frames: blocked, jvp and dense
                 Jacobians, compile seconds per program (benchmarks/dynamics_grid.py)
``bench``        ``benchmarks/bench.py --quick --parts mfu,growth`` (its workload needs DeepMimic)

Without a GPU (``--cpu``, or when jax sees none) the same parts run on the CPU with tiny sizes and
short limits: the dry run ``tests/test_gpu_check.py`` runs in ``make test``, so the check cannot rot
between GPU runs. This module imports no jax at the top: the orchestrating process stays clean of
it (packages are installed before any part imports them), and each part imports what it needs.
"""
from __future__ import annotations

import argparse
import configparser
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("environment", "tests", "autoencoder", "mfu", "dynamics", "bench")
# Packages whose absence costs a part of the check, not the check: what needs them is skipped.
OPTIONAL = {"pybullet": "the DeepMimic clips and humanoid (tests that use them, DeepMimic training, bench)",
            "av": "videos of skeletons (the check trains without the clip video)"}


@dataclasses.dataclass(frozen=True)
class Mode:
    """What one mode runs: per-part time limits and sizes."""

    name: str
    limits: dict              # part -> seconds (a part also stops when the check's budget is spent)
    budget_s: float           # no part starts after this long; a part's limit is cut to what is left
    steps: int                # autoencoder: training steps
    input_check_steps: int    # autoencoder: the trainer's fed vs fixed-batch steps after training
    variant: str              # autoencoder: extra config variant (the dry run's tiny model)
    tests: tuple              # pytest arguments
    matmul_n: int             # mfu: the peak probe's matrix size
    rounds: int               # mfu: interleaved timing rounds
    joints: int               # dynamics: J (24: the SMPL-like body; else a random tree)
    frames: int               # dynamics: frames per batch
    dynamics_budget_s: float  # dynamics: timing seconds
    dense: bool               # dynamics: also the dense Jacobian


GPU_TESTS = ("tests/test_backend_numerics.py", "tests/test_kinematics.py", "tests/test_jacobian.py",
             "tests/test_dynamics.py")
MODES = {
    # A 16-core GPU host: 480 s of limits in all (the environment's pip install comes first).
    "gpu": Mode("gpu", limits=dict(environment=90, tests=100, autoencoder=120, mfu=50, dynamics=80,
                                   bench=120),
                budget_s=480, steps=500, input_check_steps=60,
                variant="", tests=GPU_TESTS, matmul_n=8192, rounds=5, joints=24,
                frames=4096, dynamics_budget_s=6.0, dense=True),
    # The dry run: every part's plumbing at tiny sizes (tests: the halo test only; the suite runs the rest).
    # Its seconds are compiles, which a loaded 2-core machine stretches 3-4x: generous limits (the
    # autoencoder's includes the trainer's input check, which compiles the plain step once more). The
    # dynamics part at J = 2 (a root and one child: the jvp pass's compile grows with the tree's depth,
    # 17.6 CPU s for the part's two programs against 33.7 at J = 5; the grid's Jacobians are checked
    # against each other in tests/test_jacobian.py and tests/test_dynamics.py).
    "cpu": Mode("cpu", limits=dict(environment=60, tests=90, autoencoder=210, mfu=90, dynamics=120,
                                   bench=0),
                budget_s=600, steps=4, input_check_steps=4, variant=",runlocal",
                tests=("tests/test_backend_numerics.py", "-k", "halo"), matmul_n=256, rounds=2, joints=2,
                frames=64, dynamics_budget_s=0.2, dense=False),
}


def log(message: str) -> None:
    print(f"[gpu_check] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Packages: what setup.cfg needs, what this interpreter has, installs from a wheel folder only


def _requirement_cls():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare interpreter: pip's own copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def requirements(setup_cfg: Path = ROOT / "setup.cfg", extras=("data",)) -> list[str]:
    """The requirement strings of ``install_requires`` and of ``extras`` in ``setup_cfg`` (markers kept)."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    groups = [cfg["options"]["install_requires"]] + [cfg["options.extras_require"][e] for e in extras]
    return [line.split("#")[0].strip() for g in groups for line in g.splitlines()
            if line.split("#")[0].strip()]


def unmet(reqs: list[str], version=metadata.version) -> list[tuple[str, str]]:
    """``[(requirement, why)]`` of ``reqs`` this interpreter does not satisfy: missing, or installed at
    a version outside the bounds. ``version(name)``: the installed version (raises when missing)."""
    requirement_cls = _requirement_cls()
    out = []
    for text in reqs:
        req = requirement_cls(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(req.name)
        except metadata.PackageNotFoundError:
            out.append((text, "missing"))
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append((text, f"installed {have}"))
    return out


def install_command(requirement: str, wheels: Path) -> list[str]:
    """pip, offline: the wheel folder is the only source (``--no-index``)."""
    return [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
            "--disable-pip-version-check", "--no-input", requirement]


def install_missing(wheels: Path, limit_s: float, reqs: list[str] | None = None) -> dict:
    """Install each unmet requirement from ``wheels``, one at a time (one without a wheel does not stop
    the others). Returns ``{"unmet": [...], "installed": [...], "failed": {req: reason}}``."""
    todo = unmet(requirements() if reqs is None else reqs)
    result = {"unmet": [f"{r} ({why})" for r, why in todo], "installed": [], "failed": {},
              "wheels": str(wheels)}
    if todo and not wheels.is_dir():
        result["failed"] = {r: f"no wheel folder {wheels} (docs/gpu.md: how to make one)" for r, _ in todo}
        return result
    start = time.perf_counter()
    for req, why in todo:
        left = limit_s - (time.perf_counter() - start)
        if left <= 0:
            result["failed"][req] = "the environment part's time limit was spent"
            continue
        try:
            done = subprocess.run(install_command(req, wheels), capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            result["failed"][req] = f"pip ran past {left:.0f} s"
            continue
        if done.returncode == 0:
            result["installed"].append(req)
            log(f"installed {req} from {wheels} (was {why})")
        else:
            reason = [line for line in done.stderr.splitlines() if line.startswith("ERROR")][:1]
            result["failed"][req] = reason[0] if reason else f"pip exit {done.returncode}"
            log(f"not installed: {req} ({why}): {result['failed'][req]}")
    return result


# ---------------------------------------------------------------------------------------------
# Running the parts: subprocesses with time limits


def run_limited(cmd: list[str], limit_s: float, log_path: Path, env: dict) -> dict:
    """Run ``cmd`` in its own process group with output to ``log_path``; past ``limit_s`` the group
    gets SIGTERM (motionjax train checkpoints and writes its summary then), 20 s later SIGKILL."""
    start = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    return {"rc": rc, "timed_out": timed_out, "seconds": time.perf_counter() - start}


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def part_env(mode: Mode, out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if mode.name == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    # One compilation cache for the check's processes, fresh each run: the mfu part reuses the
    # autoencoder's step; the compile seconds reported (autoencoder, dynamics) are cold ones.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(out / "jax_cache"))
    return env


def _part_command(name: str, mode: Mode, out: Path, plan: dict) -> list[str]:
    return [sys.executable, "-m", "benchmarks.gpu_check", "--part", name, "--mode", mode.name,
            "--out", str(out), "--plan", json.dumps(plan)]


# ---------------------------------------------------------------------------------------------
# The parts that run in their own process (``--part NAME``): each returns a JSON-able dict


def probe(plan: dict) -> dict:
    """Versions, devices and what the data parts can use."""
    import jax

    names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy", "ml-collections",
             "pybullet", "av")
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    plugins = sorted(d.metadata["Name"] for d in metadata.distributions()
                     if re.match(r"jax[-_]cuda\d+[-_](plugin|pjrt)", d.metadata["Name"] or ""))
    devices = jax.devices()
    out = {"python": platform.python_version(), "versions": versions, "jax_plugins": plugins,
           "backend": jax.default_backend(), "devices": [str(d) for d in devices],
           "device_kind": devices[0].device_kind, "device_count": len(devices), "cpu_count": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True)
        out["nvidia_smi"] = smi.stdout.strip()
    out["corpus"] = choose_corpus(plan.get("corpus", "auto"), versions["pybullet"] is not None)
    return out


def choose_corpus(corpus: str, pybullet: bool) -> dict:
    """``{"variant", "why"}`` of the autoencoder config to train: Bandai where its clips or its prepared
    data are here, else DeepMimic where pybullet is; ``variant`` None when neither is."""
    from experiments import autoencoder
    bandai = autoencoder.get_config("bandai").data
    found = [p for p in (bandai.source, bandai.dir) if (ROOT / p).exists()]
    if corpus == "bandai" or (corpus == "auto" and found):
        return {"variant": "bandai", "why": f"found {', '.join(found)}" if found else "asked for"}
    if corpus == "deepmimic" or (corpus == "auto" and pybullet):
        return {"variant": "deepmimic", "why": "pybullet's DeepMimic clips" if pybullet else "asked for"}
    return {"variant": None, "why": f"no corpus: neither {bandai.source} nor {bandai.dir} exists, and "
            "pybullet (the DeepMimic clips) is not installed"}


def headline_config(plan: dict, mode: Mode):
    """The autoencoder's config as the ``autoencoder`` part trains it (:func:`train_overrides`)."""
    from experiments import autoencoder
    config = autoencoder.get_config(plan["variant"] + mode.variant)
    config.train.update(steps=mode.steps, eval_every=mode.steps, checkpoint_every=mode.steps)
    if plan.get("data_dir"):
        config.data.dir = plan["data_dir"]
    return config


def train_overrides(plan: dict, mode: Mode) -> list[str]:
    """motionjax train flags: ``mode.steps`` steps, one held-out evaluation at the end, no video, no
    PCA reference fit and no per-label tables (none is timed, but the part's time limit counts them)."""
    flags = [f"--config.train.steps={mode.steps}", f"--config.train.eval_every={mode.steps}",
             f"--config.train.checkpoint_every={mode.steps}", "--config.evals.clip.video_s=0.0",
             f"--config.train.input_check_steps={mode.input_check_steps}",
             "--config.evals.final.references=()", "--config.evals.final.by_label=False",
             "--config.evals.final.splits=('validation',)"]
    if plan.get("data_dir"):
        flags.append(f"--config.data.dir={plan['data_dir']}")
    return flags


def mfu(plan: dict, mode: Mode) -> dict:
    """FLOPs per step of the headline train step over its time and over a matmul peak measured in the
    same round-robin (float32 at XLA's default precision, which may use TF32 on NVIDIA GPUs since
    Ampere, and bfloat16): MFU against the higher peak."""
    import jax
    import jax.numpy as jnp

    from benchmarks import measure, suite
    from motionjax.data import pipeline
    config = headline_config(plan, mode)
    info = pipeline.dataset_info(config.data)
    start = time.perf_counter()
    step, state, batch, _, _ = suite.compiled_step(config, info)
    compile_s = time.perf_counter() - start
    flops = measure.compiled_flops(step)
    calls, matmul_flops = {"step": suite.stepper(step, state, batch)}, {}
    for dtype in ("float32", "bfloat16"):
        calls[dtype], matmul_flops[dtype] = measure.matmul(mode.matmul_n, jnp.dtype(dtype))
    times = measure.interleaved(calls, rounds=mode.rounds)
    peaks = {d: matmul_flops[d] / times[d] for d in matmul_flops}
    achieved = flops / times["step"]
    return {"model": f"autoencoder.py:{plan['variant']}{mode.variant}", "batch": config.data.batch_size,
            "window": config.data.window, "flops_per_step": flops, "step_ms": 1e3 * times["step"],
            "compile_s": compile_s, "achieved_tflops": achieved / 1e12,
            "peak_tflops": {d: p / 1e12 for d, p in peaks.items()}, "matmul_n": mode.matmul_n,
            "mfu": achieved / max(peaks.values()), "mfu_vs": {d: achieved / p for d, p in peaks.items()},
            "backend": jax.default_backend()}


def dynamics(plan: dict, mode: Mode, out: Path) -> dict:
    """One row of the dynamics grid (:func:`benchmarks.dynamics_grid.measure_size`): the three Jacobians'
    loss + gradient at ``mode.joints`` and ``mode.frames``, compile seconds and milliseconds each.

    Blocked and jvp first, kept as a partial result; then the row again with the dense Jacobian (the
    slowest compile), whose blocked and jvp programs come from the compilation cache: their compile
    seconds are the first row's."""
    import jax

    from benchmarks import dynamics_grid
    from motionjax.core.skeleton import random_tree, smpl_like
    skeleton = smpl_like() if mode.joints == 24 else random_tree(mode.joints, seed=0)
    label = "24 (smpl_like)" if mode.joints == 24 else f"{mode.joints} (random_tree)"

    def measure(dense):
        row = dynamics_grid.measure_size(label, skeleton, mode.frames, "float32",
                                         budget_s=mode.dynamics_budget_s, dense=dense)
        row["not_run"] = row.pop("skipped")  # {jacobian: why}; "skipped" names a skipped part here
        return row

    row = {**measure(False), "backend": jax.default_backend()}
    (out / "parts" / "dynamics.partial.json").write_text(json.dumps(row, default=str))
    if not mode.dense:
        return row
    compiles = {f"{j}_compile_s": row[f"{j}_compile_s"] for j in ("blocked", "jvp")}
    return {**measure(True), **compiles, "backend": jax.default_backend()}


def run_part(name: str, mode: Mode, out: Path, plan: dict) -> dict:
    if name == "environment":
        return probe(plan)
    if name == "mfu":
        return mfu(plan, mode)
    if name == "dynamics":
        return dynamics(plan, mode, out)
    raise ValueError(f"unknown part {name!r}")


# ---------------------------------------------------------------------------------------------
# The orchestration


def check(out: Path, wheels: Path, force_cpu: bool = False, parts=PARTS, corpus: str = "auto",
          data_dir: str | None = None, budget_s: float | None = None) -> dict:
    """Run the check; returns (and writes to ``out``) ``gpu_check.json`` and ``gpu_check.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "parts").mkdir(exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    shutil.rmtree(out / "jax_cache", ignore_errors=True)
    start = time.perf_counter()
    mode = MODES["cpu" if force_cpu else "gpu"]
    command = shlex.join([Path(sys.executable).name, "-m", "benchmarks.gpu_check", *sys.argv[1:]])
    results = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "host": platform.node(), "python": sys.executable,
               "command": command, "mode": mode.name, "parts": {}}

    # environment: packages first (in this process: nothing has imported them yet), then the probe
    t = time.perf_counter()
    installs = install_missing(wheels, mode.limits["environment"] - 30)
    env = part_env(mode, out)
    plan = {"corpus": corpus, "data_dir": data_dir}
    probe_run = _run_json_part("environment", mode, out, plan, env, limit_s=60)
    environment = {**probe_run, "packages": installs}
    results["parts"]["environment"] = environment
    if "error" not in probe_run:
        if probe_run["backend"] != "gpu" and mode.name == "gpu":
            log(f"jax sees no GPU (backend {probe_run['backend']}): a dry run on the CPU, small sizes")
            mode = MODES["cpu"]
            results["mode"] = mode.name
            env = part_env(mode, out)
        plan["variant"] = probe_run["corpus"]["variant"]
    environment["seconds"] = time.perf_counter() - t
    _write(results, out)
    budget = mode.budget_s if budget_s is None else budget_s
    for name in parts:
        if name == "environment":
            continue
        left = budget - (time.perf_counter() - start)
        limit = min(mode.limits[name], left)
        skip = _skip_reason(name, mode, plan, results, limit)
        if skip:
            results["parts"][name] = {"skipped": skip}
            log(f"{name}: skipped: {skip}")
            continue
        log(f"{name}: started, limit {limit:.0f} s ({time.perf_counter() - start:.0f} s into the check)")
        if name == "tests":
            results["parts"][name] = _tests(mode, out, env, limit)
        elif name == "autoencoder":
            results["parts"][name] = _autoencoder(mode, out, plan, env, limit)
        elif name == "bench":
            results["parts"][name] = _bench(out, env, limit)
        else:
            results["parts"][name] = _run_json_part(name, mode, out, plan, env, limit)
        part = results["parts"][name]
        log(f"{name}: {_status(part)} after {part.get('seconds', 0):.0f} s")
        _write(results, out)
    results["seconds"] = time.perf_counter() - start
    results["ok"] = not any("error" in p for p in results["parts"].values())
    table = _write(results, out)
    print(table, flush=True)
    log(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} in {results['seconds']:.0f} s")
    return results


def _skip_reason(name: str, mode: Mode, plan: dict, results: dict, limit: float) -> str | None:
    if limit <= 5:
        return f"the check's budget of {mode.budget_s:.0f} s is spent"
    if "error" in results["parts"]["environment"]:
        return "the environment probe failed (see its error)"
    versions = results["parts"]["environment"]["versions"]
    if name in ("autoencoder", "mfu") and not plan.get("variant"):
        return results["parts"]["environment"]["corpus"]["why"]
    if name == "bench":
        if mode.name == "cpu":
            return "dry run: benchmarks/bench.py --quick has its own tests (tests/test_bench.py)"
        if not versions.get("pybullet"):
            return "bench.py's workload trains on the DeepMimic clips, which ship with pybullet (missing)"
    return None


def _status(part: dict) -> str:
    return "skipped" if "skipped" in part else f"error: {part['error']}" if "error" in part else "ok"


def _run_json_part(name: str, mode: Mode, out: Path, plan: dict, env: dict, limit_s: float) -> dict:
    path = out / "parts" / f"{name}.json"
    path.unlink(missing_ok=True)
    run = run_limited(_part_command(name, mode, out, plan), limit_s, out / "logs" / f"{name}.log", env)
    result = json.loads(path.read_text()) if path.exists() else {}
    partial = out / "parts" / f"{name}.partial.json"
    if not result and partial.exists():
        result = {**json.loads(partial.read_text()), "partial": True}
    if run["timed_out"]:
        result["error"] = f"ran past its limit of {limit_s:.0f} s"
    elif run["rc"] != 0 or not result:
        result["error"] = f"exit {run['rc']}: {_tail(out / 'logs' / f'{name}.log', 3)}"
    result["seconds"] = run["seconds"]
    return result


def _tests(mode: Mode, out: Path, env: dict, limit_s: float) -> dict:
    """pytest on the accelerator (the CPU beside it for the float64 references); counts per outcome
    from its verbose lines (so a run stopped by its limit still says how far it got) and the
    relative errors the numerics tests print."""
    env = dict(env)
    if mode.name == "gpu":
        env["JAX_PLATFORMS"] = "cuda,cpu"
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"  # numerics of the programs training runs
    log_path = out / "logs" / "tests.log"
    cmd = [sys.executable, "-m", "pytest", "-v", "-rP", "-p", "no:cacheprovider", *mode.tests]
    run = run_limited(cmd, limit_s, log_path, env)
    text = log_path.read_text(errors="replace")
    outcomes = re.findall(r"^(tests/\S+::.+?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", text, re.M)
    counts = {}
    for _, outcome in outcomes:
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    result = {"command": shlex.join(["python", *cmd[1:]]), "counts": counts, "seconds": run["seconds"],
              "failed": [t for t, o in outcomes if o in ("FAILED", "ERROR")],
              "numerics": sorted(set(re.findall(r"^(\w+ \S+: relative errors \{.*\})$", text, re.M))),
              "skip_reasons": sorted(set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", text, re.M)))}
    if run["timed_out"]:
        result["error"] = f"ran past its limit of {limit_s:.0f} s after {sum(counts.values())} tests"
    elif run["rc"] not in (0, 5) or result["failed"]:
        result["error"] = f"pytest exit {run['rc']}: {len(result['failed'])} failed"
    return result


def _autoencoder(mode: Mode, out: Path, plan: dict, env: dict, limit_s: float) -> dict:
    """motionjax train for ``mode.steps`` steps; the numbers of its summary.json."""
    workdir = out / "autoencoder_run"
    shutil.rmtree(workdir, ignore_errors=True)  # a workdir resumes: this one starts fresh
    spec = f"experiments/autoencoder.py:{plan['variant']}{mode.variant}"
    cmd = [sys.executable, "-m", "motionjax", "train", "--config", spec, "--workdir", str(workdir),
           *train_overrides(plan, mode)]
    run = run_limited(cmd, limit_s, out / "logs" / "autoencoder.log", env)
    result = {"config": spec, "command": shlex.join(["python", *cmd[1:]]), "seconds": run["seconds"]}
    try:
        summary = json.loads((workdir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    if summary:
        keep = ("steps", "status", "steps_per_s", "frames_per_s", "input_overhead", "input_check", "host",
                "host_wait_fraction", "compile_s", "train_s", "eval_s", "params")
        result.update({k: summary.get(k) for k in keep})
        result["validation_mpjpe_cm"] = _validation_mpjpe(summary)
        result["frames_per_step"] = summary["frames_per_s"] / summary["steps_per_s"] if summary.get(
            "steps_per_s") else None
    if run["timed_out"]:
        result["error"] = f"ran past its limit of {limit_s:.0f} s" + (" (the numbers: its summary.json)"
                                                                       if summary else "")
    elif run["rc"] != 0 or not summary:
        result["error"] = f"exit {run['rc']}: {_tail(out / 'logs' / 'autoencoder.log', 3)}"
    return result


def _validation_mpjpe(summary: dict):
    """The final evaluation's validation MPJPE (cm, clean input), where the summary has one."""
    try:
        return summary["results"]["validation"]["clean"]["model"]["mpjpe"]
    except (KeyError, TypeError):
        return None


def _bench(out: Path, env: dict, limit_s: float) -> dict:
    """``benchmarks/bench.py --quick --parts mfu,growth`` (the parts of the quick bench that measure the
    device; its ``train`` part compares loaders and Jacobians on the CPU-era baseline)."""
    cmd = [sys.executable, "-m", "benchmarks.bench", "--quick", "--parts", "mfu,growth",
           "--out", str(out / "bench")]
    run = run_limited(cmd, limit_s, out / "logs" / "bench.log", env)
    result = {"command": shlex.join(["python", *cmd[1:]]), "seconds": run["seconds"]}
    try:
        bench = json.loads((out / "bench" / "bench.json").read_text())["parts"]
        result["mfu"] = bench.get("mfu", {}).get("mfu")
        result["growth_T_exponent"] = bench.get("growth", {}).get("fit_T_tail", {}).get("exponent")
    except (OSError, ValueError, KeyError):
        pass
    if run["timed_out"]:
        result["error"] = f"ran past its limit of {limit_s:.0f} s"
    elif run["rc"] != 0:
        result["error"] = f"exit {run['rc']}: {_tail(out / 'logs' / 'bench.log', 3)}"
    return result


# ---------------------------------------------------------------------------------------------
# The table


def _fmt(x, spec=".3g"):
    return "—" if x is None else format(x, spec)


def summary_line(name: str, part: dict, results: dict) -> str:
    """One cell: what the part measured."""
    if "skipped" in part:
        return f"skipped: {part['skipped']}"
    if name == "environment" and "versions" in part:
        v = part["versions"]
        pkgs = part["packages"]
        installed = ", ".join(pkgs["installed"]) or "nothing"
        plugins = ", ".join(part["jax_plugins"]) or "no plugin"
        line = (f"Python {part['python']}, jax {v['jax']} / jaxlib {v['jaxlib']} ({plugins}), "
                f"flax {v['flax']}, optax {v['optax']}, orbax {v['orbax-checkpoint']}, grain {v['grain']}; "
                f"{part['device_count']} × {part['device_kind']} "
                f"({part['backend']}), {part['cpu_count']} CPUs; "
                f"installed from {pkgs['wheels']}: {installed}")
        if pkgs["failed"]:
            line += "; not installed: " + ", ".join(pkgs["failed"])
        return line + f"; corpus: {part['corpus']['variant'] or '—'} ({part['corpus']['why']})"
    if name == "tests" and "counts" in part:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(part["counts"].items()))
        numerics = "; ".join(part["numerics"])
        return f"{counts or 'no tests ran'}" + (f"; {numerics}" if numerics else "")
    if name == "autoencoder" and part.get("steps_per_s"):
        overhead, host = part.get("input_overhead"), part.get("host") or {}
        return (f"{part['config']}: {part['steps']} steps, {part['steps_per_s']:.1f} steps/s "
                f"({part['frames_per_s']:,.0f} frames/s), input overhead "
                f"{'—' if overhead is None else format(100 * overhead, '.1f') + '%'} (fed vs fixed batch), "
                f"host {_fmt(host.get('host_ms_p50'))} ms/step (p99 {_fmt(host.get('host_ms_p99'))}, "
                f"dispatch {_fmt(host.get('dispatch_ms_p50'))}), compile {part['compile_s']:.1f} s, "
                f"validation MPJPE {_fmt(part.get('validation_mpjpe_cm'))} cm")
    if name == "mfu" and "mfu" in part:
        peaks = ", ".join(f"{d} {p:,.1f}" for d, p in part["peak_tflops"].items())
        return (f"step {part['step_ms']:.2f} ms, {part['flops_per_step'] / 1e9:.2f} GFLOP: "
                f"{part['achieved_tflops']:.2f} TFLOP/s = {100 * part['mfu']:.2f}% of the best matmul peak "
                f"({peaks} TFLOP/s, n = {part['matmul_n']})")
    if name == "dynamics" and "blocked_ms" in part:
        cells = []
        for jac in ("blocked", "jvp", "dense"):
            ms = part.get(f"{jac}_ms")
            compile_s = part.get(f"{jac}_compile_s")
            cells.append(f"{jac} {_fmt(ms, '.2f')} ms (compile {_fmt(compile_s, '.1f')} s)" if ms is not None
                         else f"{jac} not run ({part['not_run'].get(jac, 'the time ran out')})")
        return f"J = {part['J']}, {part['frames']} frames, float32: " + ", ".join(cells)
    if name == "bench" and "mfu" in part:
        return f"MFU {_fmt(part['mfu'])}, step time ∝ T^{_fmt(part.get('growth_T_exponent'), '.2f')}"
    return ""


def markdown(results: dict) -> str:
    lines = [f"# GPU check, {results['date']}", "",
             f"`{results['command']}` on {results['host']} ({results['mode']} mode)"
             + (f", {results['seconds']:.0f} s" if "seconds" in results else ""), "",
             "| part | status | s | result |", "| --- | --- | --- | --- |"]
    for name, part in results["parts"].items():
        status = "skipped" if "skipped" in part else "**error**" if "error" in part else "ok"
        cell = summary_line(name, part, results)
        if "error" in part:
            cell = f"{part['error']}" + (f"; {cell}" if cell else "")
        cell = cell.replace("|", "/").replace("\n", " ")
        lines.append(f"| {name} | {status} | {_fmt(part.get('seconds'), '.0f')} | {cell} |")
    return "\n".join(lines) + "\n"


def _write(results: dict, out: Path) -> str:
    table = markdown(results)
    (out / "gpu_check.md").write_text(table)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/gpu_check", help="results folder")
    parser.add_argument("--wheels", default=".whl", help="wheel folder for missing packages (default .whl)")
    parser.add_argument("--cpu", action="store_true", help="the dry run: CPU, tiny sizes, short limits")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--corpus", default="auto", choices=("auto", "bandai", "deepmimic"),
                        help="the autoencoder's corpus (auto: Bandai if present, else DeepMimic)")
    parser.add_argument("--data-dir", default=None, help="prepared-data folder (config.data.dir) to use")
    parser.add_argument("--budget", type=float, default=None, help="seconds after which no part starts "
                        "(default: 480 on a GPU, 300 in the dry run)")
    parser.add_argument("--part", help=argparse.SUPPRESS)   # internal: run one part in this process
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if args.part:
        result = run_part(args.part, MODES[args.mode], out, json.loads(args.plan))
        (out / "parts" / f"{args.part}.json").write_text(json.dumps(result, indent=2, default=str))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}; expected a subset of {','.join(PARTS)}")
    parts = ["environment", *sorted(set(parts) - {"environment"}, key=PARTS.index)]  # the probe comes first
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    results = check(out, Path(args.wheels).resolve(), force_cpu=args.cpu, parts=parts, corpus=args.corpus,
                    data_dir=data_dir, budget_s=args.budget)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
