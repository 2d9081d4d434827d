"""A short training loop for the efficiency variants: masked fine-tuning after pruning, and a
student trained on a teacher's outputs (distillation) or on the data alone.

It reuses the trainer's pieces (loss, optimizer schedule, Grain iterator, mesh) and adds two inputs
the trainer has no use for: a parameter mask kept by the optimizer (:func:`keep_masked`) and a
teacher whose outputs are targets. Both are arguments of one jitted step, so every sparsity level,
seed and the distilled/data-only pair share one compilation.
"""
from __future__ import annotations

import copy
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from motionjax import parallel, train
from motionjax.efficiency import measure


class MaskState(NamedTuple):
    mask: Any  # a tree like the parameters: 1 where a weight is kept, 0 where pruned


def keep_masked(mask) -> optax.GradientTransformation:
    """Multiplies every update by ``mask``: pruned weights (zero) stay zero through fine-tuning,
    weight decay and momentum included. The mask lives in the optimizer state."""
    return optax.GradientTransformation(
        init=lambda params: MaskState(mask),
        update=lambda updates, state, params=None: (jax.tree.map(jnp.multiply, updates, state.mask), state))


def _config(config, steps: int, seed: int, learning_rate: float | None):
    c = copy.deepcopy(config)
    with c.unlocked():
        c.seed = seed
        c.train.steps = steps
        c.train.warmup_steps = min(c.train.warmup_steps, max(steps // 10, 1))
        c.train.grad_accum_steps = 1
        if learning_rate is not None:
            c.train.learning_rate = learning_rate
    return c


class Loop:
    """Jitted ``params -> params`` training for one model architecture on ``config``'s data.

    ``alpha``: weight of the teacher target (0: data only; the loss is ``(1 - alpha)·L(pred, clean)
    + alpha·L(pred, teacher(noisy))`` with the trainer's reconstruction loss ``L``).
    """

    def __init__(self, config, info, model: nnx.Module, steps: int, teacher: nnx.Module | None = None,
                 learning_rate: float | None = None):
        self.config, self.info, self.steps = _config(config, steps, config.seed, learning_rate), info, steps
        self.mesh = parallel.make_mesh(self.config.mesh)
        self.graphdef, _, self.rest = nnx.split(model, nnx.Param, ...)
        loss_fn = train.make_loss_fn(self.config, info, self.mesh)
        self.teacher = None
        if teacher is not None:
            t_graphdef, t_state = nnx.split(teacher)
            self.teacher = (t_graphdef, self._put(t_state))
        # Every run is masked (all ones when nothing is pruned): one optimizer-state layout, one compile.
        self.tx = optax.chain(train.make_optimizer(self.config.train), keep_masked(None))
        graphdef, rest, t_graphdef = self.graphdef, self.rest, self.teacher and self.teacher[0]

        def step(params, opt_state, batch, teacher_state, alpha):
            def compute(p):
                pred = nnx.merge(graphdef, p, rest)(batch["noisy"])
                # As the trainer: each window's own bones (data.bones = "clip"), padding weighted out.
                bones, valid = batch.get("offsets"), batch["valid"]
                loss, _ = loss_fn(pred, batch["clean"], bones, valid)
                if t_graphdef is not None:
                    target = jax.lax.stop_gradient(nnx.merge(t_graphdef, teacher_state)(batch["noisy"]))
                    loss = (1 - alpha) * loss + alpha * loss_fn(pred, target, bones, valid)[0]
                return loss

            loss, grads = jax.value_and_grad(compute)(params)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        # Shardings pinned in and out: the step's outputs are its next inputs, so it compiles once.
        rep = parallel.replicated(self.mesh)
        self.keys = train.batch_keys(self.config)
        batch = parallel.batch_shardings(self.mesh, self.keys)
        self._step = jax.jit(step, in_shardings=(rep, rep, batch, rep, rep), out_shardings=rep,
                             donate_argnums=(0, 1))

    def _put(self, tree):
        return jax.device_put(tree, parallel.replicated(self.mesh))

    def run(self, model: nnx.Module, seed: int = 0, mask=None, alpha: float = 0.0, eval_batches=None,
            eval_every: int = 50) -> tuple[nnx.Module, list[dict]]:
        """Train a copy of ``model`` for ``steps``; returns it (eval mode) and, with ``eval_batches``,
        ``[{step, train_s, mpjpe}]`` every ``eval_every`` steps (``train_s`` excludes evaluation and
        the first step's compilation)."""
        config = _config(self.config, self.steps, seed, None)
        _, params, _ = nnx.split(model, nnx.Param, ...)
        mask = jax.tree.map(jnp.ones_like, params) if mask is None else mask
        params = self._put(jax.tree.map(jnp.multiply, params, mask))
        adamw, _ = self.tx.init(params)
        opt_state = (adamw, MaskState(self._put(mask)))
        teacher_state = self.teacher[1] if self.teacher else None
        iterator = train.make_iterator(config, self.info, self.mesh)
        history, elapsed = [], 0.0
        try:
            for i in range(1, self.steps + 1):
                batch = next(iterator)
                batch = {k: batch[k] for k in self.keys}
                t = time.perf_counter()
                params, opt_state, loss = self._step(params, opt_state, batch, teacher_state,
                                                     self._put(jnp.float32(alpha)))
                jax.block_until_ready(loss)
                elapsed += time.perf_counter() - t if i > 1 else 0.0
                if eval_batches is not None and (i % eval_every == 0 or i == self.steps):
                    out = self.model(params)
                    history.append({"step": i, "train_s": elapsed, "loss": float(loss),
                                    "mpjpe": measure.mpjpe(measure.jit_predict(out), config, self.info,
                                                           eval_batches)})
        finally:
            iterator.close()
        return self.model(params), history

    def model(self, params) -> nnx.Module:
        model = nnx.merge(self.graphdef, jax.device_get(params), self.rest)
        model.eval()
        return model
