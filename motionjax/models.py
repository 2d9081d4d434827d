"""Flax NNX denoising autoencoders over time-chunked motion windows ``[B, N, C, F]``.

A window of ``T = N·C`` frames arrives as ``N`` chunks of ``C`` frames of standardized features
(:mod:`motionjax.features`). Every block works inside a chunk and sees ``halo`` frames of each
neighbouring chunk, so the chunk axis ``N`` can be sharded over the mesh axis ``'time'``: only the
halo frames cross devices (``jax.lax.ppermute`` in :func:`chunk_windows`), never the sequence.

Both models share one layout::

    features [B,N,C,F] -> embed -> `depth` blocks -> bottleneck: groups of `stride` frames -> latent
    [B,N,C/stride,latent_dim] -> upsample -> `depth` blocks -> heads: root [.,3] + 6D rotations [.,F-3]

:class:`MotionTransformer` uses attention over the chunk plus its halos (rotary relative positions,
no absolute ones, so every chunk is processed alike); :class:`TemporalConvNet` is the light
reference with 1D convolutions across chunk boundaries. With ``residual=False`` all information
passes through the latent, ``latent_dim / stride`` numbers per frame (:attr:`latent_per_frame`),
the size a per-frame PCA baseline should get; ``residual=True`` predicts a correction to the input
instead, which denoises better but bypasses the bottleneck.

Parameters stay in ``param_dtype`` (fp32) and are replicated; activations are computed in
``dtype`` (bf16 by default); outputs are fp32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import PartitionSpec as P

from motionjax.halo import pad_with_halos

DATA_AXIS, TIME_AXIS = "data", "time"  # mesh axes that shard the batch and chunk dimensions


def chunk_windows(x, halo: int, axis_name: str | None = None):
    """Each chunk with ``halo`` frames of its neighbours on both sides.

    Args:
      x: ``[B, N, C, D]`` chunks (the local ones inside ``shard_map``).
      halo: frames taken from each neighbour, ``0 <= halo <= C``.
      axis_name: mesh axis the chunk axis is sharded over (inside ``shard_map``), else ``None``.

    Returns:
      ``windows [B, N, halo + C + halo, D]`` and ``valid [N, halo + C + halo]``, False where the
      window reaches past either end of the whole sequence (those slots hold edge copies).
    """
    b, n, c, d = x.shape
    if not 0 <= halo <= c:
        raise ValueError(f"halo {halo} must be within [0, chunk {c}]")
    padded = pad_with_halos(x.reshape(b, n * c, d), halo, axis=1, axis_name=axis_name)  # [B, h+NC+h, D]
    # padded[n·C + k] is frame n·C + k - h: the h frames before chunk n, then (shifted by 2h) after it.
    left = padded[:, : n * c].reshape(b, n, c, d)[:, :, :halo]
    right = padded[:, 2 * halo :].reshape(b, n, c, d)[:, :, c - halo :]
    first, total = 0, n * c
    if axis_name is not None:
        first = jax.lax.axis_index(axis_name) * n * c
        total = jax.lax.axis_size(axis_name) * n * c
    t = first + jnp.arange(n)[:, None] * c + jnp.arange(-halo, c + halo)[None, :]
    return jnp.concatenate([left, x, right], axis=2), (t >= 0) & (t < total)


def rope(x, positions, max_wavelength: float):
    """Rotary position encoding: ``x [..., S, H, Dh]`` rotated by ``positions [S]`` (Dh even)."""
    half = x.shape[-1] // 2
    freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[:, None, None] * freq  # [S, 1, half]
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class AttentionBlock(nnx.Module):
    """Pre-norm transformer block: the ``C`` frames of a chunk attend to ``halo + C + halo`` frames."""

    def __init__(self, dim, heads, mlp_ratio, halo, chunk, dropout, dtype, param_dtype, *, rngs):
        if dim % heads or (dim // heads) % 2:
            raise ValueError(f"dim {dim} must split into {heads} heads of even size")
        self.heads, self.halo = heads, halo
        self.max_wavelength = 4.0 * (chunk + 2 * halo)  # rotary wavelengths span the window
        dense = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        norm = functools.partial(nnx.LayerNorm, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.q, self.kv, self.out = dense(dim, dim), dense(dim, 2 * dim), dense(dim, dim)
        self.mlp_in, self.mlp_out = dense(dim, mlp_ratio * dim), dense(mlp_ratio * dim, dim)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, windows_fn):
        """``x [B, N, C, D]``; ``windows_fn`` is :func:`chunk_windows` bound to the model's mesh."""
        b, n, c, d = x.shape
        h = self.norm1(x)
        # Project before the exchange: each frame's keys/values are computed once, on its own device.
        kv, valid = windows_fn(self.kv(h), self.halo)  # [B, N, W, 2D], [N, W]
        w = kv.shape[2]
        q = rope(self.q(h).reshape(b, n, c, self.heads, -1), jnp.arange(c), self.max_wavelength)
        k, v = jnp.split(kv.reshape(b, n, w, 2 * self.heads, -1), 2, axis=3)
        k = rope(k, jnp.arange(-self.halo, c + self.halo), self.max_wavelength)
        # vmap over chunks rather than folding them into the batch: a [B·N] reshape of two sharded
        # axes makes the partitioner gather the mask.
        attend = lambda q, k, v, valid: jax.nn.dot_product_attention(q, k, v, mask=valid[None, None, None])
        attn = jax.vmap(attend, in_axes=(1, 1, 1, 0), out_axes=1)(q, k, v, valid).reshape(b, n, c, d)
        x = x + self.dropout(self.out(attn))
        return x + self.dropout(self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x)))))


