"""Pruning a trained model: unstructured magnitude masks and structured MLP-channel removal.

- Unstructured: per weight matrix, the ``sparsity`` fraction of smallest-magnitude entries is
  zeroed; fine-tuning keeps them zero (:func:`motionjax.efficiency.finetune.keep_masked`, a mask on
  the optimizer's updates). The kernels stay dense arrays: XLA:CPU (and onnxruntime's dense GEMM)
  multiply the zeros like any other number, so this buys no speed, only compressibility.
- Structured: each transformer block's MLP keeps the ``keep`` fraction of its hidden channels with
  the largest ``|w_in column|·|w_out row|`` and the rest are removed, not masked: the result is a
  smaller dense model (``mlp_ratio·keep``) whose matmuls really shrink.
- Width: a temporal conv model keeps ``dim`` channels of its residual stream in every layer
  (:func:`prune_width`): a narrower model that starts where the trained one is, the student that
  distillation then trains (as in Minitron's width pruning, Sreenivas et al. 2024).
"""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from motionjax import models


def _is_matrix(path, leaf) -> bool:
    return any(getattr(k, "key", None) == "kernel" for k in path) and np.ndim(leaf) >= 2


def magnitude_mask(params, sparsity: float):
    """A 0/1 tree like ``params``: in every kernel (>= 2-D) the ``sparsity`` fraction of smallest
    ``|w|`` is 0; biases and norms are all 1."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity {sparsity}: expected a fraction in [0, 1)")

    def mask(path, w):
        w = jnp.asarray(w)
        if not _is_matrix(path, w) or sparsity == 0:
            return jnp.ones_like(w)
        threshold = jnp.quantile(jnp.abs(w).ravel(), sparsity)
        return (jnp.abs(w) > threshold).astype(w.dtype)

    return jax.tree_util.tree_map_with_path(mask, params)


def sparsity_of(params) -> float:
    """Fraction of exact zeros over the kernels (>= 2-D) of ``params``."""
    kernels = [np.asarray(w) for p, w in jax.tree_util.tree_leaves_with_path(params) if _is_matrix(p, w)]
    return float(sum((k == 0).sum() for k in kernels) / sum(k.size for k in kernels))


def prune_mlp_channels(model: nnx.Module, model_config, feature_dim: int, chunk: int, keep: float,
                       info=None):
    """``(smaller model, its model config)``: every :class:`motionjax.models.AttentionBlock`'s MLP
    keeps the ``keep`` fraction of hidden channels (largest ``|w_in[:, j]|·|w_out[j, :]|``); all
    other weights are copied. ``model_config.mlp_ratio · keep`` must be a whole number."""
    ratio = model_config.mlp_ratio * keep
    if model_config.name != "transformer" or ratio != int(ratio) or ratio < 1:
        raise ValueError(f"channel pruning keeps mlp_ratio·keep = {ratio} of a {model_config.name}: "
                         "expected a transformer and a whole mlp_ratio >= 1")
    cfg = copy.deepcopy(model_config)
    with cfg.unlocked():
        cfg.mlp_ratio = int(ratio)
    small = models.make_model(cfg, feature_dim, chunk, nnx.Rngs(0), info=info)
    small.eval()
    big_blocks = [n for _, n in nnx.iter_graph(model) if isinstance(n, models.AttentionBlock)]
    small_blocks = [n for _, n in nnx.iter_graph(small) if isinstance(n, models.AttentionBlock)]
    nnx.update(small, jax.tree.map(  # everything but the MLPs has the same shape: copy it
        lambda s, b: jnp.asarray(b) if np.shape(s) == np.shape(b) else s,
        nnx.state(small, nnx.Param), nnx.state(model, nnx.Param)))
    for big, sm in zip(big_blocks, small_blocks, strict=True):
        w_in, b_in, w_out = (np.asarray(v[...])
                             for v in (big.mlp_in.kernel, big.mlp_in.bias, big.mlp_out.kernel))
        score = np.linalg.norm(w_in, axis=0) * np.linalg.norm(w_out, axis=1)
        kept = np.sort(np.argsort(score)[::-1][: sm.mlp_in.kernel.shape[1]])
        sm.mlp_in.kernel.set_value(jnp.asarray(w_in[:, kept]))
        sm.mlp_in.bias.set_value(jnp.asarray(b_in[kept]))
        sm.mlp_out.kernel.set_value(jnp.asarray(w_out[kept]))
        sm.mlp_out.bias.set_value(jnp.asarray(big.mlp_out.bias[...]))
    return small, cfg


def prune_width(model: nnx.Module, model_config, feature_dim: int, chunk: int, dim: int, info=None):
    """``(narrower model, its model config)``: a ``tconv`` model whose residual stream keeps the ``dim``
    of its ``model_config.dim`` channels with the largest weights (the squared norm of every kernel row
    and column, bias and norm entry that reads or writes the channel, summed over layers), in every
    layer; the latent and the heads' outputs keep their sizes. Each weight of the narrower model is the
    trained one's at the kept channels (an axis of ``k·dim``, ``k`` frames side by side, keeps them in
    each frame)."""
    big = model_config.dim
    if model_config.name != "tconv" or not 0 < dim <= big:
        raise ValueError(f"width pruning keeps 0 < dim <= {big} channels of a tconv model, got "
                         f"dim={dim} of a {model_config.name}")
    cfg = copy.deepcopy(model_config)
    with cfg.unlocked():
        cfg.dim = dim
    small = models.make_model(cfg, feature_dim, chunk, nnx.Rngs(0), info=info)
    small.eval()
    trained = [np.asarray(w) for w in jax.tree.leaves(nnx.state(model, nnx.Param))]
    shapes = [np.shape(w) for w in jax.tree.leaves(nnx.state(small, nnx.Param))]
    # The axes that shrink are the stream's: k·big channels in the trained model, k·dim in the narrow one.
    axes = [[a for a, (n, m) in enumerate(zip(w.shape, s, strict=True)) if n != m]
            for w, s in zip(trained, shapes, strict=True)]
    score = np.zeros(big)
    for w, shrink in zip(trained, axes, strict=True):
        for a in shrink:
            score += (np.moveaxis(w, a, 0).reshape(w.shape[a] // big, big, -1) ** 2).sum((0, 2))
    kept = np.sort(np.argsort(score)[::-1][:dim])

    def narrow(w, shrink):
        for a in shrink:
            w = np.take(w, (np.arange(w.shape[a] // big)[:, None] * big + kept).ravel(), axis=a)
        return jnp.asarray(w)

    values = [narrow(w, shrink) for w, shrink in zip(trained, axes, strict=True)]
    nnx.update(small, jax.tree.unflatten(jax.tree.structure(nnx.state(small, nnx.Param)), values))
    return small, cfg
