"""Checkpoints of a run (orbax, async): the train state, the Grain iterator position and the metric
history, so a restarted run continues bit for bit.

The last ``train.keep_checkpoints`` are kept plus the best by ``train.best_metric`` (its metric is
stored with each checkpoint, so keep-best survives restarts; a non-finite metric is never best). Each
checkpoint carries a digest of every array (:func:`state_digest`), checked on restore: a checkpoint
that does not read completely, or reads other values than were saved (a flipped bit), is moved aside
and the previous one restored (:func:`restore_latest`). After ``train.max_nonfinite_steps``
non-finite steps in a row the model and optimizer come back from the newest verified checkpoint
older than the first of them (:class:`NonfiniteGuard`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from motionjax import parallel


def make_checkpoint_manager(workdir: Path, cfg: ml_collections.ConfigDict) -> ocp.CheckpointManager:
    """Async manager keeping the last ``cfg.keep_checkpoints`` steps and the best by ``cfg.best_metric``
    (``config.train``: ``"SPLIT/METRIC"``, lowest is best; never the test split)."""
    metric = cfg.best_metric
    policy = ocp.checkpoint_managers
    # A NaN or inf metric (a diverged model) ranks worst: it never becomes best, never trims the best.
    error = lambda m: float(m[metric]) if math.isfinite(float(m[metric])) else math.inf
    keep = policy.AnyPreservationPolicy([
        policy.LatestN(cfg.keep_checkpoints),
        # Sorted descending by the metric, BestN keeps the tail: the lowest error.
        policy.BestN(get_metric_fn=error, reverse=True, n=1, keep_checkpoints_without_metrics=False),
    ])
    # best_fn makes orbax store each checkpoint's metrics on disk (checkpoints/N/metrics): without
    # them a restarted manager sees earlier steps as metric-less and BestN deletes the best one.
    options = ocp.CheckpointManagerOptions(preservation_policy=keep, enable_async_checkpointing=True,
                                           cleanup_tmp_directories=True, best_fn=error, best_mode="min")
    directory = (Path(workdir) / "checkpoints").absolute()
    if parallel.is_main_process():
        _repair_metrics(directory, metric)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("checkpoint metrics checked")
    return ocp.CheckpointManager(directory, options=options)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _repair_metrics(directory: Path, metric: str) -> None:
    """Each step's ``metrics/metrics`` (keep-best's record, read by orbax when the manager opens: an
    unreadable one fails the whole run) rewritten from the run's metric history when it does not read;
    a step whose metric the history lacks loses its metrics file (it then stays only while it is
    among the last ``train.keep_checkpoints``). Says which and what."""
    steps = sorted((int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()), reverse=True)
    bad = [s for s in steps if (directory / str(s) / "metrics" / "metrics").exists()
           and not isinstance(_read_json(directory / str(s) / "metrics" / "metrics"), dict)]
    if not bad:
        return
    histories = (_read_json(directory / str(s) / "history" / "metadata") for s in steps)
    history = next((h for h in histories if isinstance(h, dict)), {})
    evaluated = dict((int(s), v) for s, v in history.get(f"eval/{metric}", []))
    for s in bad:
        path = directory / str(s) / "metrics" / "metrics"
        if s in evaluated:
            tmp = path.with_name("metrics.tmp")
            tmp.write_text(json.dumps({metric: evaluated[s]}))
            os.replace(tmp, path)
            what = f"rewrote it from the run's history ({metric} = {evaluated[s]:g})"
        else:
            path.unlink()
            what = "removed it (the run's history has no value for that step)"
        print(f"checkpoint step {s}: its metrics file {path} does not read; {what}", flush=True)


def abstract(tree):
    """Shapes, dtypes and shardings of ``tree``'s arrays (what a restore fills)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _fmix(h):
    """murmur3's 32-bit finalizer: every input bit reaches every output bit."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x):
    """Any array's bits as ``uint32 [N]`` (narrower types widened, wider ones split)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    x = jnp.ravel(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return jnp.ravel(jax.lax.bitcast_convert_type(x, unsigned)).astype(jnp.uint32)


_SEEDS = np.array([[1], [0x7F4A7C15]], np.uint32)  # [2, 1]: the two sums' seeds