class ConvBlock(nnx.Module):
    """Pre-norm residual block: a temporal convolution of width ``kernel`` across chunk boundaries."""

    def __init__(self, dim, kernel, dropout, dtype, param_dtype, *, rngs):
        if kernel % 2 == 0:
            raise ValueError(f"conv kernel {kernel} must be odd (centred)")
        self.halo = kernel // 2
        self.norm = nnx.LayerNorm(dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # A (1 x kernel) 2D conv over (chunk, frame): each chunk's window is convolved on its own and the
        # chunk axis stays a spatial axis; folding it into the batch would make the partitioner gather it.
        self.conv = nnx.Conv(dim, dim, (1, kernel), padding="VALID", dtype=dtype, param_dtype=param_dtype,
                             rngs=rngs)
        self.mix = nnx.Linear(dim, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, windows_fn):
        windows, valid = windows_fn(self.norm(x), self.halo)
        windows = jnp.where(valid[None, :, :, None], windows, 0)  # zero padding at the sequence ends
        y = self.conv(windows)  # [B, N, W, D] -> [B, N, C, D]
        return x + self.dropout(self.mix(jax.nn.gelu(y)))


class ChunkedAutoencoder(nnx.Module):
    """Embedding, encoder blocks, temporal bottleneck, decoder blocks, heads; blocks set by subclasses."""

    def __init__(self, features, chunk, dim, depth, latent_dim, stride, residual, make_block, dtype,
                 param_dtype, mesh, *, rngs):
        if chunk % stride:
            raise ValueError(f"bottleneck stride {stride} must divide the chunk length {chunk}")
        self.features, self.chunk, self.stride, self.latent_dim = features, chunk, stride, latent_dim
        self.residual, self.mesh = residual, mesh
        dense = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embed = dense(features, dim)
        self.encoder = nnx.List([make_block(rngs) for _ in range(depth)])
        self.down = dense(stride * dim, latent_dim)  # a strided linear "conv": `stride` frames -> 1 latent
        self.up = dense(latent_dim, stride * dim)
        self.decoder = nnx.List([make_block(rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # Zero heads: the model starts at the mean pose (or, residual, at the identity).
        zero = functools.partial(dense, kernel_init=nnx.initializers.zeros)
        self.root_head, self.rotation_head = zero(dim, 3), zero(dim, features - 3)

    @property
    def latent_per_frame(self) -> float:
        """Latent numbers per frame: what a per-frame PCA baseline of equal size keeps."""
        return self.latent_dim / self.stride

    def _windows(self, x, halo):
        """:func:`chunk_windows`, exchanging halos by ``ppermute`` when a mesh shards the chunks."""
        if self.mesh is None:
            return chunk_windows(x, halo)
        # Manual only for the exchange: the rest stays chunk-local, so the partitioner keeps it sharded.
        batch = DATA_AXIS if DATA_AXIS in self.mesh.axis_names else None
        exchange = jax.shard_map(
            functools.partial(chunk_windows, halo=halo, axis_name=TIME_AXIS),
            mesh=self.mesh,
            in_specs=P(batch, TIME_AXIS),
            out_specs=(P(batch, TIME_AXIS), P(TIME_AXIS)),
            check_vma=False,
        )
        return exchange(x)

    def encode(self, x):
        """``x [B, N, C, F]`` -> latent ``[B, N, C/stride, latent_dim]``."""
        b, n, c, _ = x.shape
        if c != self.chunk or x.shape[-1] != self.features:
            raise ValueError(f"expected [B, N, {self.chunk}, {self.features}] input, got {x.shape}")
        h = self.embed(x)
        for block in self.encoder:
            h = block(h, self._windows)
        return self.down(h.reshape(b, n, c // self.stride, -1))

    def decode(self, z):
        """Latent ``[B, N, C/stride, latent_dim]`` -> features ``[B, N, C, F]`` (fp32, before residual)."""
        b, n, g, _ = z.shape
        h = self.up(z).reshape(b, n, g * self.stride, -1)
        for block in self.decoder:
            h = block(h, self._windows)
        h = self.norm(h)
        out = jnp.concatenate([self.root_head(h), self.rotation_head(h)], axis=-1)
        return out.astype(jnp.float32)

    def __call__(self, x):
        """Standardized (noised/masked) features ``[B, N, C, F]`` -> clean estimate ``[B, N, C, F]`` fp32."""
        y = self.decode(self.encode(x))
        return x.astype(jnp.float32) + y if self.residual else y


class MotionTransformer(ChunkedAutoencoder):
    """Chunk-local transformer. Each block reads ``halo`` frames of the neighbouring chunks, so
    information moves at most one chunk per block: outputs of chunk ``n`` depend on chunks
    ``n ± 2·depth`` at most (``n ± 1`` for a single block)."""

    def __init__(self, features, chunk, *, dim, depth, heads, mlp_ratio, halo, latent_dim, stride,
                 residual=False, dropout=0.0, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rngs):
        block = lambda r: AttentionBlock(dim, heads, mlp_ratio, halo, chunk, dropout, dtype, param_dtype,
                                         rngs=r)
        super().__init__(features, chunk, dim, depth, latent_dim, stride, residual, block, dtype, param_dtype,
                         mesh, rngs=rngs)


class TemporalConvNet(ChunkedAutoencoder):
    """Residual temporal convolutions: an output frame depends on ``2·depth·(kernel // 2)`` frames each
    side (widened by the bottleneck's frame groups), whatever the chunking."""

    def __init__(self, features, chunk, *, dim, depth, kernel, latent_dim, stride, residual=False,
                 dropout=0.0, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rngs):
        block = lambda r: ConvBlock(dim, kernel, dropout, dtype, param_dtype, rngs=r)
        super().__init__(features, chunk, dim, depth, latent_dim, stride, residual, block, dtype, param_dtype,
                         mesh, rngs=rngs)


def make_model(config: ml_collections.ConfigDict, feature_dim: int, chunk: int, rngs: nnx.Rngs, mesh=None):
    """The model named by ``config.name`` (the ``model`` section of the experiment config).

    ``mesh``: when given, the chunk axis of the input is expected sharded over its ``'time'`` axis
    (and the batch over ``'data'``) and halos are exchanged between devices.
    """
    common = dict(
        dim=config.dim, depth=config.depth, latent_dim=config.latent_dim, stride=config.stride,
        residual=config.residual, dropout=config.dropout, dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype), mesh=mesh, rngs=rngs,
    )
    if config.name == "transformer":
        return MotionTransformer(feature_dim, chunk, heads=config.heads, mlp_ratio=config.mlp_ratio,
                                 halo=config.halo, **common)
    if config.name == "tconv":
        return TemporalConvNet(feature_dim, chunk, kernel=config.kernel, **common)
    raise ValueError(f"unknown model.name {config.name!r}; expected 'transformer' or 'tconv'")
