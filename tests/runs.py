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
