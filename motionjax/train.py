"""The trainer: denoising reconstruction of motion windows, jit-sharded over a ``(data, time)`` mesh.

One jitted step (in/out shardings from :mod:`motionjax.parallel`, the train state donated) runs
the model on the loader's noised/masked window, the loss of :mod:`motionjax.losses` against the
clean window, and an optax update (adamw, warmup + cosine, global-norm clipping, optional
``optax.MultiSteps`` accumulation). A step whose loss or gradients are not finite leaves the state
untouched and is counted; after ``train.max_nonfinite_steps`` such steps in a row the model and
optimizer come back from the last checkpoint (the data stream keeps moving, past the bad batches).

Checkpoints (orbax, async) hold the train state, the Grain iterator state and the metric history,
so a restarted run continues bit for bit. The last ``train.keep_checkpoints`` are kept plus the best
by held-out MPJPE (its metric is stored with each checkpoint, so keep-best survives restarts); a
checkpoint that does not read completely is moved aside and the previous one restored.
SIGTERM/SIGINT save a checkpoint and return cleanly; a watchdog ends the process
``train.stop_timeout_s`` after the signal whatever blocks it.

Faults end a run with one-line errors, never a hang: a bad config value (:mod:`motionjax.config_checks`),
a second trainer on the same workdir (:func:`workdir_lock`), a failed write (:class:`StorageError`:
``No space left on device: PATH``; the previous checkpoints stay intact).

Process 0 writes the run directory: TensorBoard events, ``summary.json``, learning curves, a
held-out clip's skeleton (noisy / reconstructed / truth) and BVH exports of it.
"""
from __future__ import annotations

import contextlib
import copy
import faulthandler
import fcntl
import functools
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import PartitionSpec as P

from motionjax import artifacts, config_checks, evaluation, losses, models, parallel
from motionjax.data import pipeline as data
from motionjax.features import feature_dim


def best_metric(cfg: ml_collections.ConfigDict) -> str:
    """``train.best_metric`` of ``cfg`` (``config.train``): ``"SPLIT/METRIC"`` whose lowest value picks the
    best checkpoint (``validation/mpjpe``, never the test split). The ``config.json`` of runs made before
    the field existed lacks it; they chose by ``validation/mpjpe``."""
    return cfg.get("best_metric", "validation/mpjpe")


# ---------------------------------------------------------------------------------------------
# Optimizer, loss and step


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """adamw with linear warmup + cosine decay and global-norm clipping; ``cfg`` = ``config.train``.

    With ``grad_accum_steps = k > 1`` every optimizer update averages ``k`` micro-batches
    (``optax.MultiSteps``); ``steps`` counts micro-batches, so the schedule has ``steps // k``.
    """
    updates = max(cfg.steps // cfg.grad_accum_steps, 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, min(cfg.warmup_steps, updates - 1), updates,
        end_value=cfg.learning_rate * cfg.final_lr_fraction)
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))
    return optax.MultiSteps(tx, cfg.grad_accum_steps) if cfg.grad_accum_steps > 1 else tx


def make_loss_fn(config: ml_collections.ConfigDict, info, mesh):
    """``(pred, clean [B, N, C, F], offsets [B, J, 3] | None) -> (loss, terms)``, one ``shard_map``
    over the whole mesh: each device decodes and runs FK on its own frames (on its windows' clip
    offsets when given, ``data.bones = "clip"``); time derivatives exchange halo frames only."""
    loss = functools.partial(losses.reconstruction_loss, config.loss, info.skeleton, float(info.fps),
                             mean=np.asarray(info.mean, np.float32), std=np.asarray(info.std, np.float32),
                             time_axis_name=parallel.TIME_AXIS, batch_axis_name=parallel.DATA_AXIS)
    frames = P(parallel.DATA_AXIS, parallel.TIME_AXIS)  # [B, T, F]: windows over data, frames over time
    # Per-window offsets [B, J, 3] over data only (every time shard of a window needs all its bones);
    # None (an empty tree) matches any spec.
    sharded = jax.shard_map(lambda p, t, o: loss(p, t, offsets=o), mesh=mesh,
                            in_specs=(frames, frames, P(parallel.DATA_AXIS)), out_specs=P(), check_vma=False)

    def loss_fn(pred, clean, offsets=None):
        b, n, c, f = clean.shape
        return sharded(pred.reshape(b, n * c, f), clean.reshape(b, n * c, f), offsets)

    return loss_fn


