"""The run: set up, train, evaluate, write; readable top to bottom.

:func:`train_and_evaluate` trains ``config`` in ``workdir`` (resuming from its checkpoints) with the
step of :mod:`.step`, evaluates with the evaluators ``config.evals`` declares
(:mod:`motionjax.evaluation.evaluators`), and writes the run directory (process 0: TensorBoard events,
``summary.json``, learning curves, the evaluators' plots and exports). :func:`run_experiment` adds
the reference runs (``train.references``) and prints the results table.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import numbers
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from motionjax import parallel, timing
from motionjax.data import feed, pipeline
from motionjax.evaluation import artifacts, evaluators
from motionjax.train import batch_finder, checkpoints, checks, compile_cache, faults, logs, step


def step_timer(config: ml_collections.ConfigDict, info, mesh, train_step, state):
    """:func:`make_iterator`'s ``step_ms`` for the step the trainer runs: a function that measures
    ``train_step``'s milliseconds on ``state`` (:func:`.step.step_ms`) when the feed first asks."""
    return lambda: step.step_ms(train_step, state, step.abstract_batch(config, info, mesh))


def make_iterator(config: ml_collections.ConfigDict, info, mesh, step_ms=None):
    """Training batches as global arrays on ``mesh`` (the keys :func:`.step.batch_keys` names): the
    feed (:mod:`motionjax.data.feed`: the corpus on the devices or streamed by Grain, windows augmented
    on the device), or (``data.loader = "naive"``, the baseline) numpy batches made on the main thread
    and placed on the mesh per step. ``step_ms``: the train step's milliseconds, or a function that
    measures them (the stream tier's worker choice, :func:`motionjax.data.feed.auto_workers`)."""
    keys = step.batch_keys(config)
    if config.data.loader == "grain":
        mode, why = feed.choose_residency(config.data, info)
        if parallel.is_main_process():
            print(f"data: {why}", flush=True)
        return feed.Feed(config.data, info, mesh, keys, seed=config.seed, mode=mode, step_ms=step_ms)
    if config.data.loader == "naive":
        shardings = parallel.batch_shardings(mesh, keys)
        return (pipeline.to_global(shardings, b)
                for b in pipeline.make_naive_train_iterator(config.data, info, seed=config.seed))
    raise ValueError(f"unknown data.loader {config.data.loader!r}; expected 'grain' or 'naive'")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir, on_eval=None) -> dict:
    """Train ``config`` in ``workdir`` (resuming from its checkpoints), evaluate, write artefacts.

    Safe under several processes: every process runs the same steps and saves its checkpoint
    shards; process 0 alone holds the workdir lock, logs, plots and writes ``summary.json``.
    ``on_eval(step, metrics, timing) -> bool``, if given, runs after each evaluation (and its
    checkpoint) with the held-out metrics and the seconds so far (``compile_s``, ``train_s``,
    ``eval_s``, ``checkpoint_s``, ``host_wait_s``); True ends training there, evaluated as a finished
    run (``status`` "stopped by on_eval"): a stop at a target accuracy or a time budget.
    Returns the summary dict. Raises :class:`~.checks.ConfigError`, :class:`~.faults.WorkdirLockedError`,
    :class:`~.faults.StorageError` (a failed write, after closing the checkpoint manager and the data
    iterator within ``train.stop_timeout_s``) or :class:`~.checkpoints.CheckpointError`.
    """
    checks.check_config(config, jax.device_count(), jax.process_count())
    workdir = Path(workdir)
    compile_cache.configure(config.train.compile_cache)
    checks.check_resume(config, workdir)
    lock = faults.workdir_lock(workdir) if parallel.is_main_process() else contextlib.nullcontext()
    with lock, faults.stop_on_signals(config.train.stop_timeout_s) as stop, contextlib.ExitStack() as cleanup:
        try:
            run = _start(config, workdir, cleanup)
            with timing.gc_frozen():  # no full collection of the setup's objects in the middle of a step
                done, stopped_early = _train(run, stop, on_eval)
            summary = _finish(run, done, stop["signal"], stopped_early)
        except Exception as e:
            error = faults.storage_error(e, workdir)
            if error is None:
                raise
            # Close what is open (orbax's writer threads, the data iterator) but never hang on it.
            checkpoints.ignore_abandoned_reads()
            watchdog = faults.watchdog(config.train.stop_timeout_s, f"{error} (cleanup blocked)", 1)
            cleanup.close()
            watchdog.cancel()
            raise error from e
        cleanup.pop_all()  # closed on the way out already
        return summary


