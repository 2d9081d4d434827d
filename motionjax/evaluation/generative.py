"""The motion evaluator of a conditioned generator: a label classifier whose features score samples.

Definitions followed (each computed on the evaluator's penultimate features ``f [N, d]``):

* **FID** (Heusel et al. 2017, as the motion-generation literature uses it: Guo et al. 2020,
  "Action2Motion", and Guo et al. 2022, "Generating Diverse and Natural 3D Human Motions from Text"): the
  Fréchet distance between Gaussians fitted to the features of generated and of real held-out windows,
  ``|μ₁ − μ₂|² + tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^½)``;
* **accuracy**: how often the evaluator's classifier recognizes the intended label of a sample (one per
  label key: content, style);
* **diversity** (Guo et al. 2020 §4.2, 2022 §5): two random subsets of ``S_d`` samples drawn from all
  samples, the mean distance of their paired features ``(1/S_d) Σ |f_i − f'_i|``;
* **multimodality** (the same papers): per condition, two random subsets of ``S_l`` of the samples
  generated for it, the mean paired distance, averaged over conditions (how much samples of one
  condition differ).

The evaluator (:class:`Evaluator`) is a temporal convolution net over the root-relative joint positions
and the root's velocity of a window ``[B, T, J, 3]``, pooled over time into ``d`` features, with one
linear head per label key; it is trained once on the training split's windows (:func:`train_evaluator`)
and frozen.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.linalg
from flax import nnx


def motion_inputs(positions, up_axis: int, fps: float):
    """Joint positions ``[B, T, J, 3]`` (m, canonical window frame) -> the evaluator's input ``[B, T, 3J +
    3]``: every joint relative to the root's ground point that frame (heights kept), the root's height,
    and its horizontal velocity (m/s); the window's heading is canonical, so direction of travel shows."""
    positions = jnp.asarray(positions, jnp.float32)
    root = positions[:, :, :1]
    ground = root.at[..., up_axis].set(0.0)
    rel = (positions - ground).reshape(*positions.shape[:2], -1)
    vel = jnp.diff(root[:, :, 0], axis=1, prepend=root[:, :1, 0]) * fps
    vel = vel.at[..., up_axis].set(root[:, :, 0, up_axis])  # the root height in the up slot
    return jnp.concatenate([rel, vel], axis=-1)


class Evaluator(nnx.Module):
    """``[B, T, I]`` -> ``(features [B, d], {key: logits [B, classes]})``: three temporal convolutions
    (the last two halve the frame rate), a mean over time, a linear map to ``d`` features, linear heads."""

    def __init__(
        self,
        inputs: int,
        classes: dict[str, int],
        *,
        dim: int,
        features: int,
        rngs: nnx.Rngs,
        mean=None,
        std=None,
    ):
        conv = functools.partial(nnx.Conv, kernel_size=(5,), rngs=rngs)
        self.convs = nnx.List([conv(inputs, dim), conv(dim, dim, strides=(2,)), conv(dim, dim, strides=(2,))])
        self.norms = nnx.List([nnx.LayerNorm(dim, rngs=rngs) for _ in range(3)])
        self.project = nnx.Linear(dim, features, rngs=rngs)
        self.heads = nnx.Dict({k: nnx.Linear(features, n, rngs=rngs) for k, n in classes.items()})
        self.mean = nnx.Variable(jnp.zeros(inputs) if mean is None else jnp.asarray(mean, jnp.float32))
        self.std = nnx.Variable(jnp.ones(inputs) if std is None else jnp.asarray(std, jnp.float32))

    def features(self, x, valid=None):
        """``x [B, T, I]``, ``valid [B, T]`` (None: every frame) -> ``[B, d]``: the mean over time is over the
        valid frames only (a short clip's edge padding, frozen frames, does not count)."""
        h = (x - self.mean[...]) / self.std[...]
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = jax.nn.gelu(norm(conv(h)))
        if valid is None:
            return self.project(h.mean(axis=1))
        m = jnp.asarray(valid, h.dtype)[:, ::2][:, ::2][..., None]  # the frames of the two stride-2 convs
        return self.project(jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0))

    def __call__(self, x, valid=None):
        f = self.features(x, valid)
        return f, {k: head(f) for k, head in self.heads.items()}


