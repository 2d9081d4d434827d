"""Helpers of the tests that train: the tiny ``runlocal`` config and ``motionjax train`` subprocesses."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def runlocal_config(data_dir, mesh_shape=(("data", -1), ("time", 1))):
    """The default experiment's tiny ``runlocal`` variant on the prepared clips in ``data_dir``."""
    from experiments import deepmimic_denoise

    config = deepmimic_denoise.get_config("runlocal")
    config.data.dir = str(data_dir)
    config.mesh.shape = mesh_shape
    return config


# The two-process runs of the runlocal trainer (one CPU device per process, the processes joined by
# jax.distributed: test_multiprocess.py's SIGTERM launch, test_slurm.py's jobs) take one schedule, so
# the programs the first of them compiles are read from the session's compilation cache by the others
# (the schedule's length is a constant of the train step; the other settings are the host's). 80 steps:
# a run outlasts a signal sent after its first checkpoint, even on a loaded host. test_train.py's kill -9
# resume trains it too, in one process on 2 devices: conftest.py's ``uninterrupted_run`` is the run both
# resumes must end at, bit for bit (two processes of one device each equal one process of two: the
# all-reduce of two numbers is one addition, in either order).
TWO_PROCESS_RUN = ("--config.train.steps=80", "--config.train.eval_every=80",
                   "--config.train.checkpoint_every=20", "--config.train.log_every=10",
                   "--config.evals.final.splits=('validation',)")


def checkpoint_params(workdir, step: int) -> dict:
    """The parameters of ``workdir``'s checkpoint ``step`` as numpy arrays keyed by path, restored onto one
    device of this process whatever process and device layout saved them (orbax asks for a target
    then: the saved shapes and dtypes, on this process's first device)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    path = (Path(workdir) / "checkpoints" / str(step) / "state").absolute()
    assert path.parent.is_dir(), (step, committed(workdir))
    checkpointer = ocp.StandardCheckpointer()
    saved = checkpointer.metadata(path)
    saved = getattr(saved, "item_metadata", saved)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), saved)
    params = checkpointer.restore(path, target)["params"]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def train_flags(workdir, data_dir, *overrides) -> list[str]:
    """The flags of ``motionjax train`` on the runlocal config with ``--config.KEY=VALUE`` ``overrides``."""
    return ["--workdir", str(workdir), "--config", "experiments/deepmimic_denoise.py:runlocal",
            f"--config.data.dir={data_dir}", *overrides]


def train_cmd(workdir, data_dir, *overrides) -> list[str]:
    """``motionjax train`` (:func:`train_flags`) in a fresh interpreter."""
    return [sys.executable, "-m", "motionjax", "train", *train_flags(workdir, data_dir, *overrides)]


def committed(workdir) -> list[int]:
    """Steps of the checkpoints of ``workdir`` whose write completed."""
    return sorted(int(p.name) for p in (Path(workdir) / "checkpoints").glob("[0-9]*")
                  if p.name.isdigit() and (p / "commit_success.txt").exists())


def wait_for_checkpoint(proc, workdir, after: int, timeout=300) -> int:
    """Poll until a committed checkpoint newer than ``after`` exists; returns its step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        steps = committed(workdir)
        if steps and max(steps) > after:
            return max(steps)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"no checkpoint after step {after} in {workdir}")


def dump_stacks(pids, wait_s: float = 5.0) -> None:
    """SIGUSR1 to trainer processes ``pids`` (a trainer prints every thread's stack on it, to its
    stderr), then ``wait_s`` for the stacks to be written: a hung run says where it waits."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(wait_s)


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid``, in start order."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(p) for p in found)


def communicate_or_dump(proc: subprocess.Popen, timeout: float, logs=lambda: "") -> str:
    """``proc``'s output (a launcher of trainer processes, in its own session). When it has not ended
    after ``timeout`` s it is hung: its trainers print their stacks (:func:`dump_stacks`), the session
    is killed, and the test fails with the stacks and ``logs()``."""
    try:
        return proc.communicate(timeout=timeout)[0].decode()
    except subprocess.TimeoutExpired:
        dump_stacks(children(proc.pid))
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0].decode()
        raise AssertionError(f"no exit after {timeout} s; output and stacks:\n{out[-12000:]}\n"
                             f"{logs()}") from None


NOTEBOOK_DIR = REPO / "notebooks"


def one_device(env: dict) -> dict:
    """``env`` with one CPU device, what a user's CPU host gives jax: the suite's forced device count
    (conftest.py's ``--xla_force_host_platform_device_count``) removed, its other XLA flags kept."""
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count"))
    return dict(env, XLA_FLAGS=flags)


def cpu_devices(env: dict, n: int) -> dict:
    """``env`` with ``n`` CPU devices (:func:`one_device`'s flags, and the forced count ``n``)."""
    flags = one_device(env)["XLA_FLAGS"]
    return dict(env, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip())


def pool_of(env: dict, devices: int) -> dict:
    """``env`` with XLA:CPU's compute pool of a process of ``devices`` devices on this host (``NPROC``):
    XLA sizes it max(cores, devices in the process), and a matmul's last bits depend on how its work is
    split over it, so the runs that must equal each other bit for bit across process layouts (two
    processes of one device, one of two) get one pool, on any host."""
    return dict(env, NPROC=str(max(len(os.sched_getaffinity(0)), devices)))


def run_notebook(path: Path, env: dict, min_images: int = 4, timeout_s: int = 400):
    """Runs notebook ``path`` top to bottom in a fresh ``python3`` kernel (jupyter_client starts it with
    this interpreter) from notebooks/, as Jupyter would, with the suite's environment ``env``
    (conftest.py: the session's compilation cache, every program kept) on one CPU device, as a user's
    (the suite's forced 8-device flag removed). A program read from the cache is the program the kernel
    would have compiled (the cache key is the program, its compile options and the jax/XLA versions):
    the cache changes how long a notebook takes, not what it computes or checks. Fails on an error
    output or fewer than ``min_images`` pictures; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute(env=one_device(env))
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors
    images = sum("image/png" in o.get("data", {}) or "text/html" in o.get("data", {})
                 for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert images >= min_images, f"{path.name}: expected pictures, got {images} image outputs"
    return nb