def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def pure_train_step(graphdef, tx: optax.GradientTransformation, loss_fn, ema_decay: float = 0.0):
    """``step(state, batch) -> (state, metrics)`` for ``state`` from :func:`init_state`: the step's
    math, not jitted (:func:`jit_train_step` places it on the mesh; :func:`build_train_step` does both).
    ``ema_decay > 0``: ``state["ema"]`` follows the parameters as an exponential moving average."""

    def step(state, batch):
        def compute(params):
            # copy: fresh Variables at this trace level, so dropout may advance its RNG count here.
            model = nnx.merge(graphdef, params, state["rest"], copy=True)
            loss, terms = loss_fn(model(batch["noisy"]), batch["clean"], batch.get("offsets"))
            return loss, (terms, nnx.state(model, nnx.Not(nnx.Param)))  # rest: dropout RNG counts

        (loss, (terms, rest)), grads = jax.value_and_grad(compute, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "rest": rest}
        if ema_decay:
            new["ema"] = optax.incremental_update(new["params"], state["ema"], 1.0 - ema_decay)
        finite = jnp.isfinite(loss) & _all_finite(grads)
        # A non-finite step keeps every leaf of the old state, optimizer moments included.
        new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, {k: state[k] for k in new})
        new["nonfinite_total"] = state["nonfinite_total"] + (~finite).astype(jnp.int32)
        new["nonfinite_run"] = jnp.where(finite, 0, state["nonfinite_run"] + 1)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **terms,
                   "nonfinite_total": new["nonfinite_total"], "nonfinite_run": new["nonfinite_run"]}
        return new, metrics

    return step


def init_state(config: ml_collections.ConfigDict, info, mesh):
    """Model graph definitions (train and eval mode), the train state and its shardings."""
    model = models.make_model(config.model, feature_dim(info.skeleton), config.data.chunk,
                              nnx.Rngs(config.seed), mesh=mesh, info=info)
    model.eval()
    eval_graphdef = nnx.graphdef(model)
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(config.train)
    state = {"params": params, "rest": rest, "opt_state": tx.init(params),
             "nonfinite_total": jnp.int32(0), "nonfinite_run": jnp.int32(0)}
    if config.train.ema_decay:
        state["ema"] = jax.tree.map(jnp.copy, params)
    shardings = parallel.state_shardings(mesh, state, fsdp=config.mesh.fsdp)
    return (graphdef, eval_graphdef, model), tx, parallel.put(state, shardings), shardings


def build_train_step(config: ml_collections.ConfigDict, info, mesh):
    """``(step, state, shardings, eval_graphdef)``: the jitted step with the state's shardings in and
    out and the state donated (updated in place), batches ``[B, N, C, F]`` split over data x time."""
    (graphdef, eval_graphdef, _), tx, state, shardings = init_state(config, info, mesh)
    step = pure_train_step(graphdef, tx, make_loss_fn(config, info, mesh), config.train.ema_decay)
    step = jit_train_step(step, shardings, mesh)
    return step, state, shardings, eval_graphdef


def jit_train_step(step, shardings, mesh):
    """``jax.jit`` of a train step with the state's shardings in and out and the state donated;
    batch leaves ``[B, N, C, F]`` split over data x time, per-window ones (``offsets [B, J, 3]``)
    over data only. One jitted function per set of batch keys (called or ``.lower``-ed alike)."""
    window = parallel.window_sharding(mesh)
    per_window = parallel.per_window_sharding(mesh)

    @functools.cache
    def jitted(keys):
        batch = {k: per_window if k in data.PER_WINDOW else window for k in keys}
        return jax.jit(step, in_shardings=(shardings, batch), out_shardings=(shardings, None),
                       donate_argnums=0)

    class Step:
        def __call__(self, state, batch):
            return jitted(tuple(sorted(batch)))(state, batch)

        def lower(self, state, batch):
            return jitted(tuple(sorted(batch))).lower(state, batch)

    return Step()


