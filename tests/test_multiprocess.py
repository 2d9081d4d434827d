"""Multi-controller training: 2 local CPU processes vs 1 process.

The SIGTERM test runs the trainer itself, ``scripts/launch_local.sh 2`` (two processes of one CPU device
each, joined by ``jax.distributed``): stopped by a signal to one process and resumed, the run ends bit for
bit at the uninterrupted one-process run on 2 devices (conftest.py's ``uninterrupted_run``).

The int8 test starts this file twice as a worker (``python tests/test_multiprocess.py WORKDIR``) joined by
``jax.distributed`` (gloo collectives), 2 devices a process: data 4, int8 with error feedback over two
levels (inside each process, then across the two), the corpus streamed, each process reading only its own
share. It takes its batches from the training feed (:mod:`motionjax.data.feed`), trains a few steps of the
real train step, blocks on every step, and checkpoints from both processes. The test then checks, in its
own process: both processes hold identical parameters; the losses and parameters equal a single-process
run of its own feed (a batch is a function of the seed and the step: the same windows, noise and
augmentation); and the 2-process checkpoint restores onto the 1-process mesh.
"""
from __future__ import annotations

import faulthandler
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from motionjax import parallel, train
from motionjax.configs import base
from motionjax.data import feed, pipeline

# make test-all only (~185 CPU s, two launches of two processes). In make test, tests/test_slurm.py's jobs
# join two processes through jax.distributed, train, checkpoint and resume; test_grad_reduce.py proves the
# int8 two-level reduction in one process.
pytestmark = pytest.mark.e2e

STEPS = 5
WORKER_TIMEOUT_S = 420  # a hung collective dumps every thread's stack and exits instead of hanging CI


def _config():
    """Data 4 over 2 processes x 2 devices, int8 two-level (inside a process, then across), the corpus
    streamed, 5 steps."""
    config = base.get_config()
    config.mesh.shape = (("data", -1), ("time", 1))
    config.data.update(source="synthetic", synthetic_clips=16, synthetic_frames=64, batch_size=8, window=32,
                       chunk=8, prefetch=0, residency="stream", speed_range=1.25)
    config.train.update(grad_reduce="int8", grad_reduce_levels=2, grad_reduce_host_size=2,
                        grad_bucket_mb=0.01)
    # A float32 temporal conv net: this test is about processes, and it compiles ~40% faster than a
    # bfloat16 transformer; test_parallel.py checks the transformer on data x time meshes.
    config.model.update(name="tconv", dim=32, depth=1, kernel=3, latent_dim=8, stride=2, dtype="float32")
    config.train.update(steps=STEPS, warmup_steps=2)
    # This test is about processes, not losses: without the dynamics term each compile takes ~40% less
    # (test_parallel.py compiles the full step on a data x time mesh).
    config.loss.dynamics_weight = 0.0
    return config


def _setup(config, mesh):
    """The train step and initial state of :mod:`motionjax.train` on ``mesh``."""
    info = pipeline.dataset_info(config.data)
    step, state, _, _ = train.build_train_step(config, info, mesh)
    return info, state, step, parallel.window_sharding(mesh)


def _local_params(state) -> dict:
    """This process's copy of the (replicated) parameters, as numpy arrays keyed by path."""
    leaves = jax.tree_util.tree_leaves_with_path(state["params"])
    return {jax.tree_util.keystr(path): np.asarray(x.addressable_data(0)) for path, x in leaves}