@dataclasses.dataclass
class _Run:
    """What one run holds between its start and its end."""

    config: ml_collections.ConfigDict
    workdir: Path
    info: object
    step: object           # the jitted train step
    state: dict
    predict: object        # predict(state, x) in eval mode
    iterator: object
    mngr: object           # the orbax checkpoint manager
    history: dict
    log: logs.MetricLog
    guard: checkpoints.NonfiniteGuard
    chrono: logs.Chrono
    heldout: dict          # the evaluators that run during training
    start: int
    writer: logs.EventWriter | None = None
    bar: logs.Progress | None = None
    fed: object = None     # the train step with the feed's input program inside (step.FedStep)


def _start(config, workdir: Path, cleanup: contextlib.ExitStack) -> _Run:
    """Mesh, data, model, state (restored from the newest readable checkpoint), logs."""
    main, cfg = parallel.is_main_process(), config.train
    mesh = parallel.make_mesh(config.mesh)
    info = pipeline.dataset_info(config.data)  # prepares the dataset on first use
    found = batch_finder.resolve_auto_batch(config, info)  # data.auto_batch: sets data.batch_size
    if found and main:
        print(f"data.auto_batch={found['mode']}: data.batch_size={found['global_batch']} "
              f"({found['per_device_batch']} per device)", flush=True)
    checks.check_data(config, info)
    train_step, state, shardings, eval_graphdef = step.build_train_step(config, info, mesh)
    if main:
        print(step.gradient_reduction(config, mesh, state["params"])[1].describe(), flush=True)
    iterator = make_iterator(config, info, mesh, step_ms=step_timer(config, info, mesh, train_step, state))
    cleanup.callback(faults.quietly, getattr(iterator, "close", None))
    mngr = checkpoints.make_checkpoint_manager(workdir, cfg)
    cleanup.callback(faults.quietly, mngr.close)
    start, state, history = checkpoints.restore_latest(mngr, workdir, state, iterator)
    if start is None:
        start = 0
        checkpoints.save_checkpoint(mngr, 0, state, iterator, history)  # the NaN guard's first "last good"
    writer = bar = None
    if main:
        workdir.mkdir(parents=True, exist_ok=True)
        writer = logs.EventWriter(workdir / "tensorboard")  # its own thread; a write's error raises here
        cleanup.callback(faults.quietly, writer.close)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    chrono = logs.Chrono(frames_per_step=config.data.batch_size * config.data.window)
    if main:  # a bar on a terminal, a line every train.progress_every steps in a log file
        bar = logs.Progress(cfg.steps, start, workdir.name, cfg.progress_every, chrono)
        cleanup.callback(faults.quietly, bar.close)
    return _Run(config, workdir, info, train_step, state, step.make_predict(eval_graphdef, mesh, shardings),
                iterator, mngr, history, logs.MetricLog(history, writer),
                checkpoints.NonfiniteGuard(mngr, cfg.max_nonfinite_steps, start, verbose=main),
                chrono, evaluators.build(config, info, during=True), start, writer, bar)


