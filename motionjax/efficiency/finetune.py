"""Short training runs for the efficiency variants: masked fine-tuning after pruning, and a student
trained on a teacher's outputs (distillation) or on the data alone.

They run the trainer's own step (:func:`motionjax.train.pure_train_step`: its loss, optimizer
schedule, clipping, non-finite guard) through its two hooks: the optimizer gains a parameter mask it
keeps (:func:`keep_masked`), and the objective (:func:`distillation_objective`) mixes in the
teacher's output, which the batch carries as ``target``. The mask and the mix weight are inputs, so
every sparsity level, seed and the distilled/data-only pair share one compilation.
"""
from __future__ import annotations

import copy
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from motionjax import parallel, train
from motionjax.efficiency import scorecard


class MaskState(NamedTuple):
    mask: Any  # a tree like the parameters: 1 where a weight is kept, 0 where pruned


def keep_masked(mask) -> optax.GradientTransformation:
    """Multiplies every update by ``mask``: pruned weights (zero) stay zero through fine-tuning,
    weight decay and momentum included. The mask lives in the optimizer state."""
    return optax.GradientTransformation(
        init=lambda params: MaskState(mask),
        update=lambda updates, state, params=None: (jax.tree.map(jnp.multiply, updates, state.mask), state))


def distillation_objective(loss_fn):
    """``(pred, batch) -> (loss, terms)``: ``(1 - a)·L(pred, clean) + a·L(pred, target)`` with the
    trainer's loss ``L`` and ``a = batch["target_weight"]`` (one value for the whole batch)."""
    reconstruction = train.reconstruction_objective(loss_fn)

    def objective(pred, batch):
        loss, terms = reconstruction(pred, batch)
        alpha = batch["target_weight"][0]
        taught, _ = reconstruction(pred, dict(batch, clean=batch["target"]))
        return (1 - alpha) * loss + alpha * taught, terms

    return objective


def _config(config, steps: int, seed: int, learning_rate: float | None):
    c = copy.deepcopy(config)
    with c.unlocked():
        c.seed = seed
        c.train.steps = steps
        c.train.warmup_steps = min(c.train.warmup_steps, max(steps // 10, 1))
        c.train.grad_accum_steps = 1
        c.train.ema_decay = 0.0
        if learning_rate is not None:
            c.train.learning_rate = learning_rate
    return c


class Loop:
    """``steps`` of the trainer's step for one model architecture on ``config``'s data.

    ``teacher``: its outputs are a second target, weighted ``alpha`` in :meth:`run` (0: data only).
    """

    def __init__(self, config, info, model: nnx.Module, steps: int, teacher: nnx.Module | None = None,
                 learning_rate: float | None = None):
        self.config, self.info, self.steps = _config(config, steps, config.seed, learning_rate), info, steps
        self.mesh = parallel.make_mesh(self.config.mesh)
        # Every run is masked (all ones when nothing is pruned): one optimizer-state layout, one compile.
        ones = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))
        tx = optax.chain(train.make_optimizer(self.config.train), keep_masked(ones))
        (graphdef, self.eval_graphdef, _), self.tx, state, self.shardings = train.init_state(
            self.config, info, self.mesh, model=model, tx=tx)
        self.rest = state["rest"]
        loss_fn = train.make_loss_fn(self.config, info, self.mesh)
        objective = distillation_objective(loss_fn) if teacher is not None else None
        self._step = train.jit_train_step(train.pure_train_step(graphdef, tx, loss_fn, objective=objective),
                                          self.shardings, self.mesh)
        self.teacher = None
        if teacher is not None:
            window = parallel.window_sharding(self.mesh)
            t_graphdef, t_state = nnx.split(teacher)
            forward = jax.jit(lambda s, x: nnx.merge(t_graphdef, s)(x), out_shardings=window)
            t_state = jax.device_put(t_state, parallel.replicated(self.mesh))
            self.teacher = lambda x: forward(t_state, x)

    def run(self, model: nnx.Module, seed: int = 0, mask=None, alpha: float = 0.0, eval_batches=None,
            eval_every: int = 50) -> tuple[nnx.Module, list[dict]]:
        """Train a copy of ``model`` for ``steps``; returns it (eval mode) and, with ``eval_batches``,
        ``[{step, train_s, mpjpe}]`` every ``eval_every`` steps (``train_s`` excludes evaluation and
        the first step's compilation)."""
        config = _config(self.config, self.steps, seed, None)
        params = nnx.state(model, nnx.Param)
        mask = jax.tree.map(jnp.ones_like, params) if mask is None else mask
        params = jax.tree.map(jnp.multiply, params, mask)
        adamw, _ = self.tx.init(params)
        state = parallel.put({"params": params, "rest": self.rest, "opt_state": (adamw, MaskState(mask)),
                              "nonfinite_total": jnp.int32(0), "nonfinite_run": jnp.int32(0)}, self.shardings)
        weight = parallel.batch_shardings(self.mesh, ("target_weight",))["target_weight"]
        weight = jax.device_put(np.full(config.data.batch_size, alpha, np.float32), weight)
        iterator = train.make_iterator(config, self.info, self.mesh)
        history, elapsed = [], 0.0
        try:
            for i in range(1, self.steps + 1):
                batch = next(iterator)
                t = time.perf_counter()
                if self.teacher is not None:  # both arms run the teacher, so their seconds compare
                    batch = dict(batch, target=self.teacher(batch["noisy"]), target_weight=weight)
                state, metrics = self._step(state, batch)
                jax.block_until_ready(metrics)
                elapsed += time.perf_counter() - t if i > 1 else 0.0
                if eval_batches is not None and (i % eval_every == 0 or i == self.steps):
                    out = self.model(state["params"])
                    history.append({"step": i, "train_s": elapsed, "loss": float(metrics["loss"]),
                                    "mpjpe": scorecard.mpjpe(scorecard.jit_predict(out), config, self.info,
                                                           eval_batches)})
        finally:
            iterator.close()
        return self.model(state["params"]), history

    def model(self, params) -> nnx.Module:
        """A mesh-free model in eval mode with ``params``."""
        model = nnx.merge(self.eval_graphdef, jax.device_get(params), jax.device_get(self.rest))
        model.eval()
        return model
