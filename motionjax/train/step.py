"""The train step: the optimizer, the loss over the mesh, one jitted sharded update, and prediction.

One jitted step (in/out shardings from :mod:`motionjax.parallel`, the train state donated) runs the
model on the loader's input window, the loss of :mod:`motionjax.losses` against the clean window
(padding frames weighted out by ``valid``), and an optax update (adamw, warmup + cosine, global-norm
clipping, optional ``optax.MultiSteps`` accumulation). A step whose loss or gradients are not finite
leaves the state untouched and is counted (the loop's :class:`~motionjax.train.checkpoints.NonfiniteGuard`
decides when to restore). :func:`lower_train_step` compiles the same step for abstract inputs.
"""
from __future__ import annotations

import contextlib
import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from motionjax import losses, models, parallel
from motionjax.core.features import feature_dim
from motionjax.data import feed, transforms
from motionjax.train import grad_reduce


def batch_keys(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The batch leaves the step reads (and the loader puts on the mesh): the input window, the target,
    their ``valid`` mask, with ``data.bones = "clip"`` each window's clip ``offsets``, and with
    loss-aware sampling each window's training ``segment`` (the step passes it by; the loop reads it)."""
    return feed.batch_keys(config.data)


OPTIMIZERS = ("adamw", "lion", "muon", "schedule_free")


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """``cfg.optimizer`` with linear warmup + cosine decay and global-norm clipping; ``cfg`` =
    ``config.train``. ``"adamw"``; ``"lion"`` (``optax.lion``, sign updates: its peak learning rate is
    usually 3-10x below adamw's); ``"muon"`` (``optax.contrib.muon``: orthogonalized momentum for every
    weight of rank ≥ 2 (:func:`muon_dimensions`) at AdamW's update RMS, adam for biases and norms),
    each with decoupled ``weight_decay``;
    ``"schedule_free"`` (``optax.contrib.schedule_free_adamw``: the same linear warmup, then a
    constant peak rate, no cosine: it averages its iterates instead, and evaluation reads that
    average, :func:`evaluated_params`).

    With ``grad_accum_steps = k > 1`` every optimizer update averages ``k`` micro-batches
    (``optax.MultiSteps``); ``steps`` counts micro-batches, so the schedule has ``steps // k``.
    """
    updates = max(cfg.steps // cfg.grad_accum_steps, 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, min(cfg.warmup_steps, updates - 1), updates,
        end_value=cfg.learning_rate * cfg.final_lr_fraction)
    if cfg.optimizer == "schedule_free":
        update = optax.contrib.schedule_free_adamw(cfg.learning_rate,
                                                   warmup_steps=min(cfg.warmup_steps, updates - 1), b1=cfg.b1,
                                                   b2=cfg.b2, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "lion":
        update = optax.lion(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "muon":
        # consistent_rms = 0.2 scales each orthogonalized update to AdamW's typical RMS
        # (arXiv 2502.16982), so the config's AdamW rate and weight decay carry over unchanged.
        update = optax.contrib.muon(schedule, adam_b1=cfg.b1, adam_b2=cfg.b2, weight_decay=cfg.weight_decay,
                                    adam_weight_decay=cfg.weight_decay, consistent_rms=0.2,
                                    muon_weight_dimension_numbers=muon_dimensions)
    else:
        update = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), update)
    return optax.MultiSteps(tx, cfg.grad_accum_steps) if cfg.grad_accum_steps > 1 else tx


def muon_dimensions(params):
    """Muon's matrix view of each parameter: every weight of rank ≥ 2 as one ``[fan-in, fan-out]``
    matrix (Flax kernels are ``[..., in, out]``: a convolution's taps join its inputs, where optax's
    default would hand 4-D conv kernels, most of the model, to adam); ``None`` (adam) for biases and
    norm scales."""
    return jax.tree.map(lambda x: optax.contrib.MuonDimensionNumbers(tuple(range(x.ndim - 1)), x.ndim - 1)
                        if x.ndim >= 2 else None, params)


def make_loss_fn(config: ml_collections.ConfigDict, info, mesh):
    """``(pred, clean [B, N, C, F], offsets [B, J, 3] | None, valid [B, N, C, 1] | None) -> (loss,
    terms)``, one ``shard_map`` over the whole mesh: each device decodes and runs FK on its own frames
    (on its windows' clip offsets when given, ``data.bones = "clip"``); time derivatives exchange halo
    frames only; frames with ``valid = 0`` (padding) count in no term. Forecasting (``data.observed``):
    only the predicted frames and the seam before them count
    (:func:`~motionjax.data.transforms.forecast_frames`)."""
    loss = functools.partial(losses.reconstruction_loss, config.loss, info.skeleton, float(info.fps),
                             mean=np.asarray(info.mean, np.float32), std=np.asarray(info.std, np.float32),
                             time_axis_name=parallel.TIME_AXIS, batch_axis_name=parallel.DATA_AXIS)
    frames = P(parallel.DATA_AXIS, parallel.TIME_AXIS)  # [B, T, F]: windows over data, frames over time
    # Loss-aware sampling ranks windows by their own error: [B] out, over data.
    per_window = uses_window_errors(config)
    # Per-window offsets [B, J, 3] over data only (every time shard of a window needs all its bones);
    # None (an empty tree) matches any spec.
    local = lambda p, t, o, v: loss(p, t, offsets=o, valid=v, per_window=per_window)  # noqa: E731
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(frames, frames, P(parallel.DATA_AXIS), frames),
                            out_specs=(P(), P(), P(parallel.DATA_AXIS)) if per_window else P(),
                            check_vma=False)

    observed = config.data.observed

    def loss_fn(pred, clean, offsets=None, valid=None):
        b, n, c, f = clean.shape
        valid = None if valid is None else valid.reshape(b, n * c)
        if observed:  # forecasting: the predicted frames and the seam (transforms.forecast_frames)
            scored = jnp.asarray(transforms.forecast_frames(n * c, observed, seam=True))
            valid = jnp.broadcast_to(scored, (b, n * c)) if valid is None else valid * scored
        # Inside the step's own shard_map (an explicit gradient reduction) the arrays are already local.
        run = local if parallel.manual_axes() else sharded
        out = run(pred.reshape(b, n * c, f), clean.reshape(b, n * c, f), offsets, valid)
        if per_window:  # the step's metrics carry it to the loop (train.loop._read), which takes it out
            loss, terms, window = out
            return loss, dict(terms, window_pose=window)
        return out

    return loss_fn