def _train(run: _Run, stop: dict, on_eval) -> tuple[int, bool]:
    """Steps until ``train.steps``, a signal (``stop``) or ``on_eval`` says stop: ``(last step, stopped
    by on_eval)``.

    The host never waits for a step it just dispatched: metrics are read only for the steps they are
    logged or shown at (every ``train.log_every`` and ``train.progress_every``; every step with
    loss-aware sampling, whose sampler needs each step's window errors), from a copy to the host
    started when the step was dispatched, ``READ_LAG`` steps later, so the device always has that
    many queued. Before an evaluation or a
    checkpoint every dispatched step is read (the non-finite guard sees what the checkpoint holds)."""
    cfg, chrono = run.config.train, run.chrono
    current, stopped_early = run.start, False
    advance = _stepper(run)
    loss_aware = step.uses_window_errors(run.config)
    lag = 1 if loss_aware else READ_LAG  # loss-aware: priority's doc counts on one step late
    inflight: list = []  # (step, metrics, read?, what it read): dispatched, not read yet
    while current < cfg.steps and not _stop_agreed(stop, current, cfg.log_every) and not stopped_early:
        if chrono.compile_s is None:
            with chrono.compiling():
                run.state, metrics, keep = advance()
                jax.block_until_ready(metrics)
        else:
            with chrono.dispatch():
                run.state, metrics, keep = advance()
        current += 1
        read = (loss_aware or current % cfg.log_every == 0 or current % cfg.progress_every == 0
                or current == cfg.steps)
        if read:
            for x in jax.tree.leaves(metrics):
                x.copy_to_host_async()
        # The batch lives until its step has run: on XLA:CPU, freeing an array whose transfer
        # or use is still queued blocks the host until the device gets there.
        inflight.append((current, metrics, read, keep))
        _read_upto(run, inflight, current - lag, dispatched=current)
        if run.bar:
            run.bar.update(1)
        eval_now = current % cfg.eval_every == 0 or current == cfg.steps
        if eval_now or current % cfg.checkpoint_every == 0:
            _read_upto(run, inflight, current, dispatched=current)
            with chrono.paused("eval"):
                held_out = _evaluate_heldout(run, current) if eval_now else None
            best = {cfg.best_metric: held_out[cfg.best_metric]} if held_out else None
            with chrono.paused("checkpoint"):
                checkpoints.save_checkpoint(run.mngr, current, run.state, run.iterator, run.history, best)
            if held_out and on_eval is not None:
                stopped_early = bool(on_eval(current, held_out, chrono.so_far()))
    _read_upto(run, inflight, current, dispatched=current)
    return current, stopped_early


READ_LAG = 2  # steps between a step's dispatch and the read of its metrics


def _stepper(run: _Run):
    """``advance() -> (state, metrics, keep)``: the next step dispatched and what it read (kept until
    it has run). A feed's input program runs inside the step (:class:`~.step.FedStep`: one program);
    another iterator's batches (the naive loader) go to the plain step, the host's time in ``next()``
    counted as host wait."""
    chrono = run.chrono
    if isinstance(run.iterator, feed.Feed):
        run.fed = run.fed or run.step.fed(run.iterator)
        return lambda: run.fed(run.state, chrono.host_wait)

    def plain():
        with chrono.host_wait():
            batch = next(run.iterator)
        state, metrics = run.step(run.state, batch)
        if "segment" in batch:
            metrics["segment"] = batch["segment"]
        return state, metrics, batch

    return plain


def _stop_agreed(stop: dict, current: int, every: int) -> bool:
    """Whether the run stops before step ``current + 1``. One process: once a signal came. Several:
    every ``every`` steps the processes share whether any got one, and all stop at that step (the
    checkpoint is a collective: a process that stopped alone would leave the others waiting in the
    next step); the others take the signal's name, so every process saves and exits alike."""
    if jax.process_count() == 1:
        return stop["signal"] is not None
    if current % every:
        return False
    got = multihost_utils.process_allgather(np.int32(stop["signal"] is not None))
    if got.any() and stop["signal"] is None:
        stop["signal"] = f"a signal to process {int(np.argmax(got))}"
    return bool(got.any())


def _read_upto(run: _Run, inflight: list, upto: int, dispatched: int) -> None:
    """Read the metrics of the in-flight steps up to ``upto`` that are read (:func:`_read`) and let go
    of every step up to there (their batches have surely run)."""
    while inflight and inflight[0][0] <= upto:
        done_step, metrics, read, _ = inflight.pop(0)
        if read:
            _read(run, done_step, metrics, dispatched)


def _read(run: _Run, done_step: int, metrics: dict, dispatched: int) -> None:
    """Log a dispatched step's metrics, hand its window errors to a loss-aware sampler and let the
    non-finite guard act on them."""
    cfg = run.config.train
    window_error, segments = metrics.pop("window_pose", None), metrics.pop("segment", None)
    if window_error is not None:  # [B] per window, not scalars to log
        run.iterator.record(done_step, parallel.to_host(segments), parallel.to_host(window_error))
    metrics = jax.device_get(metrics)
    if done_step % cfg.log_every == 0 or done_step == cfg.steps:
        run.log(done_step, {k: v for k, v in metrics.items() if k != "nonfinite_run"}, "train")
    if run.bar:
        run.bar.show(done_step, float(metrics["loss"]), int(metrics["nonfinite_total"]))
    run.state = run.guard(done_step, metrics, run.state, dispatched=dispatched)


