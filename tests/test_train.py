"""The trainer: sharded == unsharded steps, the non-finite guard, exact resume after kill -9,
SIGTERM checkpoints, config overrides (tiny ``runlocal`` config, 8 CPU devices; the resume's trainer
processes 2, as the uninterrupted run they must end at, conftest.py's ``uninterrupted_run``)."""
import contextlib
import io
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import runs
from benchmarks.input import FixedDraw
from motionjax import parallel, train
from motionjax.data import feed, pipeline
from motionjax.train import logs, loop
from runs import REPO, runlocal_config, train_cmd, wait_for_checkpoint


@pytest.fixture(scope="module")
def data_dir(deepmimic_dir):
    return deepmimic_dir


@pytest.fixture(scope="module")
def batches(data_dir):
    """Three training batches (numpy), the same for every mesh."""
    config = runlocal_config(data_dir)
    iterator = feed.Feed(config.data, pipeline.dataset_info(config.data), keys=("noisy", "clean"), seed=0)
    out = [jax.tree.map(np.asarray, next(iterator)) for _ in range(3)]
    iterator.close()
    return out


def _steps(devices, mesh_shape, data_dir, dynamics_weight=1.0):
    """A jitted train step on a mesh of ``devices`` and a function giving fresh initial states; with the
    dynamics term (``dynamics_weight``; off in the default experiment, its sharded path checked here)."""
    config = runlocal_config(data_dir, mesh_shape)
    config.loss.dynamics_weight = dynamics_weight
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


def _fed_setup(data_dir, feeds: int, steps: int, **data):
    """The runlocal step on one device without the dynamics term (what is fed does not depend on the
    loss, and a fed program with it compiles ~2x longer), ``feeds`` feeds of its config (``data``
    overrides ``config.data``), the first feed's first ``steps`` batches and the plain step's losses on
    them from a fresh state: ``(step, fresh, feeds, batches, losses)``."""
    step, fresh = _steps(jax.devices()[:1], (("data", 1), ("time", 1)), data_dir, dynamics_weight=0.0)
    config = runlocal_config(data_dir)
    config.data.update(**data)
    info = pipeline.dataset_info(config.data)
    its = [feed.Feed(config.data, info, keys=train.batch_keys(config), seed=0) for _ in range(feeds)]
    batches = [next(its[0]) for _ in range(steps)]
    state, plain = fresh(), []
    for batch in batches:
        state, metrics = step(state, batch)
        plain.append(float(metrics["loss"]))
    return step, fresh, its, batches, plain


def test_the_fed_step_trains_on_the_feeds_own_batches(data_dir):
    """The feed's input program traced into the train step (one program a step, the step counter on
    the device) trains on the batches the feed gives alone, step for step (float32 rounding aside);
    set back to an earlier step, as a restore does, it draws that step's batch again. The resident
    feed's program is the pipelined one (each step draws the next step's batch beside its own; the
    first from the feed's own program), the fixed-batch feed's the one that draws its own. On the
    runlocal loss (no dynamics term, as the trainer's default experiment)."""
    step, fresh, (alone, inside), batches, plain = _fed_setup(data_dir, 2, 3)
    fed, state, got = step.fed(inside), fresh(), []
    assert inside.mode == "device" and fed.lookahead
    for _ in range(3):
        state, metrics, _ = fed(state)
        got.append(float(metrics["loss"]))
    assert inside.served == 3 and len(set(plain)) == 3
    np.testing.assert_allclose(got, plain, rtol=1e-5)
    inside.set_state(alone.get_state() | {"served": 1})
    _, metrics, _ = fed(fresh())
    _, want = step(fresh(), batches[1])
    np.testing.assert_allclose(float(metrics["loss"]), float(want["loss"]), rtol=1e-5)
    # The input benchmark's fed step on a fixed batch (its "other": the fed host path without the
    # input's compute) trains on that batch, whatever the feed would draw, and moves the feed as fed does.
    fixed = step.fed(FixedDraw(inside, batches[0]))
    assert not fixed.lookahead
    _, metrics, _ = fixed(fresh())
    np.testing.assert_allclose(float(metrics["loss"]), plain[0], rtol=1e-5)
    assert inside.served == 3
    alone.close()
    inside.close()