@jax.jit
def _leaf_digest(x):
    """``uint32 [2]``: sums of mixed (word, position) hashes, two seeds. Modular sums do not depend on
    the order of the reduction, so any sharding of the array gives the same digest. Jitted on its own
    so that :func:`_leaf_digests` traces it once per distinct leaf shape, not once per leaf."""
    w = _words(x)
    i = jax.lax.iota(jnp.uint32, w.size)
    return jnp.sum(_fmix(w ^ _fmix(i * np.uint32(0x9E3779B9) + _SEEDS)), axis=1, dtype=jnp.uint32)


@jax.jit
def _leaf_digests(leaves):
    """:func:`_leaf_digest` of each array, in one program (one dispatch, one compile: a state's
    optimizer moments repeat its parameters' shapes, so the traces are few)."""
    return [_leaf_digest(x) for x in leaves]


def state_digest(state) -> dict:
    """``{leaf path: "shape dtype hex"}`` of every array of ``state``: written with each checkpoint and
    compared on restore. A flipped bit changes its leaf's digest (64 bits: a miss is ~5e-20)."""
    layout = _layout(state)
    sums = np.asarray(jax.device_get(_leaf_digests(jax.tree.leaves(state))))
    return {k: f"{v} {int(s[0]):08x}{int(s[1]):08x}" for (k, v), s in zip(layout.items(), sums, strict=True)}


class CorruptCheckpointError(ValueError):
    """A checkpoint whose arrays read other values than were saved (its digest differs)."""


def _verify(state, saved: dict) -> None:
    now = state_digest(state)
    bad = [k for k in saved if now.get(k) != saved[k]]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CorruptCheckpointError(f"the contents of {', '.join(bad[:3])}{more} differ from the digest "
                                     "saved with them (a damaged file)")


def save_checkpoint(mngr, step: int, state, iterator, history: dict, metrics=None):
    """Train state, its digest (:func:`state_digest`), the Grain iterator position (the naive baseline
    loader has none) and history."""
    items = {"state": ocp.args.StandardSave(state), "history": ocp.args.JsonSave(history),
             "digest": ocp.args.JsonSave(state_digest(state))}
    if isinstance(iterator, grain.DatasetIterator):
        items["data"] = grain.checkpoint.CheckpointSave(iterator)
    mngr.save(step, metrics=metrics, force=True, args=ocp.args.Composite(**items))


def restore_checkpoint(mngr, step: int, state, iterator=None):
    """``(state, history)`` of ``step``, with ``state``'s shardings, checked against the digest saved
    with it (:class:`CorruptCheckpointError`; checkpoints of older code have none); moves
    ``iterator`` (when given) to the saved position."""
    items = {"state": ocp.args.StandardRestore(abstract(state)), "history": ocp.args.JsonRestore()}
    digested = (Path(mngr.directory) / str(step) / "digest").exists()
    if digested:
        items["digest"] = ocp.args.JsonRestore()
    if isinstance(iterator, grain.DatasetIterator):
        items["data"] = grain.checkpoint.CheckpointRestore(iterator)
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
    if digested:
        _verify(restored["state"], restored["digest"])
    return restored["state"], restored["history"]