def abstract_batch(config: ml_collections.ConfigDict, info, mesh) -> dict:
    """The batch the step is compiled for: ``noisy`` and ``clean`` as ``jax.ShapeDtypeStruct``
    ``[B, N, C, F]`` float32 with the window sharding, and with ``data.bones = "clip"`` ``offsets
    [B, J, 3]`` over data (nothing allocated)."""
    d = config.data
    shape = (d.batch_size, d.window // d.chunk, d.chunk, feature_dim(info.skeleton))
    window = parallel.window_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct(shape, np.float32, sharding=window) for k in ("noisy", "clean")}
    if d.bones == "clip":  # each window's clip offsets, over data only
        batch["offsets"] = jax.ShapeDtypeStruct((d.batch_size, info.skeleton.num_joints, 3), np.float32,
                                                sharding=parallel.per_window_sharding(mesh))
    return batch


def lower_train_step(config: ml_collections.ConfigDict, info, mesh):
    """``(lowered, state)``: :func:`build_train_step`'s step lowered for abstract inputs, shapes and
    shardings only (MaxText's ``train_compile``: any mesh size, nothing allocated); ``state`` is the
    abstract train state. ``lowered.compile()`` is the program the trainer runs."""
    built = {}

    def build():  # traced: the model's initialization runs abstractly
        built["step"], state, built["shardings"], _ = build_train_step(config, info, mesh)
        return state

    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         jax.eval_shape(build), built["shardings"])
    return built["step"].lower(state, abstract_batch(config, info, mesh)), state


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out windows


def _global(x, sharding):
    """A host numpy array (identical on every process) -> a global array with ``sharding``."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def evaluated_params(state):
    """The parameters evaluation and export use: the moving average when the run keeps one."""
    return state.get("ema", state["params"])


def make_predict(eval_graphdef, mesh, state_shardings):
    """``predict(state, x [B, N, C, F] numpy) -> numpy`` in eval mode (:func:`evaluated_params`);
    pads B to the data axis."""
    window = parallel.window_sharding(mesh)

    @functools.partial(jax.jit, in_shardings=(state_shardings["params"], state_shardings["rest"], window),
                       out_shardings=parallel.replicated(mesh))
    def apply(params, rest, x):
        return nnx.merge(eval_graphdef, params, rest)(x)

    def predict(state, x):
        b, pad = x.shape[0], -x.shape[0] % mesh.shape[parallel.DATA_AXIS]
        x = np.concatenate([x, np.repeat(x[-1:], pad, 0)]) if pad else x
        return np.asarray(apply(evaluated_params(state), state["rest"], _global(x, window)))[:b]

    return predict


def _eval_sets(config, info, splits):
    """``{(split, "clean"|"noisy"): [batches]}`` evaluation windows of ``splits``."""
    sets = {}
    for split in splits:
        for condition, level in (("clean", 0.0), ("noisy", config.train.eval_noise_level)):
            sets[split, condition] = list(data.make_eval_batches(config.data, info, split, level,
                                                                 seed=config.seed))
    return sets


# ---------------------------------------------------------------------------------------------
# Checkpoints


def make_checkpoint_manager(workdir: Path, cfg: ml_collections.ConfigDict) -> ocp.CheckpointManager:
    """Async manager keeping the last ``cfg.keep_checkpoints`` steps and the best by :func:`best_metric`."""
    metric = best_metric(cfg)
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
    _ignore_abandoned_reads()
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


def _ignore_abandoned_reads() -> None:
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
    import logging

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


def make_iterator(config: ml_collections.ConfigDict, info, mesh):
    """Training batches as global arrays on ``mesh``: the Grain pipeline, or (``data.loader =
    "naive"``, the baseline) numpy batches from the main thread placed on the mesh per step."""
    if config.data.loader == "grain":
        return data.make_train_iterator(config.data, info, sharding=parallel.window_sharding(mesh),
                                        seed=config.seed)
    if config.data.loader == "naive":
        window = parallel.window_sharding(mesh)  # offsets [B, J, 3] go over data only
        return (data.to_global(window, b) for b in data.make_naive_train_iterator(config.data, info,
                                                                                 seed=config.seed))
    raise ValueError(f"unknown data.loader {config.data.loader!r}; expected 'grain' or 'naive'")


# ---------------------------------------------------------------------------------------------
# Faults: one trainer per workdir, failed writes, signals


class WorkdirLockedError(RuntimeError):
    """Another live trainer holds the workdir; the message names it (pid, host, start time)."""


class StorageError(OSError):
    """A failed write of the run (a full disk, a lost mount): ``No space left on device: PATH``."""

    def __str__(self):
        return f"{self.strerror}: {self.filename}"


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_TS_PATH = re.compile(r'(?:Failed writing:|local file) "([^"]+)"')


def storage_error(e: BaseException, where) -> StorageError | None:
    """``e`` (or its cause) as a :class:`StorageError` when it is a file-system failure: an
    ``OSError`` with an errno, or orbax/TensorStore's error text with an ``os_error_code``."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StorageError):
            return e
        if isinstance(e, OSError) and e.errno:
            return StorageError(e.errno, os.strerror(e.errno), e.filename or str(where))
        code = _OS_ERROR_CODE.search(str(e))
        if code:
            paths = _TS_PATH.findall(str(e))
            number = int(code.group(1))
            return StorageError(number, os.strerror(number), paths[-1] if paths else str(where))
        e = e.__cause__ or e.__context__
    return None