def _evaluate_heldout(run: _Run, current: int) -> dict:
    """The during-training evaluators' scalars (``SPLIT/METRIC``), logged under ``eval/``."""
    predict = lambda x: run.predict(run.state, x)
    out = evaluators.Metrics.scalars(evaluators.run(run.heldout, predict))
    splits, _, metric = run.config.train.best_metric.partition("/")
    if "+" in splits:  # several held-out splits weigh the same in the checkpoint choice
        values = [out[f"{s}/{metric}"] for s in splits.split("+")]
        out[run.config.train.best_metric] = sum(values) / len(values)
    run.log(current, out, "eval")
    return out


def _finish(run: _Run, done: int, interrupted: str | None, stopped_early: bool) -> dict:
    """The final checkpoint and evaluation (every declared evaluator, once, on the best checkpoint by
    ``train.best_metric``), ``summary.json``."""
    main, mngr = parallel.is_main_process(), run.mngr
    check = None
    if not interrupted and done > run.start and run.config.train.input_check_steps:
        with run.chrono.paused("input_check"):
            check = input_check(run, run.config.train.input_check_steps)
    timing = run.chrono.summary()
    if interrupted and mngr.latest_step() != done:
        checkpoints.save_checkpoint(mngr, done, run.state, run.iterator, run.history)
    mngr.wait_until_finished()
    if hasattr(run.iterator, "close"):
        run.iterator.close()
    if run.bar:
        run.bar.close()
    if interrupted and main:
        print(f"stopped by {interrupted} at step {done}; its checkpoint is {mngr.directory / str(done)}; "
              "the same command resumes from it", flush=True)
    summary = {
        "workdir": str(run.workdir), "steps": done,
        "status": (f"stopped by {interrupted}" if interrupted else "stopped by on_eval" if stopped_early
                   else "done"),
        **timing,
        "nonfinite_steps": int(jax.device_get(run.state["nonfinite_total"])),
        "nonfinite_restores": run.guard.restores,
        "params": int(sum(x.size for x in jax.tree.leaves(run.state["params"]))),
    }
    if isinstance(run.iterator, feed.Feed):  # where the corpus lived, its setup, compile, cache hits
        summary["input"] = {"residency": run.iterator.mode, "setup_s": run.iterator.setup_s,
                            "compile_s": run.iterator.compile_s,
                            "cache": run.iterator.stats()}
    if check:
        summary["input_overhead"], summary["input_check"] = check["input_overhead"], check
    if summary["steps_per_s"]:  # the table's speed line (run_experiment prints it last)
        summary["speed"] = speed_line(summary)
    if not interrupted:
        summary.update(_evaluate_best(run, done))
    summary["history"] = run.history
    mngr.close()
    if main:
        artifacts.plot_learning_curves(
            {k: v for k, v in run.history.items() if k in ("train/loss", "train/position") or
             (k.startswith("eval/") and k.endswith("/mpjpe"))}, run.workdir / "learning_curves.png")
        (run.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        run.writer.close()
    return summary


INPUT_CHECK_ROUNDS = 8  # a block's time moves +-15% between rounds on a shared VM: one pair cannot tell 2%


def input_check(run: _Run, steps: int) -> dict:
    """The input's cost to the step, measured where it runs: ``steps`` steps fed by the run's own
    input (the feed's program inside the step, or the iterator's batches) against ``steps`` on one
    fixed batch (no input program runs), in 8 rounds: the resident feed's steps interleaved one by one
    (:func:`motionjax.timing.time_interleaved`), a host pipeline's in alternating blocks of ``steps / 8``
    (:func:`motionjax.timing.time_blocks`: its thread would run ahead during interleaved fixed steps),
    on a copy of the trained state (the run's is untouched);
    ``input_overhead = 1 - fed steps/s / fixed steps/s`` from the mean of each over the rounds, with
    its 95% interval over rounds (:func:`motionjax.timing.overhead`). It counts the input program's
    device time, which a timer around the host's call cannot see. The fixed side runs the plain
    step, compiled here for a feed's run (``compile_s``). The run is over: the data stream it saved
    is not moved."""
    fixed_batch = jax.block_until_ready(next(run.iterator))
    if isinstance(run.iterator, feed.Feed):
        fed = lambda s: run.fed(s)  # noqa: E731
    else:
        fed = lambda s: (*run.step(s, b := next(run.iterator)), b)  # noqa: E731
    fixed = lambda s: (*run.step(s, fixed_batch), None)  # noqa: E731
    t = time.perf_counter()
    state = jax.block_until_ready(fixed(jax.tree.map(jnp.copy, run.state))[0])
    compile_s = time.perf_counter() - t
    block = max(steps // INPUT_CHECK_ROUNDS, 1)
    rounds = max(steps // block, 1)
    calls = {"fed": fed, "fixed": fixed}
    with timing.gc_frozen():  # as the training loop
        if getattr(run.iterator, "mode", None) == "device":
            # The resident feed's input runs inside the step, no host thread: fed and fixed steps
            # interleaved one by one share each moment's load, which blocks of each cannot (it drifts).
            seconds = timing.time_interleaved(calls, state, block, rounds)
            how = f"{rounds} rounds of {block} fed and {block} fixed steps interleaved in a random order"
        else:  # a host pipeline's thread would run ahead during the fixed steps: blocks of each
            seconds = timing.time_blocks(calls, state, block, rounds)
            how = f"{rounds} alternating rounds of {block} steps each"
    cost = timing.overhead(seconds, "fed")
    mean = {k: len(v) / sum(v) for k, v in seconds.items()}
    return {"input_overhead": cost["value"], "interval": [cost["lo"], cost["hi"]], "best_of": cost["best"],
            "fed_steps_per_s": mean["fed"], "fixed_steps_per_s": mean["fixed"], "steps": rounds * block,
            "compile_s": compile_s,
            "method": f"fed vs fixed batch after training: {how}, mean steps/s, 95% interval over rounds"}


def speed_line(summary: dict) -> str:
    """``speed: 6.21 steps/s, 12,718 frames/s, input overhead 0.4% [-1.2, 2.0] (fed vs fixed batch), host
    wait 0.0%, host 161.0 ms/step (p99 170.2), step dispatch 0.31 ms; the host meanwhile: 1% other processes,
    0% steal`` (what is known of it)."""
    line = f"speed: {summary['steps_per_s']:.2f} steps/s, {summary['frames_per_s']:,.0f} frames/s"
    if summary.get("input_overhead") is not None:
        lo, hi = (summary.get("input_check") or {}).get("interval") or (None, None)
        span = "" if lo is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]"
        line += f", input overhead {100 * summary['input_overhead']:.1f}%{span} (fed vs fixed batch)"
    line += f", host wait {100 * summary['host_wait_fraction']:.1f}%"
    host = summary.get("host")
    if host:
        line += (f", host {host['host_ms_p50']:.1f} ms/step (p99 {host['host_ms_p99']:.1f}), step dispatch "
                 f"{host['dispatch_ms_p50']:.2f} ms")
    share = summary.get("host_share")
    if share:  # a loaded host's wall time is not this config's
        line += (f"; the host meanwhile: {100 * share['others']:.0f}% other processes, "
                 f"{100 * share['steal']:.0f}% steal")
    return line


def best_step(history: dict, metric: str, on_disk) -> tuple[int | None, float | None]:
    """``(step, value)`` of the lowest finite ``metric`` (``"SPLIT/METRIC"``) in the run's ``history``
    among the checkpoint steps ``on_disk``; ``(None, None)`` when none is finite."""
    on_disk = set(on_disk)
    finite = [(v, s) for s, v in history.get(f"eval/{metric}", []) if s in on_disk and math.isfinite(v)]
    if not finite:
        return None, None
    value, step = min(finite)
    return int(step), float(value)


def _evaluate_best(run: _Run, done: int) -> dict:
    """Every evaluator once, the test split included (it chose nothing), on the checkpoint the
    validation metric chose (``evaluated_step``); status ``non-finite: ...`` when no evaluation had a
    finite metric or the final results hold a non-finite one (a diverged model is not "done")."""
    metric, out = run.config.train.best_metric, {}
    best, value = best_step(run.history, metric, run.mngr.all_steps())
    state = run.state
    if best is not None and best != done:
        abstract = checkpoints.abstract(run.state)
        run.state = state = None  # one copy of the state in memory: the last one is on disk
        try:
            state, _ = checkpoints.restore_checkpoint(run.mngr, best, abstract)
        except Exception as e:  # noqa: BLE001 - a damaged best checkpoint, whatever orbax raises
            raise checkpoints.CheckpointError(f"the best checkpoint (step {best} by {metric}) does not read "
                                              f"for the final evaluation: {checkpoints.first_line(e)}") from e
        run.state = state
    final = evaluators.build(run.config, run.info)
    predict = lambda x: run.predict(state, x)
    out["results"] = evaluators.run(final, predict, run.workdir if parallel.is_main_process() else None)
    out["results"]["pca_latent_per_frame"] = evaluators.latent_per_frame(run.config)
    # A residual model also sees its input through the skip path: PCA then matches its bottleneck only.
    out["results"]["model_residual"] = bool(run.config.model.residual)
    out["best_step"], out["best_value"] = best, value  # by train.best_metric, among the checkpoints kept
    out["evaluated_step"] = best if best is not None else done
    last = run.history.get(f"eval/{metric}", [])[-1:]
    bad = _nonfinite(out["results"])
    if best is None or bad:
        why = (f"every evaluation of {metric} was non-finite" if best is None else
               f"the final results of step {out['evaluated_step']} are non-finite ({', '.join(bad[:3])})")
        out["status"] = f"non-finite: {why}"
    elif last and not math.isfinite(last[0][1]) and parallel.is_main_process():
        print(f"the last evaluation (step {last[0][0]}) had {metric} = {last[0][1]}; the results are of the "
              f"best checkpoint, step {best} ({metric} = {value:g})", flush=True)
    return out


def _nonfinite(results: dict) -> list[str]:
    """``SPLIT/CONDITION/METRIC`` of the model's non-finite results. A metric that is non-finite for the
    truth or the input row too had nothing to score (foot skating where no foot is planted), not a
    diverged model."""
    unscored = lambda row, k: any(isinstance(row.get(r), dict) and isinstance(row[r].get(k), numbers.Real)
                                  and not math.isfinite(row[r][k]) for r in ("truth", "input"))
    return [f"{split}/{condition}/{k}" for split, rows in results.items() if isinstance(rows, dict)
            for condition, row in rows.items() if isinstance(row, dict)
            for k, v in row.get("model", {}).items()
            if isinstance(v, numbers.Real) and not math.isfinite(v) and not unscored(row, k)]


def run_experiment(config: ml_collections.ConfigDict, workdir) -> dict:
    """:func:`train_and_evaluate`, then the reference runs: (``train.references``) the same model
    without the dynamics loss in ``workdir/no_dynamics``, and each of ``train.reference_models``
    (``NAME: {model key: value}``) in ``workdir/NAME``, with the same data, loss and budget; their
    ``model`` rows join the results as ``no_dynamics`` / ``NAME``. Prints and saves the comparison
    table in ``summary.json``."""
    workdir = Path(workdir)
    summary = train_and_evaluate(config, workdir)
    if "results" not in summary:
        return summary
    references = {}
    if "no_dynamics" in config.train.references and config.loss.dynamics_weight > 0:
        references["no_dynamics"] = {"loss": {"dynamics_weight": 0.0}}
    for name, model in config.train.reference_models.items():
        references[name] = {"model": dict(model)}
    for name, overrides in references.items():
        ablation = copy.deepcopy(config)
        with ablation.unlocked():
            for section, values in overrides.items():
                ablation[section].update(values)
            ablation.train.references = ()
            ablation.train.reference_models = ml_collections.ConfigDict()
        ref = train_and_evaluate(ablation, workdir / name)
        for split, rows in ref.get("results", {}).items():
            if isinstance(rows, dict):
                for condition, row in rows.items():
                    summary["results"][split][condition][name] = row["model"]
    table = evaluators.forecast_table(summary["results"])  # a forecaster's run: its horizon table
    forecast = bool(table)
    if not forecast:
        table = evaluators.results_table(summary["results"])
    if summary.get("best_value") is not None:
        table.append(f"model: the checkpoint of step {summary['evaluated_step']} (of {summary['steps']}), "
                     f"chosen by {config.train.best_metric} = {summary['best_value']:.4g}")
    if not forecast:
        table.append(f"PCA latent: {summary['results']['pca_latent_per_frame']} numbers per frame = the "
                     "model's bottleneck" + (" (the model also has a residual skip from its input)"
                                             if summary["results"]["model_residual"] else ""))
    if summary["steps_per_s"]:  # a run resumed at its last step trains nothing in this session
        table.append(speed_line(summary))
    summary["table"] = table
    if parallel.is_main_process():
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        print("\n".join(table), flush=True)
    return summary
