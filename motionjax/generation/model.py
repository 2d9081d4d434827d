"""The generator's network: a transformer over the latent frames of a window, conditioned on the flow time
and the labels (a DiT: Peebles & Xie 2023, adaptive layer norm with zero-initialized gates).

``x_t [B, L, D]`` (standardized latents), ``t [B]`` in ``[0, 1]``, ``labels [B, K]`` (one class id per label
key; id ``classes[k]`` is that key's "none" token, the unconditional one) -> velocity ``[B, L, D]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def time_embedding(t, dim: int, max_period: float = 1e4):
    """Sinusoidal embedding ``[B, dim]`` of ``t [B]`` (scaled to 0..1000 as in DDPM/DiT)."""
    half = dim // 2
    freq = jnp.exp(-np.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    angle = 1000.0 * t[:, None].astype(jnp.float32) * freq
    return jnp.concatenate([jnp.cos(angle), jnp.sin(angle)], axis=-1)


class Block(nnx.Module):
    """Pre-norm self-attention and MLP, each modulated by the condition (shift, scale, gate)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.norm1 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, rngs=rngs)
        self.qkv, self.out = nnx.Linear(dim, 3 * dim, rngs=rngs), nnx.Linear(dim, dim, rngs=rngs)
        self.mlp_in, self.mlp_out = (
            nnx.Linear(dim, mlp_ratio * dim, rngs=rngs),
            nnx.Linear(mlp_ratio * dim, dim, rngs=rngs),
        )
        self.modulation = nnx.Linear(dim, 6 * dim, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, h, cond):
        b, length, d = h.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(
            self.modulation(jax.nn.silu(cond))[:, None], 6, -1
        )
        x = self.norm1(h) * (1 + scale1) + shift1
        q, k, v = jnp.split(self.qkv(x).reshape(b, length, 3 * self.heads, d // self.heads), 3, axis=2)
        h = h + gate1 * self.out(jax.nn.dot_product_attention(q, k, v).reshape(b, length, d))
        x = self.norm2(h) * (1 + scale2) + shift2
        return h + gate2 * self.mlp_out(jax.nn.gelu(self.mlp_in(x)))


class FlowTransformer(nnx.Module):
    """Velocity field of the rectified flow over latent sequences ``[B, L, D]``."""

    def __init__(
        self,
        length: int,
        latent_dim: int,
        classes: tuple[int, ...],
        *,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: int,
        rngs: nnx.Rngs,
    ):
        self.classes = tuple(int(n) for n in classes)
        self.embed = nnx.Linear(latent_dim, dim, rngs=rngs)
        self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (length, dim)))
        self.time = nnx.Sequential(
            nnx.Linear(dim, dim, rngs=rngs), jax.nn.silu, nnx.Linear(dim, dim, rngs=rngs)
        )
        # One table per label key, its last row the "none" token.
        self.label_tables = nnx.List([nnx.Embed(n + 1, dim, rngs=rngs) for n in self.classes])
        self.blocks = nnx.List([Block(dim, heads, mlp_ratio, rngs=rngs) for _ in range(depth)])
        self.final_norm = nnx.LayerNorm(dim, use_scale=False, use_bias=False, rngs=rngs)
        self.final_modulation = nnx.Linear(dim, 2 * dim, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.head = nnx.Linear(dim, latent_dim, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.dim = dim

    def __call__(self, x, t, labels):
        cond = self.time(time_embedding(t, self.dim))
        for k, table in enumerate(self.label_tables):
            cond = cond + table(labels[:, k])
        h = self.embed(x) + self.position[...]
        for block in self.blocks:
            h = block(h, cond)
        shift, scale = jnp.split(self.final_modulation(jax.nn.silu(cond))[:, None], 2, -1)
        return self.head(self.final_norm(h) * (1 + scale) + shift)

    def unconditional(self, labels):
        """``labels [B, K]`` with every key set to its "none" token."""
        return jnp.broadcast_to(jnp.asarray(self.classes, labels.dtype), labels.shape)
