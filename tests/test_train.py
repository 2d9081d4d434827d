"""The trainer: sharded == unsharded steps, the non-finite guard, exact resume after kill -9,
SIGTERM checkpoints, config overrides (tiny ``runlocal`` config, 8 CPU devices)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from motionjax import parallel, train
from motionjax.data import pipeline

REPO = Path(__file__).resolve().parents[1]


def _config(data_dir, mesh_shape=(("data", -1), ("time", 1))):
    from experiments import deepmimic_denoise

    config = deepmimic_denoise.get_config("runlocal")
    config.data.dir = str(data_dir)
    config.mesh.shape = mesh_shape
    return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("data")
    pipeline.dataset_info(_config(path).data)  # prepare the DeepMimic clips once
    return path


@pytest.fixture(scope="module")
def batches(data_dir):
    """Three training batches (numpy), the same for every mesh."""
    config = _config(data_dir)
    iterator = pipeline.make_train_iterator(config.data, pipeline.dataset_info(config.data), seed=0)
    out = [{k: np.asarray(next(iterator)[k]) for k in ("noisy", "clean")} for _ in range(3)]
    iterator.close()
    return out


def _steps(devices, mesh_shape, data_dir):
    """A jitted train step on a mesh of ``devices`` and a function giving fresh initial states."""
    config = _config(data_dir, mesh_shape)
    config.loss.dynamics_weight = 1.0  # off in the default experiment; its sharded path is checked here
    mesh = parallel.make_mesh(config.mesh, devices)
    step, state, *_ = train.build_train_step(config, pipeline.dataset_info(config.data), mesh)
    return step, lambda: jax.tree.map(jnp.copy, state)  # the step donates (consumes) its state


@pytest.fixture(scope="module")
def single_device_step(data_dir):
    return _steps(jax.devices()[:1], (("data", 1), ("time", 1)), data_dir)


def _run(step, state, batches):
    """The metrics of every step."""
    history = []
    for batch in batches:
        state, metrics = step(state, batch)  # numpy in: jit splits it by the step's in_shardings
        history.append(jax.tree.map(float, metrics))
    return history


def test_data_time_mesh_matches_one_device(data_dir, batches, single_device_step):
    """Three steps on a 2 x 4 (data x time) mesh, halos crossing devices in the model, the FK/foot
    loss and the dynamics loss, equal the same steps on one device: every loss term and the
    gradient norm. (Parameters are not compared: Adam's first updates are ~lr·sign(g), so
    reduction-order noise on near-zero gradients flips whole steps; the later losses check them.)"""
    assert jax.device_count() == 8
    step, init = _steps(jax.devices(), (("data", 2), ("time", 4)), data_dir)  # an 8-frame chunk per shard
    sharded = _run(step, init(), batches)
    step, init = single_device_step
    single = _run(step, init(), batches)
    for a, b in zip(sharded, single, strict=True):
        assert a.keys() == b.keys() and {"loss", "position", "foot", "dynamics"} <= a.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-4, err_msg=k)
    assert sharded[-1]["loss"] != sharded[0]["loss"]  # the parameters did move


def test_nonfinite_step_is_skipped_and_counted(single_device_step, batches):
    step, init = single_device_step
    state = init()
    before = {part: jax.tree.map(np.asarray, state[part]) for part in ("params", "opt_state")}
    noisy = batches[0]["noisy"].copy()
    noisy[0, 1, 2, 3] = np.nan  # one bad input value
    bad = dict(batches[0], noisy=noisy)
    state, metrics = step(state, bad)
    assert not np.isfinite(float(metrics["loss"]))
    assert int(metrics["nonfinite_total"]) == 1 and int(metrics["nonfinite_run"]) == 1
    for part in ("params", "opt_state"):
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state[part]), before[part])
    for batch in batches[:2]:  # the first update has warmup lr 0: take two
        state, metrics = step(state, batch)
        assert np.isfinite(float(metrics["loss"]))
        assert int(metrics["nonfinite_total"]) == 1 and int(metrics["nonfinite_run"]) == 0
    moved = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), b), state["params"], before["params"])
    assert any(jax.tree.leaves(moved))


# ---------------------------------------------------------------------------------------------
# Whole runs of scripts/train.py in subprocesses


def _train_cmd(workdir, data_dir, *overrides):
    return [sys.executable, str(REPO / "scripts/train.py"), "--workdir", str(workdir),
            "--config", "experiments/deepmimic_denoise.py:runlocal", f"--config.data.dir={data_dir}",
            *overrides]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Subprocess environment: 8 CPU devices like the tests, one persistent compilation cache so
    only the first run compiles."""
    cache = tmp_path_factory.mktemp("jax_cache")
    return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


# Long enough to interrupt mid-run; no dynamics loss (tested above) keeps compilation short.
RUN = ("--config.train.steps=40", "--config.train.checkpoint_every=4", "--config.train.eval_every=1000",
       "--config.loss.dynamics_weight=0")


def _final_params(workdir, step):
    mngr = ocp.CheckpointManager((Path(workdir) / "checkpoints").absolute())
    assert step in mngr.all_steps(), (step, mngr.all_steps())
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return jax.tree.map(np.asarray, restored["state"]["params"])


def _wait_for_checkpoint(proc, workdir, after: int, timeout=300):
    """Poll until a committed checkpoint newer than ``after`` exists; returns its step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        steps = [int(p.name) for p in (Path(workdir) / "checkpoints").glob("[0-9]*")
                 if p.name.isdigit() and (p / "commit_success.txt").exists()]
        if steps and max(steps) > after:
            return max(steps)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"no checkpoint after step {after} in {workdir}")


def test_sigterm_then_kill9_then_resume_equals_uninterrupted(tmp_path, data_dir, env):
    """SIGTERM saves a checkpoint and exits 0; a kill -9 loses only the steps since the last
    checkpoint; the resumed run ends with exactly the parameters of an uninterrupted run."""
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    subprocess.run(_train_cmd(reference, data_dir, *RUN), env=env, check=True, capture_output=True, cwd=REPO)
    assert json.loads((reference / "config.json").read_text())["train"]["steps"] == 40  # override applied

    proc = subprocess.Popen(_train_cmd(interrupted, data_dir, *RUN), env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_checkpoint(proc, interrupted, after=0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["status"] == "stopped by SIGTERM" and 0 < summary["steps"] < 40
    stopped = summary["steps"]
    assert stopped in ocp.CheckpointManager((interrupted / "checkpoints").absolute()).all_steps()

    proc = subprocess.Popen(_train_cmd(interrupted, data_dir, *RUN), env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_checkpoint(proc, interrupted, after=stopped)
    proc.kill()  # SIGKILL: no handler, no final save
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    subprocess.run(_train_cmd(interrupted, data_dir, *RUN), env=env, check=True, capture_output=True,
                   cwd=REPO)
    assert json.loads((interrupted / "summary.json").read_text())["status"] == "done"
    jax.tree.map(np.testing.assert_array_equal, _final_params(interrupted, 40), _final_params(reference, 40))


def test_unknown_config_key_is_a_clear_error(tmp_path, data_dir, env):
    result = subprocess.run(_train_cmd(tmp_path, data_dir, "--config.train.stepz=3"), env=env, cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "unknown config key" in result.stderr and "stepz" in result.stderr
