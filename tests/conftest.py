"""Test-session setup: 8 virtual CPU devices (set before jax is imported) for mesh tests, one
persistent compilation cache for the session (a program compiled by one test, or by a trainer in a
subprocess, is compiled once), and the session fixtures several test files share (helpers to
import: ``runs.py``)."""
import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_FLAG = "--xla_force_host_platform_device_count=8"
# No XLA flag of jaxlib 0.12 shortens these compiles (the old --xla_cpu_use_fusion_emitters=false is gone
# and XLA aborts on an unknown flag): every fusion goes through an MLIR pipeline of its own, ~70% of a
# small program's compile. Compile CPU seconds of a probe of this suite's programs (test_jacobian's and
# test_dynamics's gradients; 2 shared cores, 2026-12-04): 16.5 as set here; xla_cpu_opt_preset=
# FAST_COMPILE 17.2, xla_cpu_parallel_codegen_split_count=1 15.6-16.1, xla_cpu_emitter_verification_level=0
# 15.8, xla_cpu_max_isa=AVX2 16.4 (all within the noise); without JAX_DISABLE_MOST_OPTIMIZATIONS (below) 30.5.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of the suite's time is XLA compiling small programs that then run for milliseconds: skip
# LLVM's expensive backend passes (jax_disable_most_optimizations; HLO passes such as fusion and
# collective placement still run). Subprocesses inherit it. JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs
# the suite on the fully optimized programs.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Many tests build the same train step (the tiny runlocal config) in this process and in trainer
# subprocesses, which inherit this environment: each program compiles once per session.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="motionjax_test_jax_cache_")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


@pytest.fixture(scope="session")
def deepmimic_dir(tmp_path_factory) -> Path:
    """The 15 DeepMimic clips prepared once per session with the base config's data settings (the
    runlocal config shares them). Read-only: a test that damages or adds files works on a copy.
    Skips the tests that use it where pybullet (which ships the clips) is missing."""
    pytest.importorskip("pybullet")
    from motionjax.configs import base
    from motionjax.data import pipeline

    cfg = base.get_config().data
    cfg.dir = str(tmp_path_factory.mktemp("deepmimic"))
    pipeline.dataset_info(cfg)
    return Path(cfg.dir)


@pytest.fixture(scope="session")
def env():
    """Environment of trainer subprocesses: 8 CPU devices like the tests, and the session's
    compilation cache with every program kept (so only the first run of a program compiles)."""
    return dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory, deepmimic_dir, env) -> Path:
    """The workdir of ``motionjax train`` on the runlocal config with ``runs.TWO_PROCESS_RUN``'s schedule
    (80 steps), uninterrupted, saving only at the end (a save does not change the training), in one
    process on 2 CPU devices: the parameters and losses that test_train.py's kill -9 resume (one process,
    2 devices) and test_multiprocess.py's SIGTERM resume (two processes, a device each) must each end at,
    bit for bit. Trained once per session: under xdist the first worker to ask trains it in the session's
    shared directory and the others wait on its lock, then read it (the clips are prepared in each worker
    alike)."""
    import fcntl
    import subprocess

    from runs import REPO, TWO_PROCESS_RUN, cpu_devices, pool_of, train_cmd

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's, above every worker's own
    workdir = root / "uninterrupted_run"
    with open(root / "uninterrupted_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this worker dies
        if not (workdir / "summary.json").exists():
            shutil.rmtree(workdir, ignore_errors=True)  # a run a failed worker left half done
            flags = [f if "checkpoint_every" not in f else "--config.train.checkpoint_every=80"
                     for f in TWO_PROCESS_RUN]
            done = subprocess.run(train_cmd(workdir, deepmimic_dir, *flags), cwd=REPO, capture_output=True,
                                  env=pool_of(cpu_devices(env, 2), 2), text=True)
            assert done.returncode == 0, done.stderr[-3000:]
    return workdir


@pytest.fixture(scope="session")
def user_env(env):
    """:func:`env` with one CPU device, what ``motionjax`` sees on a user's CPU host
    (``runs.one_device``; the notebooks run so too): for the commands run as a user runs them, whose
    proof is not a mesh. A runlocal ``motionjax train`` costs ~25% less CPU on one device than on eight
    (cold compilation cache 29 vs 41 CPU s, warm 16 vs 21; docs/history.md, "suite10")."""
    from runs import one_device
    return one_device(env)


# The costliest files first. `make test` hands whole files to two workers (xdist --dist loadfile) in
# collection order (--no-loadscope-reorder: xdist would otherwise order them by their number of tests, which
# put the few-test, minutes-long files such as the notebooks and the cluster runs last, the run's tail).
# Longest first, the two workers finish together. CPU seconds per file (each file alone with a cold
# compilation cache, 2 shared cores, 2026-12-06; docs/history.md, "The suite's programs, fewer and smaller"
# and "Notebook 05 on test_generate's run, the SLURM jobs on the SIGTERM test's programs"): multiprocess 164
# (two processes at once), train 145, generate ~145 (notebook 05 included), dynamics 117, faults 109,
# notebooks 96, SLURM ~76 (two processes), GPU check 72, jacobian 67 (43 after its cuts of 20:30), your_data
# 58, efficiency 55, evaluate 51, models 49, predict 46, time_to_target 40, offsets 39, priority 28; the
# runlocal runs of package and time_to_target reuse programs that train, faults and evaluate compile, and the
# SLURM jobs those of multiprocess's SIGTERM launch (which must come first: its first launch writes the
# entries of process 1 too, motionjax/train/compile_cache.py). Measured again 2026-12-06 20:20-21:25
# (docs/history.md, "The subprocess-launching tests and the trainer's fixed cost"): train 240, multiprocess
# 190 (first all the same, for the SLURM jobs), faults 126, GPU check 92, SLURM 89 alone (less after
# multiprocess), your_data 74, evaluate 64, package 45: the order holds (SLURM and the GPU check are within
# the noise of each other). Measured again 2026-12-07 (docs/history.md, "suite13": per file, the whole suite
# in two workers): generate 204, train 186, multiprocess 184, dynamics 175, faults 132, notebooks 125, feed
# 85, GPU check 78, jacobian 69, models 68, efficiency 61, your_data 58, backend_numerics 52, grad_reduce 52,
# kinematics 49, offsets 46, losses 45, predict 44, parallel 39, evaluate 38; SLURM ~80 s of wall (its jobs
# run under slurmd). make test leaves out the e2e tests (setup.cfg): there generate, multiprocess,
# notebooks, the GPU check and your_data shrink to seconds, and dynamics and faults lead.
COSTLIEST_FIRST = (
    "test_multiprocess.py", "test_train.py", "test_generate.py", "test_dynamics.py", "test_faults.py",
    "test_notebooks.py", "test_slurm.py", "test_feed.py", "test_gpu_check.py", "test_jacobian.py",
    "test_models.py", "test_efficiency.py", "test_your_data.py", "test_backend_numerics.py",
    "test_grad_reduce.py", "test_kinematics.py", "test_offsets.py", "test_losses.py", "test_predict.py",
    "test_parallel.py", "test_evaluate.py", "test_time_to_target.py", "test_package.py", "test_priority.py",
    "test_corpus.py", "test_bench.py", "test_eval.py", "test_data_pipeline.py", "test_apply.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