def uses_window_errors(config: ml_collections.ConfigDict) -> bool:
    """Whether the step returns each window's error (``metrics["window_pose"] [B]``) and the batch
    names each window's segment (``"segment" [B]``): loss-aware sampling (``data.loss_sampling``)."""
    return config.data.loss_sampling > 0


def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def reconstruction_objective(loss_fn):
    """The trainer's objective: ``(pred, batch) -> (loss, terms)``, the loss of the prediction against
    ``batch["clean"]`` on the batch's bones and real frames."""
    return lambda pred, batch: loss_fn(pred, batch["clean"], batch.get("offsets"), batch.get("valid"))


def accumulate(loss_and_grads, k: int):
    """``loss_and_grads(params, rest, batch) -> ((loss, (terms, rest)), grads)`` over ``k`` equal
    slices of the batch's leading axis, one after another (one slice's activations live at a time),
    the gradients summed before anything reduces them: inside the explicit reduction's ``shard_map``
    (:mod:`~motionjax.train.grad_reduce`), each device sums its own slices and the step reduces once
    whatever ``k`` (``optax.MultiSteps`` reduces every micro-batch). The first ``k - 1`` slices run in
    a ``lax.scan``; the last is peeled out of it, so its backward pass is what the reduction's buckets
    can overlap. Loss, terms and gradients are the slices' means: the whole batch's when every slice
    has as many real frames (each slice's loss is its own masked mean)."""

    def f(params, rest, batch):
        slices = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)

        def body(carry, piece):
            rest, total = carry
            (loss, (terms, rest)), grads = loss_and_grads(params, rest, piece)
            return (rest, jax.tree.map(jnp.add, total, grads)), (loss, terms)

        zero = jax.tree.map(jnp.zeros_like, params)
        head, last = jax.tree.map(lambda x: x[:-1], slices), jax.tree.map(lambda x: x[-1], slices)
        (rest, total), (losses, terms) = jax.lax.scan(body, (rest, zero), head)
        (loss, (last_terms, rest)), grads = loss_and_grads(params, rest, last)
        mean = lambda head, last: (jnp.sum(head, 0) + last) / k  # noqa: E731
        return ((mean(losses, loss), (jax.tree.map(mean, terms, last_terms), rest)),
                jax.tree.map(lambda t, g: (t + g) / k, total, grads))

    return f