def test_the_streamed_fed_step_draws_ahead_and_saves_its_own_steps_position(data_dir):
    """On the streamed tier the pipelined fed step takes Grain's spans one step ahead, in blocks of 3
    steps (``data.stream_block``), yet trains on the batches the feed gives alone, step for step, and
    its saved data state is its step's: a feed restored from it (as a resumed run's) gives the next two
    steps' batches, the second from the next block, not the ones after. A position saved after the
    block taken (Grain's own) would skip a block, and the losses would differ."""
    step, fresh, (alone, inside, resumed), batches, plain = _fed_setup(data_dir, 3, 4, residency="stream",
                                                                      worker_count=0, stream_block=3)
    fed, state, got = step.fed(inside), fresh(), []
    assert inside.mode == "stream" and fed.lookahead
    for k in range(4):
        state, metrics, _ = fed(state)
        got.append(float(metrics["loss"]))
        if k == 1:
            saved = inside.get_state()
    assert saved["served"] == 2 and len(set(plain)) == 4
    np.testing.assert_allclose(got, plain, rtol=1e-5)
    resumed.set_state(saved)
    fed, state, want = step.fed(resumed), fresh(), fresh()
    for batch in batches[2:]:
        state, metrics, _ = fed(state)
        want, expected = step(want, batch)
        np.testing.assert_allclose(float(metrics["loss"]), float(expected["loss"]), rtol=1e-5)
    for it in (alone, inside, resumed):
        it.close()


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


def test_ema_follows_the_parameters_and_is_what_evaluation_sees(data_dir, batches):
    """``train.ema_decay``: after each step the average is ``d·ema + (1 - d)·params`` (numpy reference
    from the steps' own parameters; a non-finite step leaves it alone), and evaluation and export
    read it (``evaluated_params``)."""
    config = runlocal_config(data_dir)
    config.train.ema_decay = 0.9
    mesh = parallel.make_mesh(config.mesh, jax.devices()[:1])
    step, state, *_ = train.build_train_step(config, pipeline.dataset_info(config.data), mesh)
    want = jax.tree.map(np.asarray, state["params"])
    noisy = batches[0]["noisy"].copy()
    noisy[0, 0, 0, 0] = np.nan
    for batch in [*batches, dict(batches[0], noisy=noisy)]:
        state, metrics = step(state, batch)
        if np.isfinite(float(metrics["loss"])):
            want = jax.tree.map(lambda e, p: 0.9 * e + 0.1 * np.asarray(p), want, state["params"])
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-7)
    jax.tree.map(close, state["ema"], want)
    assert train.evaluated_params(state) is state["ema"]
    moved = jax.tree.map(lambda e, p: not np.allclose(e, p), *jax.device_get((state["ema"], state["params"])))
    assert any(jax.tree.leaves(moved))


def _checkpoint(workdir, step):
    """Params and optimizer state of checkpoint ``step`` of ``workdir``, as numpy."""
    with ocp.CheckpointManager((Path(workdir) / "checkpoints").absolute()) as mngr:
        assert step in mngr.all_steps(), (step, mngr.all_steps())
        state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    return jax.tree.map(np.asarray, {k: state[k] for k in ("params", "opt_state")})


@pytest.fixture(scope="module")
def guarded_auto_batch_run(tmp_path_factory, data_dir):
    """One in-process run of the runlocal schedule (6 steps) that two tests read: ``data.auto_batch =
    "memory"`` from a configured batch of 16 under a per-device memory limit that fits exactly one
    window per device (so the trainer must resolve it to 8), and NaN inputs at steps 3 and 4 with
    ``train.max_nonfinite_steps = 2`` and a checkpoint every 2 steps. (Two runs before, one per test:
    the batch the trainer resolves does not touch the non-finite guard, nor the guard the batch.)
    Returns ``(workdir, summary, what it printed, config, (the probe, the limit))``. Its two tests are e2e
    (~60 CPU s, the trainer end to end in this process): make test keeps the step's own non-finite skip
    (``test_nonfinite_step_is_skipped_and_counted``), the guard's restore of an older checkpoint on a bad
    digest (test_faults.py) and the batch finder under a forced memory limit (test_efficiency.py)."""
    from motionjax.train import batch_finder

    workdir = tmp_path_factory.mktemp("guarded") / "run"
    config = runlocal_config(data_dir)
    config.train.update(checkpoint_every=2, eval_every=6, keep_checkpoints=10, max_nonfinite_steps=2)
    config.evals.final.splits = ("validation",)
    info = pipeline.dataset_info(config.data)
    probe = batch_finder.StepProbe.for_trainer(config, info)
    limit = probe.memory(1).peak  # per-device batch 1 fits exactly, 2 does not
    make_iterator = train.make_iterator

    def poisoned(config, info, mesh, **kwargs):
        iterator = make_iterator(config, info, mesh, **kwargs)
        try:
            for i, batch in enumerate(iterator, start=1):
                yield dict(batch, noisy=batch["noisy"] * np.nan) if i in (3, 4) else batch
        finally:
            iterator.close()

    config.data.update(auto_batch="memory", batch_size=16)  # 16 were trained if auto_batch were ignored
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(loop, "make_iterator", poisoned)
        patch.setattr(batch_finder, "device_memory_limit", lambda: limit)
        summary = train.train_and_evaluate(config, workdir)
    return workdir, summary, printed.getvalue(), config, (probe, limit)