class CheckpointError(RuntimeError):
    """No checkpoint of a run directory reads completely; the message lists each step and why."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """A library error in one line: TensorStore appends its whole spec and source locations."""
    text = str(e).split("\n")[0].split(" [tensorstore_spec=")[0].split(" [source locations=")[0]
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def restore_latest(mngr, workdir: Path, state, iterator=None):
    """``(step, state, history)`` of the newest checkpoint that reads completely and matches its digest
    (``(None, state, {})`` without checkpoints). Newer damaged ones (a missing manifest, truncated
    data, a torn write, a flipped bit) move to ``workdir/checkpoints_unreadable/`` with a message
    naming the step and the reason, so the run continues from the previous step and later saves don't
    collide with them."""
    steps = mngr.all_steps()
    if steps:
        _check_shapes(workdir, max(steps), state)
    step, restored, history, skipped = _restore_newest(mngr, workdir, steps, state, iterator, "resuming from")
    if step is None and skipped:
        raise CheckpointError(f"no checkpoint in {workdir / 'checkpoints'} reads completely: " + "; ".join(
            f"step {s}: {why}" for s, why in skipped) + ". Move that directory away to start the run over")
    return (None, state, {}) if step is None else (step, restored, history)


def _check_shapes(workdir: Path, step: int, state) -> None:
    """:class:`~.checks.ResumeError` naming the arrays whose shapes differ between checkpoint ``step``
    (its digest records them) and ``state`` (what this config builds): a changed model is another run,
    not a damaged checkpoint."""
    saved = _read_json(Path(workdir) / "checkpoints" / str(step) / "digest" / "metadata")
    if not isinstance(saved, dict):
        return  # a checkpoint of older code, or a damaged one: the restore says which
    saved = {k: v.rsplit(" ", 1)[0] for k, v in saved.items()}  # "shape dtype" without the digest
    now = _layout(state)
    differ = [f"{k}: {saved.get(k, 'absent')} there, {now.get(k, 'absent')} here"
              for k in sorted(saved.keys() | now.keys()) if saved.get(k) != now.get(k)]
    if differ:
        from motionjax.train.checks import ResumeError
        raise ResumeError(workdir, [f"checkpoint step {step} array {d}" for d in differ])


def _layout(state) -> dict:
    """``{leaf path: "shape dtype"}`` of ``state`` (the first part of :func:`state_digest`'s entries)."""
    return {jax.tree_util.keystr(p): f"{tuple(x.shape)} {x.dtype}"
            for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def _restore_newest(mngr, workdir: Path, steps, state, iterator, then: str):
    """``(step, state, history, skipped)``: the newest of ``steps`` that restores and verifies; the
    newer ones that do not are moved aside (when one does) and printed as ``... ; {then} step N``."""
    skipped = []
    ignore_abandoned_reads()
    for step in sorted(steps, reverse=True):
        try:
            restored_state, history = restore_checkpoint(mngr, step, state, iterator)
        except Exception as e:  # noqa: BLE001 - whatever orbax/TensorStore raise for damaged files
            skipped.append((step, first_line(e)))
            continue
        if skipped:
            _move_aside(mngr, workdir, [s for s, _ in skipped])
            if parallel.is_main_process():
                for s, why in skipped:
                    print(f"checkpoint step {s} does not read completely ({why}); moved it to "
                          f"{workdir / 'checkpoints_unreadable'}; {then} step {step}", flush=True)
        return step, restored_state, history, skipped
    return None, state, {}, skipped


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
    the newest checkpoint saved before the first of them that verifies (its digest), and the data
    stream moves on past the bad batches. Checkpoints saved during the run of non-finite steps hold
    the state that produced them (the updates were skipped): never those.

    Metrics are read one step late, so steps dispatched before a restore still report the run that
    caused it: the guard only acts on steps after the last restore (or the start)."""

    def __init__(self, mngr: ocp.CheckpointManager, limit: int, start: int, verbose: bool = True):
        self.mngr, self.limit, self.verbose = mngr, limit, verbose
        self.after = start
        self.restores = 0

    def __call__(self, done_step: int, metrics: dict, state, dispatched: int):
        """``state``, or a checkpoint's when step ``done_step`` ends ``limit`` non-finite steps in a row;
        ``dispatched``: the last step sent to the device."""
        run = int(metrics["nonfinite_run"])
        if done_step <= self.after or run < self.limit:
            return state
        first_bad = done_step - run + 1
        self.mngr.wait_until_finished()
        older = [s for s in self.mngr.all_steps() if s < first_bad]
        workdir = Path(self.mngr.directory).parent
        last_good, restored, _, _ = _restore_newest(self.mngr, workdir, older, state, None, "restoring")
        self.after = dispatched  # the data stream moves on
        if last_good is None:
            if self.verbose:
                print(f"step {done_step}: {run} non-finite steps in a row, and no verified checkpoint before "
                      f"step {first_bad} to restore; going on (non-finite updates are skipped)", flush=True)
            return state
        restored["nonfinite_total"] = jnp.int32(metrics["nonfinite_total"])
        self.restores += 1
        if self.verbose:
            print(f"step {done_step}: {run} non-finite steps in a row; "
                  f"restored the model and optimizer of step {last_good}", flush=True)
        return restored