def pure_train_step(graphdef, tx: optax.GradientTransformation, loss_fn, ema_decay: float = 0.0,
                    objective=None, reduction=None, micro_batches: int = 1):
    """``step(state, batch) -> (state, metrics)`` for ``state`` from :func:`init_state`: the step's
    math, not jitted (:func:`jit_train_step` places it on the mesh; :func:`build_train_step` does both).
    ``ema_decay > 0``: ``state["ema"]`` follows the parameters as an exponential moving average.
    ``objective(pred, batch) -> (loss, terms)``: what the step minimizes (a hook for other targets,
    e.g. distillation); default :func:`reconstruction_objective` of ``loss_fn``.
    ``reduction(loss_and_grads) -> f(params, rest, batch, residual) -> ((loss, aux), grads, residual)``
    sums the gradient over ``data`` itself (:func:`motionjax.train.grad_reduce.value_and_grad`, with
    ``state["grad_residual"]``); ``None``: XLA's all-reduce of the sharded step.
    ``micro_batches > 1``: :func:`accumulate` (with an explicit ``reduction``, which it runs inside)."""
    objective = objective or reconstruction_objective(loss_fn)
    if micro_batches > 1 and reduction is None:
        raise ValueError("micro_batches > 1 needs an explicit reduction (XLA's would all-reduce every slice)")

    def loss_and_grads(params, rest, batch):
        def compute(params):
            # copy: fresh Variables at this trace level, so dropout may advance its RNG count here.
            model = nnx.merge(graphdef, params, rest, copy=True)
            loss, terms = objective(model(batch["noisy"]), batch)
            return loss, (terms, nnx.state(model, nnx.Not(nnx.Param)))  # rest: dropout RNG counts

        return jax.value_and_grad(compute, has_aux=True)(params)

    if reduction is None:
        gradient = lambda params, rest, batch, residual: (*loss_and_grads(params, rest, batch), residual)  # noqa: E731
    else:
        per_device = loss_and_grads if micro_batches == 1 else accumulate(loss_and_grads, micro_batches)
        gradient = reduction(per_device)

    def step(state, batch):
        (loss, (terms, rest)), grads, residual = gradient(state["params"], state["rest"], batch,
                                                          state.get("grad_residual"))
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "rest": rest}
        if "grad_residual" in state:
            new["grad_residual"] = residual  # kept, like every leaf, when the step is not finite
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


def init_state(config: ml_collections.ConfigDict, info, mesh, model: nnx.Module | None = None,
               tx: optax.GradientTransformation | None = None):
    """Model graph definitions (train and eval mode), the optimizer, the train state and its
    shardings: a fresh model of ``config.model`` (or ``model``, e.g. a pruned or a student one) and
    :func:`make_optimizer` (or ``tx``)."""
    if model is None:
        model = models.make_model(config.model, feature_dim(info.skeleton), config.data.chunk,
                                  nnx.Rngs(config.seed), mesh=mesh, info=info, observed=config.data.observed)
    else:
        model = nnx.clone(model)  # its train/eval mode is the caller's
    eval_graphdef = nnx.graphdef(model)
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = tx or make_optimizer(config.train)
    state = {"params": params, "rest": rest, "opt_state": tx.init(params),
             "nonfinite_total": jnp.int32(0), "nonfinite_run": jnp.int32(0)}
    if config.train.ema_decay:
        state["ema"] = jax.tree.map(jnp.copy, params)
    residual = grad_reduce.init_residual(grad_reduce.make_plan(config.train, mesh, params))
    if residual:
        state["grad_residual"] = residual
    shardings = parallel.state_shardings(mesh, state, fsdp=config.mesh.fsdp)
    if residual:
        shardings["grad_residual"] = grad_reduce.residual_shardings(mesh, residual)
    return (graphdef, eval_graphdef, model), tx, parallel.put(state, shardings), shardings


