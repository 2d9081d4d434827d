"""Checkpoints of a run (orbax, async): the train state, the Grain iterator position and the metric
history, so a restarted run continues bit for bit.

The last ``train.keep_checkpoints`` are kept plus the best by ``train.best_metric`` (its metric is
stored with each checkpoint, so keep-best survives restarts); a checkpoint that does not read
completely is moved aside and the previous one restored (:func:`restore_latest`). After
``train.max_nonfinite_steps`` non-finite steps in a row the model and optimizer come back from the
last checkpoint (:class:`NonfiniteGuard`).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from motionjax import parallel


def make_checkpoint_manager(workdir: Path, cfg: ml_collections.ConfigDict) -> ocp.CheckpointManager:
    """Async manager keeping the last ``cfg.keep_checkpoints`` steps and the best by ``cfg.best_metric``
    (``config.train``: ``"SPLIT/METRIC"``, lowest is best; never the test split)."""
    metric = cfg.best_metric
    policy = ocp.checkpoint_managers
    keep = policy.AnyPreservationPolicy([
        policy.LatestN(cfg.keep_checkpoints),
        # Sorted descending by the metric, BestN keeps the tail: the lowest error.
        policy.BestN(get_metric_fn=lambda m: m[metric], reverse=True, n=1,
                     keep_checkpoints_without_metrics=False),
    ])
    # best_fn makes orbax store each checkpoint's metrics on disk (checkpoints/N/metrics): without
    # them a restarted manager sees earlier steps as metric-less and BestN deletes the best one.
    options = ocp.CheckpointManagerOptions(preservation_policy=keep, enable_async_checkpointing=True,
                                           cleanup_tmp_directories=True, best_fn=lambda m: m[metric],
                                           best_mode="min")
    return ocp.CheckpointManager((workdir / "checkpoints").absolute(), options=options)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def save_checkpoint(mngr, step: int, state, iterator, history: dict, metrics=None):
    """Train state, Grain iterator position (the naive baseline loader has none) and history."""
    items = {"state": ocp.args.StandardSave(state), "history": ocp.args.JsonSave(history)}
    if isinstance(iterator, grain.DatasetIterator):
        items["data"] = grain.checkpoint.CheckpointSave(iterator)
    mngr.save(step, metrics=metrics, force=True, args=ocp.args.Composite(**items))


def restore_checkpoint(mngr, step: int, state, iterator=None):
    """``(state, history)`` of ``step``, with ``state``'s shardings; moves ``iterator`` (when given)
    to the saved position."""
    items = {"state": ocp.args.StandardRestore(_abstract(state)), "history": ocp.args.JsonRestore()}
    if isinstance(iterator, grain.DatasetIterator):
        items["data"] = grain.checkpoint.CheckpointRestore(iterator)
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
    return restored["state"], restored["history"]


class CheckpointError(RuntimeError):
    """No checkpoint of a run directory reads completely; the message lists each step and why."""


def _first_line(e: BaseException, limit: int = 300) -> str:
    """A library error in one line: TensorStore appends its whole spec and source locations."""
    text = str(e).split("\n")[0].split(" [tensorstore_spec=")[0].split(" [source locations=")[0]
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def restore_latest(mngr, workdir: Path, state, iterator=None):
    """``(step, state, history)`` of the newest checkpoint that reads completely (``(None, state,
    {})`` without checkpoints). Newer unreadable ones (a missing manifest, truncated data, a torn
    write) move to ``workdir/checkpoints_unreadable/`` with a message naming the step and the reason,
    so the run continues from the previous step and later saves don't collide with them."""
    skipped = []
    ignore_abandoned_reads()
    for step in sorted(mngr.all_steps(), reverse=True):
        try:
            restored_state, history = restore_checkpoint(mngr, step, state, iterator)
        except Exception as e:  # noqa: BLE001 - whatever orbax/TensorStore raise for damaged files
            skipped.append((step, _first_line(e)))
            continue
        if skipped:
            _move_aside(mngr, workdir, [s for s, _ in skipped])
            if parallel.is_main_process():
                for s, why in skipped:
                    print(f"checkpoint step {s} does not read completely ({why}); moved it to "
                          f"{workdir / 'checkpoints_unreadable'}; resuming from step {step}", flush=True)
        return step, restored_state, history
    if skipped:
        raise CheckpointError(f"no checkpoint in {workdir / 'checkpoints'} reads completely: " + "; ".join(
            f"step {s}: {why}" for s, why in skipped) + ". Move that directory away to start the run over")
    return None, state, {}


def ignore_abandoned_reads() -> None:
    """A failed orbax restore leaves TensorStore reads in flight: their callbacks later find their
    event loop closed, and their tasks' errors are never retrieved, each printing a traceback. Drop
    those (only those): from the unraisable hook and asyncio's log."""
    previous = sys.unraisablehook
    if getattr(previous, "_drops_closed_loops", False):
        return

    def hook(unraisable):
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            previous(unraisable)

    hook._drops_closed_loops = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(
        lambda r: not (r.getMessage().startswith("Task exception was never retrieved")
                       and "/orbax/checkpoint/" in r.getMessage()))


def _move_aside(mngr, workdir: Path, steps) -> None:
    aside = workdir / "checkpoints_unreadable"
    if parallel.is_main_process():
        aside.mkdir(parents=True, exist_ok=True)
        for s in steps:
            dest = aside / f"{s}-{time.strftime('%Y%m%dT%H%M%S')}"
            os.replace(workdir / "checkpoints" / str(s), dest)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("unreadable checkpoints moved aside")
    mngr.reload()


class NonfiniteGuard:
    """The restore policy of non-finite steps. The step itself skips a non-finite update and counts
    the run of them (``nonfinite_run``); after ``limit`` in a row the model and optimizer come back from
    the newest checkpoint, and the data stream moves on past the bad batches.

    Metrics are read one step late, so steps dispatched before a restore still report the run that
    caused it: the guard only acts on steps after the last restore (or the start)."""

    def __init__(self, mngr: ocp.CheckpointManager, limit: int, start: int, verbose: bool = True):
        self.mngr, self.limit, self.verbose = mngr, limit, verbose
        self.after = start
        self.restores = 0

    def __call__(self, done_step: int, metrics: dict, state, dispatched: int):
        """``state``, or the newest checkpoint's when step ``done_step`` ends ``limit`` non-finite steps
        in a row; ``dispatched``: the last step sent to the device."""
        if done_step <= self.after or int(metrics["nonfinite_run"]) < self.limit:
            return state
        last_good = self.mngr.latest_step()
        self.mngr.wait_until_finished()
        state, _ = restore_checkpoint(self.mngr, last_good, state)  # the data stream moves on
        state["nonfinite_total"] = jnp.int32(metrics["nonfinite_total"])
        self.restores, self.after = self.restores + 1, dispatched
        if self.verbose:
            print(f"step {done_step}: {int(metrics['nonfinite_run'])} non-finite steps in a row; "
                  f"restored the model and optimizer of step {last_good}", flush=True)
        return state