@pytest.mark.e2e
def test_nonfinite_steps_in_a_row_restore_the_last_checkpoint(guarded_auto_batch_run):
    """``train.max_nonfinite_steps = 2`` non-finite steps in a row (NaN inputs at steps 3 and 4) bring
    back the model and optimizer of the last checkpoint (step 2); training goes on with the next
    batches, and the count of skipped steps survives the restore. (The runlocal schedule, 6 steps: its
    steps are compiled once for this file and the trainer subprocesses of the suite.)"""
    workdir, summary, printed, _, _ = guarded_auto_batch_run
    assert summary["status"] == "done" and summary["steps"] == 6
    assert summary["nonfinite_steps"] == 2 and summary["nonfinite_restores"] == 1
    assert "step 4: 2 non-finite steps in a row; restored the model and optimizer of step 2" in printed
    assert summary["history"]["train/nonfinite_total"] == [(s, float(s >= 3) + float(s >= 4))
                                                             for s in range(1, 7)]
    restored, before, after = (_checkpoint(workdir, s) for s in (4, 2, 6))
    jax.tree.map(np.testing.assert_array_equal, restored, before)  # step 4 saved the restored state
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), after["params"], restored["params"])
    assert any(jax.tree.leaves(moved))  # and training went on from it


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_a_bar_on_a_terminal_and_a_line_every_n_steps_in_a_log():
    """In a log file (no terminal): one line at every ``every``-th step and the last, with the loss,
    the rate, the host wait and the ETA the rate gives, and no carriage returns; on a terminal a bar."""
    chrono = logs.Chrono(frames_per_step=10)
    chrono.steps, chrono.host_wait_s = 20, 0.0
    chrono._t0 -= 10.0  # 20 steps in (about) 10 s: 2 steps/s
    log = _Stream(tty=False)
    progress = logs.Progress(total=250, initial=0, desc="run", every=100, chrono=chrono, stream=log)
    for step in range(1, 251):
        progress.update(1)
        progress.show(step, loss=0.5 / step)
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3, lines
    assert [line.split()[:3] for line in lines] == [["run:", "step", f"{s}/250"] for s in (100, 200, 250)]
    assert "loss 0.0050 " in lines[0] and " 2.00 steps/s " in lines[0] and " host wait 0% " in lines[0]
    assert lines[0].endswith("ETA 1m15s") and lines[2].endswith("ETA 0s")  # 150 steps left at 2 steps/s

    terminal = _Stream(tty=True)
    progress = logs.Progress(total=250, initial=0, desc="run", every=100, chrono=chrono, stream=terminal)
    for step in range(1, 101):
        progress.update(1)
        progress.show(step, loss=0.5)
    progress.close()
    shown = terminal.getvalue()
    assert "\r" in shown and "100/250" in shown and "step 100" not in shown


