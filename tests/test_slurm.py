"""scripts/slurm/train.sbatch under a real scheduler: a one-node SLURM (Debian's slurm-wlm: slurmctld,
slurmd and munge, started here in a temporary directory on free ports, as the user running the tests)
runs the project's sbatch file with two tasks on the tiny runlocal config. Both processes join through
jax.distributed (SLURM's environment, as on a cluster), train and write their shards of each checkpoint;
the same command submitted again resumes from the last one.

Needs the SLURM binaries (``.ci/run`` installs them: ``apt-get install slurm-wlm munge``); skipped,
saying so, where they are missing. docs/multihost.md ("Tested under SLURM") says how to run it.
"""
import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs import REPO, TWO_PROCESS_RUN, committed, dump_stacks, one_device, train_flags

pytestmark = pytest.mark.slow  # scheduler daemons and trainer processes

_BINARIES = ("sbatch", "squeue", "scontrol", "srun", "slurmctld", "slurmd", "munged")
_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"  # the daemons live in sbin


def _which(name: str) -> str | None:
    return shutil.which(name, path=_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CONF = """\
ClusterName=motionjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class Cluster:
    """A one-node SLURM in ``root``: ``env`` points its client commands at it."""

    def __init__(self, root: Path):
        self.root, self.procs = root, []
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        (root / "slurm.conf").write_text(_CONF.format(host=host, dir=root, user=getpass.getuser(),
                                                      ctld_port=_free_port(), slurmd_port=_free_port()))
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"), PATH=_PATH)
        # --force: munged refuses a key under a world-writable /tmp otherwise
        self._run([_which("munged"), "--foreground", "--force", f"--socket={root}/munge.socket",
                   f"--key-file={key}", f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                   f"--seed-file={root}/munged.seed"], "munged")
        self._wait(lambda: (root / "munge.socket").exists(), "munged")
        self._run([_which("slurmctld"), "-D", "-i", "-f", str(root / "slurm.conf")], "slurmctld")
        self._run([_which("slurmd"), "-D", "-N", host, "-f", str(root / "slurm.conf")], "slurmd")
        self._wait(lambda: "idle" in self.cli("sinfo", "-h", "-o", "%T", check=False), "an idle node")

    def _run(self, argv, name):
        log = open(self.root / f"{name}.out", "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _wait(self, ready, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            assert not dead, f"{dead} exited:\n{self.logs()}"
            time.sleep(0.5)
        raise TimeoutError(f"no {what} after {timeout} s:\n{self.logs()}")

    def cli(self, *argv, check=True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 or not check, done.stderr
        return done.stdout

    def submit_and_wait(self, argv, env, workdir: Path, timeout=240) -> tuple[str, str]:
        """``sbatch argv`` from the repository root; waits for the job to leave the queue; returns its
        state (``COMPLETED``, ``FAILED``, ...) and its output file's text. A job still running after
        ``timeout`` s (one of this test takes about a minute) is hung: its trainers (the processes
        training in ``workdir``) get SIGUSR1, on which they print every thread's stack to the job's
        output, and the job is cancelled; its state then reads ``HUNG``."""
        out = self.root / "job-%j.out"
        submitted = subprocess.run(["sbatch", "--parsable", f"--output={out}", *argv], cwd=REPO,
                                   env=dict(env, SLURM_CONF=self.env["SLURM_CONF"], PATH=_PATH),
                                   capture_output=True, text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stderr + self.logs()
        job = submitted.stdout.strip().split(";")[0]
        deadline = time.time() + timeout
        while self.cli("squeue", "-h", "-j", job, check=False).strip() and time.time() < deadline:
            time.sleep(1)
        hung = bool(self.cli("squeue", "-h", "-j", job, check=False).strip())
        if hung:
            found = subprocess.run(["pgrep", "-f", f"motionjax train --workdir {workdir}"],
                                   capture_output=True, text=True).stdout.split()
            trainers = [int(p) for p in found]
            dump_stacks(trainers)
            self.cli("scancel", job, check=False)
            time.sleep(5)
            for pid in trainers:  # a task blocked in a collective can outlive its cancelled step
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        state = f"HUNG (no end after {timeout} s; the trainers' stacks are in the output) " if hung else ""
        state += self.cli("scontrol", "show", "job", job, check=False)
        text = Path(str(out).replace("%j", job))
        return state, text.read_text() if text.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log"))
                         if p.is_file())

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [b for b in _BINARIES if _which(b) is None]
    if missing:
        pytest.skip(f"SLURM is not installed here ({', '.join(missing)} missing): on Debian/Ubuntu "
                    "`apt-get install slurm-wlm munge` (.ci/run does it)")
    # A short path: slurmd's and munge's socket paths must fit in 108 bytes.
    root = Path(tmp_path_factory.mktemp("slurm"))
    c = Cluster(root)
    yield c
    c.stop()


def test_the_sbatch_file_trains_on_two_joined_processes_and_resubmitting_resumes(cluster, tmp_path,
                                                                                  deepmimic_dir, env):
    workdir = tmp_path / "run"
    # One CPU device per process: the two processes make the mesh's 'data' axis of 2. The sbatch file's
    # GPU flags (scripts/xla_gpu_flags.sh) do nothing on CPUs, but XLA_FLAGS is part of the compilation
    # cache's key: in their place (MOTIONJAX_XLA_GPU_FLAGS) the device count, which the key leaves out,
    # makes the jobs' programs the SIGTERM test's. test_the_job_scripts_gpu_flags_are_known_to_this_xla
    # checks the GPU flags themselves.
    job_env = dict(one_device(env), PYTHON=sys.executable,
                   MOTIONJAX_XLA_GPU_FLAGS="--xla_force_host_platform_device_count=1")
    resources = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0",
                 "--time=00:15:00", "scripts/slurm/train.sbatch"]
    # Both jobs run one command, the SIGTERM test's (tests/test_multiprocess.py, runs.TWO_PROCESS_RUN: 80
    # steps, a checkpoint every 20) on the same two processes: their programs come from the session's
    # compilation cache (the second job's from the first's where this file runs alone, or in make test,
    # which leaves the SIGTERM test out).
    flags = train_flags(workdir, deepmimic_dir, *TWO_PROCESS_RUN)
    state, out = cluster.submit_and_wait([*resources, *flags], job_env, workdir)
    assert "JobState=COMPLETED" in state, state + out[-3000:] + cluster.logs()
    assert committed(workdir)[-2:] == [60, 80], out[-3000:]
    # Both processes joined one run (gloo connected the two ranks; the mesh's 2 devices are one each),
    # each wrote its own shards of the checkpoint (orbax: a directory of shards per process), and
    # process 0 alone printed.
    assert "Rank 0 is connected to 1 peer" in out and "Rank 1 is connected to 1 peer" in out, out[-3000:]
    assert "over data (2 devices)" in out, out[-3000:]
    for step in (60, 80):
        shards = sorted(p.name for p in (workdir / f"checkpoints/{step}").rglob("ocdbt.process_*"))
        assert shards == ["ocdbt.process_0", "ocdbt.process_1"], (step, shards)
    assert out.count(f"run directory: {workdir}") == 1, out[-3000:]
    first = json.loads((workdir / "summary.json").read_text())
    assert first["status"] == "done" and first["steps"] == 80

    # What a job killed by its time limit after step 60 leaves: checkpoint 60 its last, no summary. The
    # same command submitted again resumes at step 60 and trains on to 80.
    shutil.rmtree(workdir / "checkpoints/80")
    (workdir / "summary.json").unlink()
    state, out = cluster.submit_and_wait([*resources, *flags], job_env, workdir)
    assert "JobState=COMPLETED" in state, state + out[-3000:] + cluster.logs()
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["steps"] == 80 and committed(workdir)[-1] == 80
    # This session's timed steps (the trainer's rate leaves the compiling step out) are 60 fewer than
    # the first job's, which trained all 80: it trained steps 61 to 80 only.
    timed = lambda s: round(s["steps_per_s"] * s["train_s"])
    assert timed(summary) == timed(first) - 60, (summary, first)
    logged = [s for s, _ in summary["history"]["train/loss"]]
    assert logged == list(range(10, 81, 10)), logged  # the curve went on from the checkpoint, none repeated


def test_the_job_scripts_gpu_flags_are_known_to_this_xla():
    """scripts/xla_gpu_flags.sh (sourced by the sbatch file and, on GPUs, by launch_local.sh): XLA
    aborts at its first computation on a flag it does not know, on any backend, so a jaxlib that
    dropped one would stop every cluster job before its first step. Without SLURM: one process."""
    code = "import jax.numpy as jnp; print(float(jnp.ones(2).sum()))"
    done = subprocess.run(["bash", "-c", f'source scripts/xla_gpu_flags.sh && echo "$XLA_FLAGS" && '
                           f'"{sys.executable}" -c "{code}"'], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""), timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-1] == "2.0", done.stdout + done.stderr[-2000:]
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in done.stdout.split(), done.stdout