def worker(workdir: Path) -> None:
    """Trains :func:`_config` into ``workdir`` (one ``jax.distributed`` session)."""
    faulthandler.dump_traceback_later(WORKER_TIMEOUT_S, exit=True)
    parallel.initialize()  # from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID
    assert jax.process_count() == 2 and jax.local_device_count() == 2, jax.devices()
    config = _config()
    mesh = parallel.make_mesh(config.mesh)
    # The hybrid mesh: process i's devices are consecutive along 'data' (devices 2i, 2i + 1 of data 4),
    # so the inside-host level stays inside a process.
    rows = mesh.devices.reshape(jax.process_count(), -1)
    assert [{d.process_index for d in row} for row in rows] == [{0}, {1}], mesh.devices
    info, state, step, window = _setup(config, mesh)
    iterator = feed.Feed(config.data, info, mesh, ("noisy", "clean"), seed=config.seed,
                         mode=config.data.residency)
    losses = []
    for _ in range(config.train.steps):
        state, metrics = step(state, next(iterator))
        losses.append(float(metrics["loss"]))  # blocks: queued collective steps can hang gloo
    mngr = train.make_checkpoint_manager(workdir, config.train)
    mngr.save(config.train.steps, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)
    mngr.wait_until_finished()
    mngr.close()
    np.savez(workdir / f"params_{jax.process_index()}.npz", **_local_params(state))
    if parallel.is_main_process():
        (workdir / "losses.json").write_text(json.dumps(losses))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path, n: int):
    """``n`` worker processes x 2 CPU devices training into ``tmp_path``: (exit codes, the tails of their
    logs)."""
    port = _free_port()
    # 2 devices per process; conftest's other XLA flags kept.
    flags = ["--xla_force_host_platform_device_count=2",
             *(f for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f)]
    # XLA:CPU's compute pool is max(cores, devices in the process) threads, and a matmul's last bits
    # depend on how its work is split over them: the workers get the pool of this 8-device process.
    threads = max(len(os.sched_getaffinity(0)), len(jax.devices()))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags), NPROC=str(threads),
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n),
               PYTHONPATH=str(Path(__file__).parents[1]))
    logs = [tmp_path / f"worker_{i}.log" for i in range(n)]
    command = [sys.executable, __file__, str(tmp_path)]
    procs = [subprocess.Popen(command, env=dict(env, JAX_PROCESS_ID=str(i)), stdout=log.open("w"),
                              stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    try:
        codes = [p.wait(timeout=WORKER_TIMEOUT_S + 30) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return codes, "\n".join(f"--- worker {i} ---\n" + log.read_text()[-3000:] for i, log in enumerate(logs))


def _assert_one_process_matches(tmp_path, config, devices: int, steps: int, params: dict, mesh_shape=None,
                                exact: bool = False):
    """One process on ``devices`` devices, the same mesh, fed by its own feed (the same batches: a
    batch is a function of the seed and the step): its losses equal the workers' ``losses.json``
    (1e-5: the logged loss is a psum, added in the transport's order) and its parameters ``params``
    (1e-5; ``exact``: bit for bit). Returns its state."""
    mesh = parallel.make_mesh(config.mesh, devices=jax.devices()[:devices])
    if mesh_shape is not None:
        assert dict(mesh.shape) == mesh_shape
    info, state, step, window = _setup(config, mesh)
    iterator = feed.Feed(config.data, info, mesh, ("noisy", "clean"), seed=config.seed,
                         mode=config.data.residency)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, next(iterator))
        losses.append(float(metrics["loss"]))
    iterator.close()
    np.testing.assert_allclose(json.loads((tmp_path / "losses.json").read_text()), losses, rtol=0, atol=1e-5)
    reference = _local_params(state)
    for k in params:
        np.testing.assert_allclose(params[k], reference[k], rtol=0, atol=0 if exact else 1e-5, err_msg=k)
    return state


def _same_in_both_processes(workdir) -> dict:
    """The two processes' parameters, equal bit for bit: process 0's."""
    p0, p1 = (dict(np.load(workdir / f"params_{i}.npz")) for i in range(2))
    assert p0.keys() == p1.keys()
    for k in p0:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
    return p0


@pytest.mark.slow  # two worker subprocesses
@pytest.mark.timeout(WORKER_TIMEOUT_S + 300)  # the workers, then the 1-process reference
def test_two_processes_int8_two_level_match_one(tmp_path):
    """2 processes x 2 CPU devices, int8 with error feedback, two levels (an fp32 reduce-scatter inside
    each process, int8 across the 2 over gloo, an all-gather inside): both processes end with the same
    parameters and residual-fed losses, equal bit for bit to one process on 4 devices with the same
    settings (every sum of the gradient is taken by its owner in device order: only the transport
    differs), which reads its own data stream: the Grain pipeline gives the processes the blocks of
    its global batches, and the device draws every example's augmentation by its global index. The
    2-process checkpoint restores onto the 1-process mesh."""
    codes, tails = _launch(tmp_path, 2)
    assert codes == [0, 0], tails
    p0 = _same_in_both_processes(tmp_path)
    config = _config()
    state = _assert_one_process_matches(tmp_path, config, 4, STEPS, p0, mesh_shape={"data": 4, "time": 1},
                                        exact=True)

    # The 2-process checkpoint restores onto this 1-process mesh.
    mngr = train.make_checkpoint_manager(tmp_path, config.train)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored = mngr.restore(STEPS, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    mngr.close()
    for k, v in _local_params(restored).items():
        np.testing.assert_array_equal(v, p0[k], err_msg=k)


@pytest.mark.slow  # scripts/launch_local.sh: two trainer processes, twice
@pytest.mark.timeout(WORKER_TIMEOUT_S + 300)
def test_sigterm_to_one_of_two_processes_stops_both_and_the_command_resumes_to_the_one_process_run(
        tmp_path, deepmimic_dir, env, uninterrupted_run):
    """``scripts/launch_local.sh 2`` on the runlocal trainer (80 steps, one CPU device a process): SIGTERM
    to process 1 alone (not the one that prints) makes both processes stop at one step, save that
    checkpoint together and exit 0; the same command resumes it to the end, where its logged losses and
    parameters equal, bit for bit, those of one process on 2 devices that trained the same run
    uninterrupted (conftest.py's ``uninterrupted_run``): two processes train what one does, and their
    resume loses nothing. (Two processes prove what four did: the signal reaches the others only through
    the processes' shared stop decision.)"""
    import runs
    from runs import REPO, children, committed, communicate_or_dump, train_flags, wait_for_checkpoint

    workdir = tmp_path / "run"
    flags = train_flags(workdir, deepmimic_dir, *runs.TWO_PROCESS_RUN)  # 80 steps, a checkpoint every 20
    command = ["bash", str(REPO / "scripts" / "launch_local.sh"), "2", *flags]
    # One CPU device per process (launch_local.sh gives 2 by default): the stop is the processes' decision.
    # The compute pool of the one-process run on 2 devices (runs.pool_of), for its bits.
    launch_env = dict(runs.pool_of(runs.one_device(env), 2), PYTHON=sys.executable,
                      LOG_DIR=str(tmp_path / "logs"), PORT=str(_free_port()), CPU_DEVICES_PER_PROCESS="1")

    def logs():
        return "\n".join(f"--- {p.name} ---\n" + p.read_text()[-2000:]
                         for p in (tmp_path / "logs").glob("*.log"))

    proc = subprocess.Popen(command, env=launch_env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_checkpoint(proc, workdir, after=0, timeout=WORKER_TIMEOUT_S)
        trainers = children(proc.pid)
        assert len(trainers) == 2, trainers
        os.kill(trainers[1], 15)  # SIGTERM to process 1 alone (the launcher started them in order)
        out = communicate_or_dump(proc, 180, logs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, out[-3000:] + logs()
    stopped = max(committed(workdir))
    assert 20 <= stopped < 80 and stopped % 10 == 0, (stopped, out[-2000:])
    assert f"stopped by a signal to process 1 at step {stopped}" in out, out[-3000:]
    # (Only process 0 prints; the launcher's exit 0 says that both exited 0, and the committed
    # checkpoint that both wrote their shards of it at that one step.)

    proc = subprocess.Popen(command, env=launch_env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    out = communicate_or_dump(proc, 300, logs)  # a hang fails with the trainers' stacks
    assert proc.returncode == 0, out[-3000:] + logs()
    assert "over data (2 devices)" in out, out[-3000:]  # one mesh of the two processes' devices
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["steps"] == 80
    # The loss curve went on from the checkpoint: every logged step once, none repeated.
    logged = [s for s, _ in summary["history"]["train/loss"]]
    assert logged == sorted(set(logged)) and logged[-1] == 80 and stopped + 10 in logged
    # ... and it is the one-process run's, as are the final parameters.
    reference = json.loads((uninterrupted_run / "summary.json").read_text())
    assert summary["history"]["train/loss"] == reference["history"]["train/loss"]
    two, one = runs.checkpoint_params(workdir, 80), runs.checkpoint_params(uninterrupted_run, 80)
    assert two.keys() == one.keys()
    for k in two:
        np.testing.assert_array_equal(two[k], one[k], err_msg=k)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