def test_the_summary_says_where_the_hosts_cpu_went_and_the_speed_line_prints_it():
    """A run's wall time is its config's only on a quiet host: the summary carries the host's CPU
    outside the run (other processes, steal) from the run's start, and the speed line prints it."""
    chrono = logs.Chrono(frames_per_step=10)
    chrono.steps = 4
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process's own CPU is not "others"
        pass
    summary = chrono.summary()
    share = summary["host_share"]
    if share is None:
        pytest.skip("no /proc/stat here")
    assert share["this"] > 0 and share["this"] + share["others"] + share["steal"] <= 1 + 1e-9
    assert share["seconds"] >= 0.25
    line = loop.speed_line(dict(summary, host_share=dict(share, others=0.25, steal=0.03)))
    assert line.endswith("; the host meanwhile: 25% other processes, 3% steal"), line


def test_a_metric_with_nothing_to_score_is_not_a_diverged_model():
    """Foot skating on clips whose feet never plant is nan for the truth as for the model: no frame to
    score, not divergence; nan where the truth scored is."""
    nan = float("nan")
    rows = lambda model, truth: {"test": {"clean": {"model": {"mpjpe": 1.0, "foot_skate": model},
                                                    "truth": {"mpjpe": 0.0, "foot_skate": truth}}}}
    assert loop._nonfinite(rows(nan, nan)) == []
    assert loop._nonfinite(rows(nan, 3.0)) == ["test/clean/foot_skate"]
    assert loop._nonfinite({"test": {"noisy": {"model": {"mpjpe": nan}, "input": {"mpjpe": 2.0}}}}) == \
        ["test/noisy/mpjpe"]


def _fake_run(calls):
    """A stand-in for :func:`train.train_and_evaluate`: records each call, returns a summary whose
    model MPJPE tells the runs apart (1 cm with the dynamics loss, 2 cm without)."""
    def run(config, workdir, on_eval=None):
        calls.append((config.loss.dynamics_weight, tuple(config.train.references), Path(workdir)))
        Path(workdir).mkdir(parents=True)
        metrics = dict.fromkeys(("mpjpe_global", "pa_mpjpe", "accel", "jitter", "foot_skate", "bone_error"),
                                0.0)
        row = lambda mpjpe: dict(metrics, mpjpe=mpjpe)
        model = 1.0 if config.loss.dynamics_weight else 2.0
        results = {split: {condition: {"model": row(model), "input": row(9.0), "pca": row(5.0)}
                           for condition in ("clean", "noisy")} for split in ("validation", "test")}
        results.update(pca_latent_per_frame=8, model_residual=True)
        return {"results": results, "steps_per_s": 2.0, "frames_per_s": 512.0, "host_wait_fraction": 0.01}

    return run


def test_no_dynamics_reference_is_trained_without_it_and_merged(tmp_path, monkeypatch, capsys):
    config = runlocal_config(tmp_path / "data")
    config.loss.dynamics_weight = 0.5
    config.train.references = ("no_dynamics",)
    calls = []
    monkeypatch.setattr(loop, "train_and_evaluate", _fake_run(calls))
    summary = train.run_experiment(config, tmp_path / "run")
    assert calls == [(0.5, ("no_dynamics",), tmp_path / "run"), (0.0, (), tmp_path / "run" / "no_dynamics")]
    assert config.loss.dynamics_weight == 0.5 and config.train.references == ("no_dynamics",)  # untouched
    for split in ("validation", "test"):
        for condition in ("clean", "noisy"):
            row = summary["results"][split][condition]
            assert row["model"]["mpjpe"] == 1.0 and row["no_dynamics"]["mpjpe"] == 2.0
    rows = [line.split() for line in summary["table"] if " no_dynamics " in line]
    assert [r[:4] for r in rows] == [[s, c, "no_dynamics", "2.00"] for s in ("validation", "test")
                                     for c in ("clean", "noisy")]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["table"] == summary["table"]
    assert "\n".join(summary["table"]) in capsys.readouterr().out

    calls.clear()  # without the dynamics loss there is nothing to compare against
    config.loss.dynamics_weight = 0.0
    summary = train.run_experiment(config, tmp_path / "run2")
    assert calls == [(0.0, ("no_dynamics",), tmp_path / "run2")]
    assert not [line for line in summary["table"] if " no_dynamics " in line]


# ---------------------------------------------------------------------------------------------
# Whole runs of scripts/train.py in subprocesses (a bad override: test_faults.py)


_train_cmd, _wait_for_checkpoint = train_cmd, wait_for_checkpoint