def gradient_reduction(config: ml_collections.ConfigDict, mesh, params):
    """``pure_train_step``'s ``reduction`` for ``config.train.grad_reduce*`` (None: XLA's fp32
    all-reduce) and the :class:`~motionjax.train.grad_reduce.Plan` it follows."""
    plan = grad_reduce.make_plan(config.train, mesh, params)
    if not plan.explicit:
        return None, plan
    specs = {k: parallel.logical_to_mesh(names) for k, names in parallel.BATCH_AXES.items()}
    return (lambda loss_and_grads: grad_reduce.value_and_grad(loss_and_grads, plan, mesh, specs)), plan


def build_train_step(config: ml_collections.ConfigDict, info, mesh):
    """``(step, state, shardings, eval_graphdef)``: the jitted step with the state's shardings in and
    out and the state donated (updated in place), batches ``[B, N, C, F]`` split over data x time."""
    (graphdef, eval_graphdef, _), tx, state, shardings = init_state(config, info, mesh)
    reduction, _ = gradient_reduction(config, mesh, state["params"])
    step = pure_train_step(graphdef, tx, make_loss_fn(config, info, mesh), config.train.ema_decay,
                           reduction=reduction, micro_batches=config.train.micro_batches)
    step = jit_train_step(step, shardings, mesh)
    return step, state, shardings, eval_graphdef


def jit_train_step(step, shardings, mesh):
    """``jax.jit`` of a train step with the state's shardings in and out and the state donated;
    batch leaves as :data:`motionjax.parallel.BATCH_AXES` lays them out. One jitted function per set
    of batch keys (called or ``.lower``-ed alike)."""

    @functools.cache
    def jitted(keys):
        return jax.jit(step, in_shardings=(shardings, parallel.batch_shardings(mesh, keys)),
                       out_shardings=(shardings, None), donate_argnums=0)

    class Step:
        def __call__(self, state, batch):
            return jitted(tuple(sorted(batch)))(state, batch)

        def lower(self, state, batch):
            return jitted(tuple(sorted(batch))).lower(state, batch)

        def fed(self, feed):
            """:class:`FedStep`: this step with ``feed``'s input program traced into it."""
            return FedStep(step, shardings, mesh, feed)

    return Step()


class FedStep:
    """``fed(state) -> (state, metrics, inputs)``: one jitted program per step that draws and augments the
    batch (``feed.draw``, :class:`motionjax.data.feed.Feed`) and runs the train step on it: the input's
    device time is part of the step's, with no program, transfer or host scalar of its own. The step
    counter the batch is drawn for lives on the device (donated, returned plus one); the host only
    mirrors it (``feed.served``) and puts it there again when the feed moved (a restore). Batches are
    the feed's own (``draw(step, *feed.inputs())``), so resume and process counts behave as the feed's.
    With loss-aware sampling ``metrics["segment"] [B]`` names each window's segment.

    Where the feed can draw ahead (``feed.lookahead``: no loss-aware sampling; Grain's spans taken a
    step ahead on the streamed tier, its saved position the step's, :meth:`Feed.inputs`) the
    program is pipelined one batch deep: step ``k`` trains on batch ``k``, which step ``k - 1``'s
    program drew and left on the device (donated), and draws batch ``k + 1`` beside it. Nothing of
    step ``k``'s model waits for that draw, so its chain of small ops runs on threads the model leaves
    idle rather than before the model's first op, with every thread waiting on it. The first step
    after a start or a restore takes its batch from the feed's own program (:meth:`Feed.batch_at`)."""

    def __init__(self, step, shardings, mesh, feed):
        self.feed, self.counter, self._at, self.batch = feed, None, None, None
        self._replicated = parallel.replicated(mesh)
        self.lookahead = bool(getattr(feed, "lookahead", False))

        def fused(state, counter, *inputs):
            batch = feed.draw(counter, *inputs)
            state, metrics = step(state, batch)
            if "segment" in batch:
                metrics["segment"] = batch["segment"]
            return state, metrics, counter + 1

        def pipelined(state, counter, batch, *inputs):
            state, metrics = step(state, batch)
            return state, metrics, counter + 1, feed.draw(counter + 1, *inputs)

        # Inputs keep the shardings they were placed with (replicated tables, spans over data).
        if self.lookahead:
            self._jitted = jax.jit(pipelined, out_shardings=(shardings, None, self._replicated, None),
                                   donate_argnums=(0, 1, 2))
        else:
            self._jitted = jax.jit(fused, out_shardings=(shardings, None, self._replicated),
                                   donate_argnums=(0, 1))

    def _counter(self):
        # First call, or the feed was set to another step: the counter (and, pipelined, that step's
        # batch) put on the device again.
        if self._at != self.feed.served:
            self.counter = parallel.put(np.int32(self.feed.served), self._replicated)
            if self.lookahead:
                self.batch = self.feed.batch_at(self.feed.served)
        return self.counter

    def __call__(self, state, wait=contextlib.nullcontext):
        """One step; ``wait()``: a context timing the host's wait for the feed's inputs (Grain's
        next spans; nothing to wait for when the corpus is resident). ``inputs``: what the step
        read, to keep until it has run (XLA:CPU blocks the host when an input still in use is freed)."""
        counter = self._counter()
        with wait():
            inputs = self.feed.inputs(ahead=True) if self.lookahead else self.feed.inputs()
        if self.lookahead:
            state, metrics, self.counter, self.batch = self._jitted(state, counter, self.batch, *inputs)
        else:
            state, metrics, self.counter = self._jitted(state, counter, *inputs)
        self._at = self.feed.served
        return state, metrics, inputs