def train_evaluator(
    inputs,
    labels: dict[str, np.ndarray],
    classes: dict[str, int],
    *,
    dim: int,
    features: int,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    log=None,
    valid=None,
) -> Evaluator:
    """Fit an :class:`Evaluator` to ``inputs [N, T, I]`` (:func:`motion_inputs`) with integer ``labels {key:
    [N]}`` (cross-entropy summed over keys; AdamW, cosine decay); ``valid [N, T]``: the frames each window
    has (None: all); ``log(step, loss)`` every 10% of it."""
    inputs = np.asarray(inputs, np.float32)
    valid = np.ones(inputs.shape[:2], np.float32) if valid is None else np.asarray(valid, np.float32)
    flat = inputs[valid > 0]
    model = Evaluator(
        inputs.shape[-1],
        classes,
        dim=dim,
        features=features,
        rngs=nnx.Rngs(seed),
        mean=flat.mean(0),
        std=flat.std(0) + 1e-3,
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(100, steps // 10), steps)
    optimizer = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=1e-4), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, m, y):
        def loss_fn(model):
            _, logits = model(x, m)
            return sum(optax.softmax_cross_entropy_with_integer_labels(logits[k], y[k]).mean() for k in y)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(seed)
    for i in range(steps):
        pick = rng.integers(0, len(inputs), batch_size)
        loss = step(
            model,
            optimizer,
            jnp.asarray(inputs[pick]),
            jnp.asarray(valid[pick]),
            {k: jnp.asarray(v[pick]) for k, v in labels.items()},
        )
        if log is not None and (i + 1) % max(steps // 10, 1) == 0:
            log(i + 1, float(loss))
    return model


def in_batches(fn, batch: int, *arrays):
    """``fn`` over the leading axis of ``arrays`` (numpy, or None) in batches of exactly ``batch`` rows (the
    last one padded with copies of its last row, cut off again), so a jitted ``fn`` compiles once whatever
    the count; ``fn``'s outputs (a pytree of arrays with that leading axis) concatenated, numpy."""
    n = len(next(a for a in arrays if a is not None))
    outs = []
    for i in range(0, n, batch):
        m = min(batch, n - i)
        part = [
            None
            if a is None
            else np.concatenate([a[i : i + m], np.repeat(a[i + m - 1 : i + m], batch - m, 0)])
            for a in arrays
        ]
        outs.append(jax.tree.map(lambda x, m=m: np.asarray(x)[:m], fn(*part)))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


@nnx.jit
def _apply(model, x, m):
    f, logits = model(x, m)
    return f, {k: jnp.argmax(v, -1) for k, v in logits.items()}


def evaluate_features(model: Evaluator, inputs, batch_size: int = 256, valid=None):
    """``(features [N, d], {key: predicted class [N]})`` of ``inputs [N, T, I]`` over the frames ``valid
    [N, T]`` (None: all), numpy."""
    inputs = np.asarray(inputs)
    valid = np.ones(inputs.shape[:2], np.float32) if valid is None else np.asarray(valid, np.float32)
    f, predicted = in_batches(
        lambda x, m: _apply(model, jnp.asarray(x, jnp.float32), jnp.asarray(m)), batch_size, inputs, valid
    )
    return np.asarray(f, np.float64), predicted


def save(model: Evaluator, path, classes: dict[str, int], dim: int, features: int) -> None:
    """The evaluator's weights (``path``.npz) and shape (``path``.json)."""
    path = Path(path)
    leaves = jax.tree.leaves(nnx.state(model))
    np.savez(path.with_suffix(".npz"), *[np.asarray(x) for x in leaves])
    inputs = int(model.mean[...].shape[0])
    path.with_suffix(".json").write_text(
        json.dumps(dict(inputs=inputs, classes=classes, dim=dim, features=features))
    )


def load(path) -> Evaluator:
    """An evaluator written by :func:`save`."""
    path = Path(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    model = Evaluator(
        meta["inputs"], meta["classes"], dim=meta["dim"], features=meta["features"], rngs=nnx.Rngs(0)
    )
    graphdef, state = nnx.split(model)
    arrays = np.load(path.with_suffix(".npz"))
    leaves = [jnp.asarray(arrays[f"arr_{i}"]) for i in range(len(arrays.files))]
    return nnx.merge(graphdef, jax.tree.unflatten(jax.tree.structure(state), leaves))


def fid(a, b) -> float:
    """Fréchet distance between Gaussians fitted to features ``a [N, d]`` and ``b [M, d]`` (float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if min(len(a), len(b)) < 2:  # no covariance from one sample
        return float("nan")
    mu, sigma = (a.mean(0), b.mean(0)), (np.cov(a, rowvar=False), np.cov(b, rowvar=False))
    root = scipy.linalg.sqrtm(sigma[0] @ sigma[1])
    if not np.isfinite(root).all():  # near-singular product: the standard offset (as in pytorch-fid)
        eps = np.eye(a.shape[1]) * 1e-6
        root = scipy.linalg.sqrtm((sigma[0] + eps) @ (sigma[1] + eps))
    return float(np.sum((mu[0] - mu[1]) ** 2) + np.trace(sigma[0] + sigma[1] - 2 * np.real(root)))


def diversity(features, size: int, rng: np.random.Generator) -> float:
    """Mean paired distance of two random subsets of ``size`` (at most half the samples) of ``features``."""
    n = len(features)
    size = min(size, n // 2)
    pick = rng.permutation(n)[: 2 * size]
    return float(np.linalg.norm(features[pick[:size]] - features[pick[size:]], axis=-1).mean())


def multimodality(features, conditions, size: int, rng: np.random.Generator) -> float:
    """Per condition (``conditions [N]`` ids), the mean paired distance of two random subsets of ``size`` of
    its samples (at most half of them), averaged over conditions with at least 2 samples; nan if none."""
    values = []
    for c in np.unique(conditions):
        f = features[conditions == c]
        if len(f) >= 2:
            values.append(diversity(f, size, rng))
    return float(np.mean(values)) if values else float("nan")


def accuracy(predicted: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
    """``{key: share of predicted == intended}``."""
    return {k: float(np.mean(predicted[k] == labels[k])) for k in labels}