# The schedule of the two-process runs (runs.TWO_PROCESS_RUN: 80 steps, a checkpoint every 20, the final
# evaluation on one split), on 2 CPU devices: the uninterrupted run (conftest.py) is shared with
# test_multiprocess.py's SIGTERM resume, and the runs here read its programs from the compilation cache.
RUN = runs.TWO_PROCESS_RUN


@pytest.mark.slow  # three trainer subprocesses (and the session's uninterrupted run)
# e2e: ~80 CPU s with the uninterrupted run. make test: a restore equals uninterrupted steps bit for bit
# (test_grad_reduce's int8 resume, in-process), the resume past a damaged checkpoint and SIGTERM
# (test_faults).
@pytest.mark.e2e
def test_sigterm_then_kill9_then_resume_equals_uninterrupted(tmp_path, data_dir, env, uninterrupted_run):
    """SIGTERM saves a checkpoint and exits 0; a kill -9 loses only the steps since the last
    checkpoint; the resumed run ends with exactly the parameters and logged losses of an uninterrupted
    run that saved only at the end (the corpus resident on the device: its windows and augmentation
    drawn there from the saved step on). One process on 2 CPU devices, as the uninterrupted run."""
    interrupted = tmp_path / "interrupted"
    two = runs.pool_of(runs.cpu_devices(env, 2), 2)
    proc = subprocess.Popen(train_cmd(interrupted, data_dir, *RUN), env=two, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_checkpoint(proc, interrupted, after=0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["status"] == "stopped by SIGTERM" and 0 < summary["steps"] < 80
    stopped = summary["steps"]
    # One line says where the checkpoint is (SIGINT takes the same path; the old trainer said nothing).
    where = (interrupted / "checkpoints").absolute() / str(stopped)
    line = (f"stopped by SIGTERM at step {stopped}; its checkpoint is {where}; "
            "the same command resumes from it")
    assert line in out.decode().splitlines(), out.decode()[-2000:]
    assert stopped in runs.committed(interrupted)

    proc = subprocess.Popen(train_cmd(interrupted, data_dir, *RUN), env=two, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_checkpoint(proc, interrupted, after=stopped)
    proc.kill()  # SIGKILL: no handler, no final save
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    # (The input check after training, fed vs fixed batch, compiles a second step: the GPU check's dry
    # run measures it with this trainer, tests/test_gpu_check.py.)
    done = subprocess.run(train_cmd(interrupted, data_dir, *RUN), env=two, check=True, capture_output=True,
                          cwd=REPO, text=True)
    # No terminal: plain progress lines (train.progress_every, and the last step), no tqdm bar.
    assert "\r" not in done.stderr and re.search(r"^interrupted: step 80/80  loss \S+  [\d.]+ steps/s  "
                                                 r"host wait \d+%  ETA \S+$", done.stderr, re.M), done.stderr
    final = json.loads((interrupted / "summary.json").read_text())
    assert final["status"] == "done" and final["input"]["residency"] == "device"  # the corpus on the device
    assert json.loads((interrupted / "config.json").read_text())["train"]["steps"] == 80  # override applied
    reference = json.loads((uninterrupted_run / "summary.json").read_text())
    assert final["history"]["train/loss"] == reference["history"]["train/loss"]  # every logged step, once
    resumed, uninterrupted = (runs.checkpoint_params(w, 80) for w in (interrupted, uninterrupted_run))
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], uninterrupted[k], err_msg=k)


@pytest.mark.e2e
def test_auto_batch_is_resolved_by_the_trainer_at_every_entry(guarded_auto_batch_run):
    """``data.auto_batch="memory"`` is honoured by the trainer itself (not only scripts/train.py): the
    run trains at the largest global batch whose compiled step fits the per-device memory limit (one
    window per device here: 8, where the config said 16). The run is the non-finite guard's above."""
    workdir, summary, printed, config, (probe, limit) = guarded_auto_batch_run
    assert probe.memory(2).peak > limit  # per-device batch 2 does not fit (1 does: the limit is its peak)
    assert summary["status"] == "done" and config.data.batch_size == jax.device_count()
    assert "data.auto_batch=memory: data.batch_size=8" in printed, printed[-2000:]
    assert json.loads((workdir / "config.json").read_text())["data"]["batch_size"] == 8


def test_grad_accum_steps_average_micro_batches_into_one_update():
    """``train.grad_accum_steps = k``: parameters move every k-th micro-batch, by the update plain
    adamw makes from the micro-batches' mean gradient (with the schedule counted in updates)."""
    from motionjax.configs.base import get_config

    cfg = get_config().train
    cfg.update(steps=8, warmup_steps=0, learning_rate=0.1, grad_clip=1e9)
    params = {"w": jnp.array([1.0, -2.0, 0.5])}
    rows = ([0.3, -0.1, 0.2], [0.1, 0.5, -0.4], [-0.2, 0.2, 0.1], [0.4, 0.0, 0.3])
    grads = [{"w": jnp.array(g)} for g in rows]
    cfg.grad_accum_steps = 2
    accum = train.make_optimizer(cfg)
    state, p_accum = accum.init(params), params
    for i, g in enumerate(grads):
        updates, state = accum.update(g, state, p_accum)
        moved = optax.apply_updates(p_accum, updates)
        assert np.array_equal(moved["w"], p_accum["w"]) == (i % 2 == 0)  # moves on micro-batch 2, 4
        p_accum = moved
    plain_cfg = cfg.copy_and_resolve_references()
    plain_cfg.update(grad_accum_steps=1, steps=4)  # the same schedule: 4 updates
    plain = train.make_optimizer(plain_cfg)
    state, p_plain = plain.init(params), params
    for a, b in (grads[:2], grads[2:]):
        updates, state = plain.update(jax.tree.map(lambda x, y: (x + y) / 2, a, b), state, p_plain)
        p_plain = optax.apply_updates(p_plain, updates)
    np.testing.assert_allclose(p_accum["w"], p_plain["w"], rtol=1e-6)


@pytest.mark.parametrize("name", ["lion", "muon"])
def test_other_optimizers_take_the_update_optax_makes_and_unknown_ones_are_refused(name, tmp_path):
    """``train.optimizer``: the chain is clipping then the named optax optimizer on the schedule (the
    first update after no warmup equals the bare optax one), its state (Muon's holds optax's masked
    placeholders) round-trips through the trainer's orbax checkpoint, and a misspelt name is a config
    error."""
    from motionjax.configs.base import get_config

    config = get_config()
    config.train.update(optimizer=name, steps=10, warmup_steps=0, learning_rate=0.01, grad_clip=1e9)
    params = {"w": jnp.arange(12.0).reshape(3, 4) / 10, "b": jnp.array([0.5, -0.5, 1.0]),
              "conv": jnp.cos(jnp.arange(24.0)).reshape(1, 2, 3, 4)}  # a conv kernel [1, taps, in, out]
    grads = jax.tree.map(lambda p: jnp.sin(3 * p) + 0.1, params)
    ours = train.make_optimizer(config.train)
    updates, opt_state = ours.update(grads, ours.init(params), params)
    mngr = ocp.CheckpointManager(tmp_path / "checkpoints")
    train.save_checkpoint(mngr, 1, {"params": params, "opt_state": opt_state}, None, {})
    mngr.wait_until_finished()
    fresh = {"params": params, "opt_state": ours.init(params)}
    restored, _ = train.restore_checkpoint(mngr, 1, fresh)
    mngr.close()
    jax.tree.map(np.testing.assert_array_equal, restored["opt_state"], opt_state)
    cfg = config.train
    bare = (optax.lion(0.01, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay) if name == "lion" else
            optax.contrib.muon(0.01, adam_b1=cfg.b1, adam_b2=cfg.b2, weight_decay=cfg.weight_decay,
                               adam_weight_decay=cfg.weight_decay, consistent_rms=0.2,
                               muon_weight_dimension_numbers={
                                   "w": optax.contrib.MuonDimensionNumbers(0, 1), "b": None,
                                   "conv": optax.contrib.MuonDimensionNumbers((0, 1, 2), 3)}))
    expected, _ = bare.update(grads, bare.init(params), params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), updates, expected)
    assert float(jnp.abs(updates["w"]).sum()) > 0
    if name == "muon":
        # The conv kernel is orthogonalized as one [taps·in, out] = [6, 4] matrix: its update's
        # columns are near-orthogonal with equal norms (Newton-Schulz's approximate polar factor),
        # which adam's elementwise update is not.
        u = np.asarray(updates["conv"]).reshape(6, 4)
        gram = u.T @ u / np.mean(np.diag(u.T @ u))
        np.testing.assert_allclose(gram, np.eye(4), atol=0.35)
    config.train.optimizer = "adam"
    with pytest.raises(ValueError, match="train.optimizer"):
        train.check_config(config, 1, 1)