def abstract_batch(config: ml_collections.ConfigDict, info, mesh) -> dict:
    """The batch the step is compiled for (:func:`batch_keys`), ``jax.ShapeDtypeStruct`` float32 leaves
    with their shardings: ``noisy``, ``clean [B, N, C, F]``, ``valid [B, N, C, 1]``, ``offsets [B, J,
    3]`` (nothing allocated)."""
    d = config.data
    window = (d.batch_size, d.window // d.chunk, d.chunk)
    shapes = {"noisy": (*window, feature_dim(info.skeleton)), "clean": (*window, feature_dim(info.skeleton)),
              "valid": (*window, 1), "offsets": (d.batch_size, info.skeleton.num_joints, 3),
              "segment": (d.batch_size,)}
    keys = batch_keys(config)
    return {k: jax.ShapeDtypeStruct(shapes[k], np.int32 if k == "segment" else np.float32, sharding=s)
            for k, s in parallel.batch_shardings(mesh, keys).items()}


def step_ms(step, state, abstract: dict, repeats: int = 3) -> float:
    """Milliseconds of one ``step`` on a batch of zeros shaped like ``abstract`` (:func:`abstract_batch`),
    the fastest of ``repeats`` after a first (compiling) call, on a copy of ``state`` (left untouched).
    The trainer's input check later runs the same compiled step."""
    batch = {k: jnp.zeros(a.shape, a.dtype, device=a.sharding) for k, a in abstract.items()}
    copy = jax.block_until_ready(step(jax.tree.map(jnp.copy, state), batch)[0])
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        copy = jax.block_until_ready(step(copy, batch)[0])
        best = min(best, time.perf_counter() - t)
    return 1e3 * best


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


def evaluated_params(state):
    """The parameters evaluation and export use: the moving average when the run keeps one
    (``train.ema_decay``); with ``train.optimizer = "schedule_free"`` the averaged iterate ``x`` its
    optimizer keeps (the trained ``params`` are its interpolation ``y``, not what it evaluates)."""
    if "ema" in state:
        return state["ema"]
    free = [s for s in jax.tree.leaves(state["opt_state"], is_leaf=_is_schedule_free)
            if _is_schedule_free(s)]
    if free:  # one, wherever the chain (clipping, MultiSteps) put it
        return optax.contrib.schedule_free_eval_params(free[0], state["params"])
    return state["params"]


def _is_schedule_free(x) -> bool:
    return isinstance(x, optax.contrib.ScheduleFreeState)


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
        x = np.concatenate([x, np.repeat(x[-1:], pad, 0)]) if pad else np.asarray(x)
        return np.asarray(apply(evaluated_params(state), state["rest"], parallel.put(x, window)))[:b]

    return predict