LOCK_FILE = "trainer.lock"


@contextlib.contextmanager
def workdir_lock(workdir: Path):
    """Hold ``workdir/trainer.lock`` for the run, or raise :class:`WorkdirLockedError`.

    An ``flock`` on the file: the kernel drops it when its process ends, kill -9 included, so a lock
    left by a dead trainer is stale by construction (its pid/host, still in the file, is reported
    and taken over). The file holds the holder's pid, host and start time for the message.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(path)
        os.close(fd)
        raise WorkdirLockedError(
            f"workdir {workdir} is in use by another trainer ({holder}; lock file {path}): wait for it to "
            "end or stop it, or train in another --workdir") from None
    previous = _lock_holder(path)
    if previous:
        print(f"taking over the stale lock of a trainer that ended without releasing it ({previous})",
              flush=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # released cleanly: an empty file
        os.close(fd)


def _lock_holder(path: Path) -> str:
    try:
        h = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return ""
    return f"pid {h['pid']} on {h['host']}, started {h['started']}" if isinstance(h, dict) else ""


class EventWriter:
    """TensorBoard scalars written and flushed in the calling thread (tensorboardX's record format).

    tensorboardX's ``SummaryWriter`` hands events to a writer thread through a bounded queue: when
    that thread dies on a full disk, the next ``add_scalar`` blocks forever. Here a failed write
    raises ``OSError`` (naming the events file) where it happens.
    """

    def __init__(self, logdir: Path):
        from tensorboardX.event_file_writer import EventsWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(logdir / "events"))
        self.path = self._writer._file_name
        self._io(self._writer.flush)

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            raise StorageError(e.errno, os.strerror(e.errno), e.filename or self.path) from e

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto import event_pb2
        from tensorboardX.summary import scalar

        self._io(self._writer.write_event,
                 event_pb2.Event(wall_time=time.time(), step=int(step), summary=scalar(tag, value)))

    def flush(self) -> None:
        self._io(self._writer.flush)

    def close(self) -> None:
        self._io(self._writer.close)


def _exit_now(message: str, code: int) -> None:
    """Last resort of a run that cannot stop: every thread's stack, the reason, ``os._exit``."""
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(all_threads=True)
        print(f"error: {message}; exiting without a final checkpoint (the previous ones are intact)",
              file=sys.stderr, flush=True)
    os._exit(code)


def _watchdog(seconds: float, message: str, code: int) -> threading.Timer:
    timer = threading.Timer(seconds, _exit_now, (message, code))
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def _stop_on_signals(timeout_s: float):
    """Yields a dict whose ``"signal"`` is set by SIGTERM/SIGINT (checked between steps).

    The first signal also arms a watchdog: when the run has not ended ``timeout_s`` later (a write
    blocked on a dead disk, a hung collective) the process exits with ``128 + signal``; a second
    SIGINT (Ctrl-C twice) exits at once. Leaving the context disarms it.
    """
    stop = {"signal": None, "watchdog": None}
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, _):
        name = signal.Signals(signum).name
        if stop["signal"] is None:
            stop["signal"] = name
            message = f"{name}: the run did not stop within train.stop_timeout_s={timeout_s:g} s"
            stop["watchdog"] = _watchdog(timeout_s, message, 128 + signum)
        elif signum == signal.SIGINT:
            _exit_now("a second SIGINT", 128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if stop["watchdog"] is not None:
            stop["watchdog"].cancel()


def _quietly(fn, *args) -> None:
    """Cleanup after a failure: the first error is the one to report."""
    if fn is not None:
        with contextlib.suppress(Exception):
            fn(*args)


# ---------------------------------------------------------------------------------------------
# The loop's bookkeeping: time, the non-finite guard, metric logs


class Chrono:
    """Where a run's time goes (big_vision's ``chrono``): the first step's compile, then training time
    with pauses (evaluation, checkpoints) left out, and how much of it was spent waiting for data.
    Throughput counts the steps after the compiling one (``steps``, incremented by the loop)."""

    def __init__(self, frames_per_step: int):
        self.frames_per_step = frames_per_step
        self.compile_s: float | None = None
        self.steps = 0
        self.data_wait_s = self.paused_s = self.eval_s = self.checkpoint_s = 0.0
        self._t0 = time.perf_counter()

    @contextlib.contextmanager
    def data_wait(self):
        t = time.perf_counter()
        yield
        self.data_wait_s += time.perf_counter() - t

    @contextlib.contextmanager
    def compiling(self):
        """The first step (compile + run): training time and data waits count from its end."""
        t = time.perf_counter()
        yield
        self._t0 = time.perf_counter()
        self.compile_s, self.data_wait_s = self._t0 - t, 0.0

    @contextlib.contextmanager
    def paused(self, kind: str):
        """Time outside training: ``kind`` is ``"eval"`` or ``"checkpoint"``."""
        t = time.perf_counter()
        yield
        seconds = time.perf_counter() - t
        self.paused_s += seconds
        setattr(self, f"{kind}_s", getattr(self, f"{kind}_s") + seconds)

    def train_s(self) -> float:
        return max(time.perf_counter() - self._t0 - self.paused_s, 1e-9)

    def frames_per_s(self) -> float:
        return self.steps * self.frames_per_step / self.train_s()

    def data_wait_fraction(self) -> float:
        return self.data_wait_s / self.train_s()

    def so_far(self) -> dict:
        """Seconds so far (``on_eval``'s ``timing``)."""
        return {"compile_s": self.compile_s or 0.0, "train_s": self.train_s(), "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "data_wait_s": self.data_wait_s}

    def summary(self) -> dict:
        """The run's timings and rates (``summary.json``)."""
        elapsed = self.train_s()
        return {"compile_s": self.compile_s, "train_s": elapsed, "steps_per_s": self.steps / elapsed,
                "frames_per_s": self.steps * self.frames_per_step / elapsed,
                "data_wait_fraction": self.data_wait_s / elapsed, "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "data_wait_s": self.data_wait_s}


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


class MetricLog:
    """``log(step, values, prefix)``: each value appended to ``history[prefix/key]`` (saved with every
    checkpoint, so a resumed run keeps its whole curve) and, given a ``writer`` (process 0), written
    to TensorBoard and flushed."""

    def __init__(self, history: dict, writer: EventWriter | None):
        self.history, self.writer = history, writer

    def __call__(self, step: int, values: dict, prefix: str) -> None:
        for k, v in values.items():
            self.history.setdefault(f"{prefix}/{k}", []).append((step, float(v)))
            if self.writer:
                self.writer.add_scalar(f"{prefix}/{k}", float(v), step)
        if self.writer:
            self.writer.flush()


# ---------------------------------------------------------------------------------------------
# The run


def train_and_evaluate(config: ml_collections.ConfigDict, workdir, on_eval=None) -> dict:
    """Train ``config`` in ``workdir`` (resuming from its checkpoints), evaluate, write artefacts.

    Safe under several processes: every process runs the same steps and saves its checkpoint
    shards; process 0 alone holds the workdir lock, logs, plots and writes ``summary.json``.
    ``on_eval(step, metrics, timing) -> bool``, if given, runs after each evaluation (and its
    checkpoint) with the validation metrics and the seconds so far (``compile_s``, ``train_s``,
    ``eval_s``, ``checkpoint_s``, ``data_wait_s``); True ends training there, evaluated as a finished
    run (``status`` "stopped by on_eval"): a stop at a target accuracy or a time budget.
    Returns the summary dict. Raises :class:`config_checks.ConfigError`, :class:`WorkdirLockedError`,
    :class:`StorageError` (a failed write, after closing the checkpoint manager and the data
    iterator within ``train.stop_timeout_s``) or :class:`CheckpointError`.
    """
    config_checks.check_config(config, jax.device_count(), jax.process_count())
    workdir = Path(workdir)
    lock = workdir_lock(workdir) if parallel.is_main_process() else contextlib.nullcontext()
    with lock, _stop_on_signals(config.train.stop_timeout_s) as stop, contextlib.ExitStack() as cleanup:
        try:
            summary = _train_and_evaluate(config, workdir, stop, cleanup, on_eval)
        except Exception as e:
            error = storage_error(e, workdir)
            if error is None:
                raise
            # Close what is open (orbax's writer threads, the data iterator) but never hang on it.
            _ignore_abandoned_reads()
            watchdog = _watchdog(config.train.stop_timeout_s, f"{error} (cleanup blocked)", 1)
            cleanup.close()
            watchdog.cancel()
            raise error from e
        cleanup.pop_all()  # closed on the way out already
        return summary


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: Path, stop: dict,
                        cleanup: contextlib.ExitStack, on_eval=None) -> dict:
    main = parallel.is_main_process()
    cfg = config.train
    if cfg.retain_host_memory:
        parallel.retain_host_memory()
    mesh = parallel.make_mesh(config.mesh)
    info = data.dataset_info(config.data)  # prepares the dataset on first use
    config_checks.check_data(config, info)
    train_step, state, shardings, eval_graphdef = build_train_step(config, info, mesh)
    predict = make_predict(eval_graphdef, mesh, shardings)
    iterator = make_iterator(config, info, mesh)
    cleanup.callback(_quietly, getattr(iterator, "close", None))
    eval_sets = _eval_sets(config, info, config.train.eval_splits)  # during training: model selection

    mngr = make_checkpoint_manager(workdir, cfg)
    cleanup.callback(_quietly, mngr.close)
    start, state, history = restore_latest(mngr, workdir, state, iterator)
    if start is None:
        start = 0
        save_checkpoint(mngr, 0, state, iterator, history)  # the first "last good" state for the NaN guard

    writer = None
    if main:
        workdir.mkdir(parents=True, exist_ok=True)
        writer = EventWriter(workdir / "tensorboard")  # writes in this thread: a full disk raises here
        cleanup.callback(_quietly, writer.close)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    log = MetricLog(history, writer)
    guard = NonfiniteGuard(mngr, cfg.max_nonfinite_steps, start, verbose=main)
    chrono = Chrono(frames_per_step=config.data.batch_size * config.data.window)
    metric = best_metric(cfg)

    def run_eval(step):
        """Held-out metrics from clean input (the learning curves and the best checkpoint)."""
        out = {}
        for (split, condition), batches in eval_sets.items():
            if condition == "clean":
                m = evaluation.evaluate(functools.partial(predict, state), batches, info.skeleton,
                                        float(info.fps), info.mean, info.std, config.loss.contact_speed)
                out.update({f"{split}/{k}": v for k, v in m.items() if not k.startswith("input_")})
        log(step, out, "eval")
        return out

    bar = None
    if main:
        from tqdm import tqdm
        bar = tqdm(total=cfg.steps, initial=start, desc=workdir.name, dynamic_ncols=True, smoothing=0.1)
        cleanup.callback(_quietly, bar.close)

    def read(pending):
        """``(step, metrics)`` of a dispatched step, logged (read one step late, so the device always
        has a step queued)."""
        done_step, m, _ = pending
        m = jax.device_get(m)
        if done_step % cfg.log_every == 0 or done_step == cfg.steps:
            log(done_step, {k: v for k, v in m.items() if k != "nonfinite_run"}, "train")
        if bar:
            bar.set_postfix(loss=f"{float(m['loss']):.4f}", fps=f"{chrono.frames_per_s():.0f}",
                            wait=f"{100 * chrono.data_wait_fraction():.0f}%",
                            skipped=int(m["nonfinite_total"]), refresh=False)
        return done_step, m

    # SIGTERM/SIGINT (train_and_evaluate's handler) end the loop at the next step.
    pending, step = None, start
    stopped_early = False  # on_eval said stop (a target reached or a budget spent)
    while step < cfg.steps and stop["signal"] is None and not stopped_early:
        with chrono.data_wait():
            batch = next(iterator)
        inputs = {k: batch[k] for k in ("noisy", "clean", "offsets") if k in batch}
        if chrono.compile_s is None:
            with chrono.compiling():
                state, metrics = train_step(state, inputs)
                jax.block_until_ready(metrics)
        else:
            state, metrics = train_step(state, inputs)
            chrono.steps += 1
        step += 1
        if pending is not None:
            state = guard(*read(pending), state, dispatched=step)
        # The batch lives until its step has run: on XLA:CPU, freeing an array whose transfer
        # or use is still queued blocks the host until the device gets there.
        pending = (step, metrics, batch)
        if bar:
            bar.update(1)
        eval_now = step % cfg.eval_every == 0 or step == cfg.steps
        if eval_now or step % cfg.checkpoint_every == 0:
            state, pending = guard(*read(pending), state, dispatched=step), None
            with chrono.paused("eval"):
                held_out = run_eval(step) if eval_now else None
            with chrono.paused("checkpoint"):
                save_checkpoint(mngr, step, state, iterator, history,
                                {metric: held_out[metric]} if held_out else None)
            if held_out and on_eval is not None:
                stopped_early = bool(on_eval(step, held_out, chrono.so_far()))
    if pending is not None:
        state = guard(*read(pending), state, dispatched=step)
    timing, interrupted = chrono.summary(), stop["signal"]
    if interrupted and mngr.latest_step() != step:
        save_checkpoint(mngr, step, state, iterator, history)
    mngr.wait_until_finished()
    if hasattr(iterator, "close"):
        iterator.close()
    if bar:
        bar.close()

    summary = {
        "workdir": str(workdir), "steps": step,
        "status": (f"stopped by {interrupted}" if interrupted
                   else "stopped by on_eval" if stopped_early else "done"),
        **timing,
        "nonfinite_steps": int(jax.device_get(state["nonfinite_total"])),
        "nonfinite_restores": guard.restores,
        "params": int(sum(x.size for x in jax.tree.leaves(state["params"]))),
    }
    if not interrupted:
        # Every split once at the end, the test split included (it chose nothing).
        final_sets = _eval_sets(config, info, config.train.final_splits)
        summary["results"] = final_evaluation(config, info, state, predict, final_sets, workdir, main)
        summary["best_step"] = mngr.best_step()  # by train.best_metric among the checkpoints on disk (kept)
    summary["history"] = history
    mngr.close()
    if main:
        artifacts.plot_learning_curves(
            {k: v for k, v in history.items() if k in ("train/loss", "train/position") or
             (k.startswith("eval/") and k.endswith("/mpjpe"))}, workdir / "learning_curves.png")
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        writer.close()
    return summary


def final_evaluation(config, info, state, predict, eval_sets, workdir: Path, main: bool) -> dict:
    """Held-out metrics of the model and of the per-frame PCA reference with the model's latent size,
    on every split from clean and noised input; plus the skeleton figure and BVH exports."""
    args = (info.skeleton, float(info.fps), info.mean, info.std, config.loss.contact_speed)
    # The PCA reference is fitted on every frame of the training split.
    f = info.feature_dim
    frames = np.concatenate([b["clean"].reshape(-1, f)[b["valid"].reshape(-1) > 0]
                             for b in data.make_eval_batches(config.data, info, info.train_split)])
    latent = config.model.latent_dim / config.model.stride  # the model's latent_per_frame, either model
    pca = evaluation.PCA(frames, max(int(round(latent)), 1))
    labels = getattr(info, "labels", None) or None
    results = {}
    for (split, condition), batches in eval_sets.items():
        # The model's row also breaks MPJPE down per label (content, style) where clips have labels.
        row = {"model": evaluation.evaluate(functools.partial(predict, state), batches, *args, labels=labels),
               "pca": evaluation.evaluate(pca, batches, *args)}
        row["input"] = {k: row["model"].pop(f"input_{k}") for k in evaluation.INPUT_METRICS}
        for k in evaluation.INPUT_METRICS:
            row["pca"].pop(f"input_{k}")
        row["input_mpjpe"], row["input_mpjpe_global"] = row["input"]["mpjpe"], row["input"]["mpjpe_global"]
        results.setdefault(split, {})[condition] = row
        if main and row["model"].get("by_label"):
            artifacts.plot_label_breakdown(row["model"]["by_label"],
                                            workdir / f"by_label_{split}_{condition}.png",
                                            title=f"{split}, {condition} input:")
    results["pca_latent_per_frame"] = pca.basis.shape[1]
    # A residual model also sees its input through the skip path: PCA then matches its bottleneck only.
    results["model_residual"] = bool(config.model.residual)
    splits = config.train.final_splits
    split = "test" if "test" in splits else splits[-1]
    batch = eval_sets[split, "noisy"][0]
    # Every process joins the prediction (one program over all devices); process 0 alone draws.
    reconstructed = predict(state, batch["noisy"][: batch["clean"].shape[0]])
    if main:
        pick = lambda x: np.asarray(x)[:1].reshape(-1, info.mean.shape[-1])  # first window -> [T, F]
        clip = {"noisy": pick(batch["noisy"]), "reconstructed": pick(reconstructed),
                "truth": pick(batch["clean"])}
        artifacts.plot_skeletons(
            info.skeleton, {k: evaluation.feature_positions(info.skeleton, v, info.mean, info.std)
                            for k, v in clip.items()},
            workdir / "heldout_clip.png", title=f"{split}, noise level {config.train.eval_noise_level}")
        for name, features in clip.items():
            artifacts.export_bvh(workdir / f"heldout_{name}.bvh", info.skeleton, float(info.fps), features,
                                  info.mean, info.std, name=name)
    return results


# ---------------------------------------------------------------------------------------------
# The experiment: the model plus its references, side by side


def run_experiment(config: ml_collections.ConfigDict, workdir) -> dict:
    """:func:`train_and_evaluate`, then (``train.references``) the same model without the dynamics
    loss in ``workdir/no_dynamics``; prints and saves the comparison table in ``summary.json``."""
    workdir = Path(workdir)
    summary = train_and_evaluate(config, workdir)
    if "results" not in summary:
        return summary
    if "no_dynamics" in config.train.references and config.loss.dynamics_weight > 0:
        ablation = copy.deepcopy(config)
        with ablation.unlocked():
            ablation.loss.dynamics_weight = 0.0
            ablation.train.references = ()
        ref = train_and_evaluate(ablation, workdir / "no_dynamics")
        for split, rows in ref.get("results", {}).items():
            if isinstance(rows, dict):
                for condition, row in rows.items():
                    summary["results"][split][condition]["no_dynamics"] = row["model"]
    table = results_table(summary["results"])
    table.append(f"PCA latent: {summary['results']['pca_latent_per_frame']} numbers per frame = the model's "
                 "bottleneck" + (" (the model also has a residual skip from its input)"
                                 if summary["results"]["model_residual"] else ""))
    if summary["steps_per_s"]:  # a run resumed at its last step trains nothing in this session
        speed = (summary["steps_per_s"], summary["frames_per_s"], 100 * summary["data_wait_fraction"])
        table.append("speed: {:.2f} steps/s, {:.0f} frames/s, data wait {:.1f}%".format(*speed))
    summary["table"] = table
    if parallel.is_main_process():
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        print("\n".join(table), flush=True)
    return summary


def results_table(results: dict) -> list[str]:
    """Text table: one line per split x input x method. MPJPE is root-relative (Human3.6M protocol
    #1); global MPJPE adds the root trajectory's error (see :mod:`motionjax.evaluation`)."""
    lines = [f"{'split':14s} {'input':6s} {'method':12s} {'MPJPE cm':>9s} {'global cm':>9s} {'PA-MPJPE':>9s} "
             f"{'accel m/s2':>10s} {'jitter m/s3':>11s} {'skate cm/s':>10s} {'bone cm':>8s}"]
    for split, rows in results.items():
        if not isinstance(rows, dict):
            continue
        for condition, row in rows.items():
            # The input row: the (noisy) input's own error, 0 for clean input.
            for method in ("input", "model", "no_dynamics", "pca"):
                m = row.get(method)
                if m is None and method == "input":  # results written before the input had every metric
                    lines.append(f"{split:14s} {condition:6s} {'input':12s} {row['input_mpjpe']:9.2f} "
                                 f"{row['input_mpjpe_global']:9.2f}")
                if m is not None:
                    lines.append(f"{split:14s} {condition:6s} {method:12s} {m['mpjpe']:9.2f} "
                                 f"{m['mpjpe_global']:9.2f} {m['pa_mpjpe']:9.2f} {m['accel']:10.2f} "
                                 f"{m.get('jitter', float('nan')):11.1f} {m['foot_skate']:10.2f} "
                                 f"{m.get('bone_error', float('nan')):8.3f}")
    return lines