def test_schedule_free_takes_optax_updates_and_evaluation_reads_its_average():
    """``train.optimizer = "schedule_free"``: clipping then ``optax.contrib.schedule_free_adamw`` (the
    same updates as the bare optax one over a few steps), and :func:`evaluated_params` is its averaged
    iterate ``x = (y - (1 - b1)·z) / b1``, computed here by hand from the state; with an EMA it is refused."""
    from motionjax.configs.base import get_config

    config = get_config()
    config.train.update(optimizer="schedule_free", steps=10, warmup_steps=2, learning_rate=0.01,
                        grad_clip=1e9)
    cfg = config.train
    params = {"w": jnp.arange(12.0).reshape(3, 4) / 10, "b": jnp.array([0.5, -0.5, 1.0])}
    ours, bare = train.make_optimizer(cfg), optax.contrib.schedule_free_adamw(
        0.01, warmup_steps=2, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    (p_ours, s_ours), (p_bare, s_bare) = (params, ours.init(params)), (params, bare.init(params))
    for k in range(4):
        grads = jax.tree.map(lambda p, k=k: jnp.sin(3 * p + k) + 0.1, p_ours)
        u, s_ours = ours.update(grads, s_ours, p_ours)
        p_ours = optax.apply_updates(p_ours, u)
        u, s_bare = bare.update(grads, s_bare, p_bare)
        p_bare = optax.apply_updates(p_bare, u)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # noqa: E731
    jax.tree.map(close, p_ours, p_bare)
    state = {"params": p_ours, "opt_state": s_ours}
    z = s_bare.z
    by_hand = jax.tree.map(lambda y, zi: (y - (1 - cfg.b1) * zi) / cfg.b1, p_bare, z)
    jax.tree.map(close, train.evaluated_params(state), by_hand)
    assert not np.allclose(by_hand["w"], p_ours["w"])  # x differs from the trained y
    assert train.evaluated_params({"params": params, "opt_state": optax.adamw(0.1).init(params)}) is params
    config.train.ema_decay = 0.99
    with pytest.raises(ValueError, match="schedule_free"):
        train.check_config(config, 1, 1)


def test_compile_cache_is_the_configured_directory_unless_the_process_has_one(tmp_path):
    """``train.compile_cache``: a path turns jax's persistent cache on there (created); "" leaves it
    off; a cache the process already has (JAX_COMPILATION_CACHE_DIR: the tests set one) wins."""
    from motionjax.train import compile_cache
    session = jax.config.jax_compilation_cache_dir
    assert session and compile_cache.configure(str(tmp_path / "x")) == session  # conftest's wins
    assert not (tmp_path / "x").exists() and jax.config.jax_compilation_cache_dir == session
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert compile_cache.configure("") is None and jax.config.jax_compilation_cache_dir is None
        path = compile_cache.configure(str(tmp_path / "cache" / "jax"))
        assert path == str(tmp_path / "cache" / "jax") == jax.config.jax_compilation_cache_dir
        assert (tmp_path / "cache" / "jax").is_dir()
    finally:
        jax.config.update("jax_compilation_cache_dir", session)


def test_a_cpu_process_other_than_process_0_writes_its_compilation_cache_entries(monkeypatch):
    """jax writes cache entries from process 0 only, and on CPUs the keys differ by process (the
    devices' topology is part of them), so process 1 of a launch_local.sh or cluster run compiled every
    program on every launch: the trainer (compile_cache.configure) lets each CPU process write its own.
    Here this process plays process 1 of a distributed run."""
    from jax._src import distributed

    from motionjax.train import compile_cache

    session = Path(jax.config.jax_compilation_cache_dir)
    compile_cache.configure("")
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    entries = lambda: {p.name for p in session.glob("jit__lambda-*")}  # none yet where this runs alone
    before = entries()
    least = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # a small program is written too
    try:
        jax.jit(lambda x: jnp.tanh(x) * 3.75 - x)(jnp.ones(29)).block_until_ready()  # a new program
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", least)
    assert entries() - before
