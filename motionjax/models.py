"""Flax NNX denoising autoencoders over time-chunked motion windows ``[B, N, C, F]``.

A window of ``T = N·C`` frames arrives as ``N`` chunks of ``C`` frames of standardized features
(:mod:`motionjax.core.features`). Every block works inside a chunk and sees ``halo`` frames of each
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

:class:`DCTPredictor` is the forecaster of ``experiments/predict.py`` (siMLPe-style: a DCT over the
observed frames, MLPs over the coefficient and feature axes, the residual to the last observed pose).

Parameters stay in ``param_dtype`` (fp32); where they live on the mesh is the trainer's choice
(:func:`motionjax.parallel.param_sharding`: replicated, or split over ``data`` with ``mesh.fsdp``).
Activations are computed in ``dtype`` (bf16 by default); outputs are fp32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from motionjax.core import rotations as rot
from motionjax.core.features import destandardize, rotating_joints, unpack
from motionjax.core.halo import pad_with_halos
from motionjax.core.kinematics import forward_kinematics, inverse_kinematics
from motionjax.parallel import DATA_AXIS, TIME_AXIS, manual_axes


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


def stage_strides(stride: int, stages: int) -> tuple[int, ...]:
    """Split the bottleneck's temporal ``stride`` into ``stages`` equal integer factors (4, 2 -> (2, 2))."""
    factor = round(stride ** (1 / stages))
    if stages < 1 or factor**stages != stride:
        raise ValueError(f"model.stride {stride} is not an integer power of stages={stages} "
                         "(each stage downsamples by the same integer factor)")
    return (factor,) * stages


@functools.lru_cache(maxsize=32)
def interpolation_weights(c: int, k: int) -> np.ndarray:
    """``[c·k, 1 + c + 1]``: each fine frame of a chunk as a linear mix of the ``c`` coarse vectors
    (one per ``k`` frames, at their group centres) and the neighbouring chunks' edge vectors."""
    u = (np.arange(c * k) + 0.5) / k - 0.5 + 1  # fine frame -> coarse coordinate, in window slots
    lo = np.floor(u).astype(int)
    weights = np.zeros((c * k, c + 2), np.float32)
    weights[np.arange(c * k), lo] = 1 - (u - lo)
    weights[np.arange(c * k), lo + 1] = u - lo
    weights.flags.writeable = False  # shared by every caller (cached)
    return weights


POSITION_SCALE = 0.5  # m: root-relative joint positions enter the model divided by this (~unit scale)


class SkeletonLayer:
    """What a model needs to see joint positions or emit world-frame rotations: the skeleton and the
    feature statistics (static; closed over, never trained).

    ``input_positions``: the encoder also sees root-relative FK positions of its input (``3·J``
    numbers per frame), the quantity MPJPE scores, instead of having to learn FK from 6D rotations.
    ``global_rotations``: the rotation head predicts each joint's rotation in the window frame and
    the local rotations follow as ``R_parentᵀ·R`` (exactly, not learnt), so an error in a hip
    rotation no longer swings the whole leg chain below it.
    ``position_head``: the decoder also predicts root-relative joint positions, as a correction to
    the FK of its rotations, and the output rotations are their IK projection
    (:func:`motionjax.core.kinematics.inverse_kinematics`): each joint's error is its own, as in a
    position-space model, and the output is still a motion on the skeleton's bones.
    """

    def __init__(self, skeleton, mean, std, input_positions: bool = False, global_rotations: bool = False,
                 position_head: bool = False):
        if global_rotations and position_head:
            raise ValueError("model.global_rotations and model.position_head are two output heads; pick one")
        self.skeleton = skeleton
        self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
        self.input_positions, self.global_rotations = input_positions, global_rotations
        self.position_head = position_head
        ids = rotating_joints(skeleton)
        slot = {int(j): i for i, j in enumerate(ids)}
        # Nearest rotating ancestor of each rotating joint (fixed joints turn with their parent); -1: none.
        anc = []
        for j in ids:
            a = skeleton.parents[j]
            while a >= 0 and a not in slot:
                a = skeleton.parents[a]
            anc.append(slot.get(a, -1))
        self.ancestor = np.array(anc)

    @property
    def extra_inputs(self) -> int:
        return 3 * self.skeleton.num_joints if self.input_positions else 0

    def positions(self, x):
        """Standardized features ``[..., F]`` -> root-relative joint positions ``[..., 3·J]`` / scale."""
        _, rotations = unpack(self.skeleton, destandardize(x.astype(jnp.float32), self.mean, self.std))
        pos = forward_kinematics(self.skeleton, rotations, jnp.zeros(x.shape[:-1] + (3,), jnp.float32))[0]
        return pos.reshape(*x.shape[:-1], -1) / POSITION_SCALE

    def project(self, rotations, correction):
        """Standardized rotation features ``[..., 6·R]`` (the hint) and a position correction
        ``[..., 3·J]`` (/ scale) -> standardized rotation features whose FK reaches FK(hint) + correction.
        """
        mean, std = self.mean[3:], self.std[3:]
        no_root = [(0, 0)] * (rotations.ndim - 1) + [(3, 0)]  # decode reads features after a root slot
        hint = unpack(self.skeleton, jnp.pad(rotations * std + mean, no_root))[1]
        goal = forward_kinematics(self.skeleton, hint, jnp.zeros(rotations.shape[:-1] + (3,), jnp.float32))[0]
        goal = goal + correction.reshape(goal.shape) * POSITION_SCALE
        local = inverse_kinematics(self.skeleton, goal, hint)[..., rotating_joints(self.skeleton), :]
        return (rot.quat_to_6d(local).reshape(rotations.shape) - mean) / std

    def local_features(self, sixd_global):
        """World-frame 6D rotations ``[..., R, 6]`` (raw) -> standardized local 6D features ``[..., 6·R]``."""
        world = rot.sixd_to_matrix(sixd_global)  # [..., R, 3, 3]
        has_parent = self.ancestor >= 0
        parent = jnp.where(has_parent[:, None, None], world[..., np.maximum(self.ancestor, 0), :, :],
                           jnp.eye(3, dtype=world.dtype))
        local = jnp.swapaxes(parent, -1, -2) @ world
        sixd = jnp.concatenate([local[..., :, 0], local[..., :, 1]], axis=-1)  # the first two columns
        sixd = sixd.reshape(*sixd.shape[:-2], -1)
        return (sixd - self.mean[3:]) / self.std[3:]


class ChunkedAutoencoder(nnx.Module):
    """Embedding, encoder stages, temporal bottleneck, decoder stages, heads; blocks set by subclasses.

    With ``stages = 1`` every block runs at the frame rate and one strided linear map pools
    ``stride`` frames into a latent vector. With ``stages = k`` the encoder alternates ``depth``
    blocks and a ``stride^(1/k)``-fold downsampling k times (a strided linear "conv"), so the
    coarser blocks see longer spans of motion for the same cost; the decoder mirrors it. The only
    path from input to output is the latent ``[B, N, C/stride, latent_dim]`` (unless ``residual``).
    """

    def __init__(self, features, chunk, dim, depth, latent_dim, stride, residual, make_block, dtype,
                 param_dtype, mesh, *, rngs, stages=1, kinematics: SkeletonLayer | None = None, highpass=0,
                 upsample="linear"):
        if upsample not in ("linear", "interp"):
            raise ValueError(f"model.upsample={upsample!r}: expected 'linear' or 'interp'")
        self.upsample = upsample
        if chunk % stride:
            raise ValueError(f"bottleneck stride {stride} must divide the chunk length {chunk}")
        if highpass and not (residual and highpass % 2 and highpass // 2 <= chunk):
            raise ValueError(f"model.highpass={highpass}: expected an odd number of frames <= 2·chunk + 1 "
                             "on a residual model (the correction of a skip path)")
        self.highpass_frames = highpass
        self.features, self.chunk, self.stride, self.latent_dim = features, chunk, stride, latent_dim
        self.residual, self.mesh, self.kinematics = residual, mesh, kinematics
        self.strides = stage_strides(stride, stages)
        dense = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embed = dense(features + (kinematics.extra_inputs if kinematics else 0), dim)
        # Stage s runs at chunk / prod(strides[:s]) frames per chunk; make_block(rngs, frames) builds a block.
        rates = [chunk // int(np.prod(self.strides[:s])) for s in range(stages)]
        blocks = lambda rate: nnx.List([make_block(rngs, rate) for _ in range(depth)])
        self.encoder = nnx.List([blocks(r) for r in rates])
        outs = [dim] * (stages - 1) + [latent_dim]
        self.downs = nnx.List([dense(k * dim, o) for k, o in zip(self.strides, outs, strict=True)])
        # "linear": one vector -> k frames by a linear map (frames of a group are emitted apart, so
        # the output steps between groups); "interp": one vector -> one, then linear interpolation
        # between neighbouring vectors (smooth across groups; the blocks after it add the detail).
        width = (lambda k: dim) if upsample == "interp" else (lambda k: k * dim)
        self.ups = nnx.List([dense(o, width(k)) for k, o in zip(self.strides, outs, strict=True)])
        self.decoder = nnx.List([blocks(r) for r in rates])
        self.norm = nnx.LayerNorm(dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # Zero heads: the model starts at the mean pose (or, residual, at the identity).
        zero = functools.partial(dense, kernel_init=nnx.initializers.zeros)
        self.root_head, self.rotation_head = zero(dim, 3), zero(dim, features - 3)
        if kinematics is not None and kinematics.position_head:
            self.position_head = zero(dim, 3 * kinematics.skeleton.num_joints)

    @property
    def latent_per_frame(self) -> float:
        """Latent numbers per frame: what a per-frame PCA baseline of equal size keeps."""
        return self.latent_dim / self.stride

    def _windows(self, x, halo):
        """:func:`chunk_windows`, exchanging halos by ``ppermute`` when a mesh shards the chunks."""
        if self.mesh is None:
            return chunk_windows(x, halo)
        if TIME_AXIS in manual_axes():  # inside the train step's shard_map (train.grad_reduce)
            return chunk_windows(x, halo, axis_name=TIME_AXIS)
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
        if self.kinematics is not None and self.kinematics.input_positions:
            x = jnp.concatenate([x, self.kinematics.positions(x).astype(x.dtype)], axis=-1)
        h = self.embed(x)
        for blocks, down, k in zip(self.encoder, self.downs, self.strides, strict=True):
            for block in blocks:
                h = block(h, self._windows)
            h = down(h.reshape(b, n, h.shape[2] // k, -1))  # k consecutive frames -> one vector
        return h

    def decode(self, z):
        """Latent ``[B, N, C/stride, latent_dim]`` -> features ``[B, N, C, F]`` (fp32, before residual)."""
        b, n = z.shape[:2]
        h = z
        for blocks, up, k in zip(self.decoder[::-1], self.ups[::-1], self.strides[::-1], strict=True):
            if self.upsample == "interp":
                h = self._interpolate(up(h), k)
            else:
                h = up(h).reshape(b, n, h.shape[2] * k, -1)  # one vector -> k consecutive frames
            for block in blocks:
                h = block(h, self._windows)
        h = self.norm(h)
        rotations = self.rotation_head(h).astype(jnp.float32)
        if self.kinematics is not None and self.kinematics.global_rotations:
            # Zero head = identity world rotations to start from; Gram-Schmidt makes any output valid.
            identity = jnp.array([1.0, 0, 0, 0, 1, 0], jnp.float32)
            rotations = self.kinematics.local_features(rotations.reshape(*h.shape[:-1], -1, 6) + identity)
        if self.kinematics is not None and self.kinematics.position_head:
            rotations = self.kinematics.project(rotations, self.position_head(h).astype(jnp.float32))
        return jnp.concatenate([self.root_head(h).astype(jnp.float32), rotations], axis=-1)

    def _interpolate(self, h, k: int):
        """``h [B, N, c, D]`` at one vector per ``k`` frames -> ``[B, N, c·k, D]`` by linear
        interpolation between group centres (the neighbouring chunks' edge vectors come as halos;
        past the sequence ends the edge vector is held)."""
        windows, _ = self._windows(h, 1)  # [B, N, 1 + c + 1, D]; edge copies past the ends
        weights = interpolation_weights(h.shape[2], k)
        return jnp.einsum("fw,bnwd->bnfd", weights.astype(h.dtype), windows)

    def highpass(self, x):
        """``x`` minus its centred moving average over ``highpass_frames`` (valid frames only): the
        input's high-frequency content, ``[B, N, C, F]``."""
        windows, valid = self._windows(x, self.highpass_frames // 2)  # [B, N, C + 2h, F], [N, C + 2h]
        c, w = x.shape[2], windows.shape[2]
        # Frame i of a chunk averages window slots i .. i + 2h (itself and h neighbours each side).
        band = (np.arange(w)[None, :] >= np.arange(c)[:, None]) & \
               (np.arange(w)[None, :] <= np.arange(c)[:, None] + 2 * (self.highpass_frames // 2))  # [C, W]
        weights = band[None].astype(np.float32) * valid[:, None, :]  # [N, C, W]
        weights = weights / weights.sum(-1, keepdims=True)
        return x - jnp.einsum("ncw,bnwf->bncf", weights, windows.astype(jnp.float32)).astype(x.dtype)

    def __call__(self, x):
        """Standardized (noised/masked) features ``[B, N, C, F]`` -> clean estimate ``[B, N, C, F]`` fp32."""
        y = self.decode(self.encode(self.highpass(x) if self.highpass_frames else x))
        return x.astype(jnp.float32) + y if self.residual else y


class MotionTransformer(ChunkedAutoencoder):
    """Chunk-local transformer. Each block reads ``halo`` frames of the neighbouring chunks, so
    information moves at most one chunk per block: outputs of chunk ``n`` depend on chunks
    ``n ± 2·depth`` at most (``n ± 1`` for a single block)."""

    def __init__(self, features, chunk, *, dim, depth, heads, mlp_ratio, halo, latent_dim, stride,
                 residual=False, dropout=0.0, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rngs,
                 stages=1, kinematics=None, highpass=0, upsample="linear"):
        # A coarser stage has fewer frames per chunk: its halo shrinks with it (at least 1 frame).
        block = lambda r, frames: AttentionBlock(dim, heads, mlp_ratio, max(1, halo * frames // chunk),
                                                 frames, dropout, dtype, param_dtype, rngs=r)
        super().__init__(features, chunk, dim, depth, latent_dim, stride, residual, block, dtype, param_dtype,
                         mesh, rngs=rngs, stages=stages, kinematics=kinematics,
                         highpass=highpass, upsample=upsample)


class TemporalConvNet(ChunkedAutoencoder):
    """Residual temporal convolutions: an output frame depends on ``2·depth·(kernel // 2)`` frames each
    side (widened by the bottleneck's frame groups), whatever the chunking."""

    def __init__(self, features, chunk, *, dim, depth, kernel, latent_dim, stride, residual=False,
                 dropout=0.0, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rngs, stages=1,
                 kinematics=None, highpass=0, upsample="linear"):
        block = lambda r, frames: ConvBlock(dim, kernel, dropout, dtype, param_dtype, rngs=r)
        super().__init__(features, chunk, dim, depth, latent_dim, stride, residual, block, dtype, param_dtype,
                         mesh, rngs=rngs, stages=stages, kinematics=kinematics,
                         highpass=highpass, upsample=upsample)


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix ``[n, n]``: ``D @ x`` are the coefficients of ``x [n, ...]`` over
    its first axis (scipy's ``dct(type=2, norm="ortho")``) and ``D.T @ c`` inverts it (orthogonal)."""
    k, t = np.arange(n)[:, None], np.arange(n)[None, :]
    d = np.cos(np.pi * (t + 0.5) * k / n) * np.sqrt(2.0 / n)
    d[0] /= np.sqrt(2.0)
    return d.astype(np.float32)


class TemporalMixBlock(nnx.Module):
    """siMLPe's block (Guo et al., WACV 2023): a linear map across the ``K`` DCT coefficients, layer
    norm over the feature axis, residual; with ``mlp_ratio > 0`` also a feature-mixing MLP (pre-norm,
    residual) after it, as in MLP-Mixer. ``h [B, K, D] -> [B, K, D]``."""

    def __init__(self, length, dim, mlp_ratio, dropout, dtype, param_dtype, *, rngs):
        dense = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        norm = functools.partial(nnx.LayerNorm, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.temporal, self.norm = dense(length, length), norm(dim)
        self.mixer = bool(mlp_ratio)
        if self.mixer:
            self.mlp_norm, self.mlp_in, self.mlp_out = norm(dim), dense(dim, mlp_ratio * dim), \
                dense(mlp_ratio * dim, dim)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, h):
        mixed = jnp.swapaxes(self.temporal(jnp.swapaxes(h, 1, 2)), 1, 2)  # along K, per feature
        h = h + self.dropout(self.norm(mixed))
        if self.mixer:
            h = h + self.dropout(self.mlp_out(jax.nn.gelu(self.mlp_in(self.mlp_norm(h)))))
        return h


class DCTPredictor(nnx.Module):
    """A siMLPe-style forecaster: the first ``observed`` frames of a window in, the rest predicted.

    ``x [B, N, C, F]`` standardized features, of which only frames ``< observed`` are read. Their
    root positions are taken relative to the last observed one (the model's own frame; rotations
    stay absolute), optionally with their root-relative FK joint positions (:class:`SkeletonLayer`,
    ``input_positions``); a DCT over the ``P = observed`` frames, a linear map over features to
    ``dim``, ``depth`` :class:`TemporalMixBlock`, a linear map back (zero-initialized: the model
    starts as the zero-velocity forecast), the inverse DCT, of which the first ``T - P`` frames are
    added to the last observed frame (siMLPe's residual to the last pose); ``keep > 0`` keeps only
    that many of the lowest DCT coefficients of the change (a smooth forecast). The output's observed
    frames are the input's, so the loss and the metrics see only the forecast.
    """

    def __init__(self, features, observed, *, dim, depth, mlp_ratio=0, dropout=0.0, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs, kinematics: SkeletonLayer | None = None, keep: int = 0):
        if observed < 2:
            raise ValueError(f"data.observed={observed}: a forecaster needs at least 2 observed frames")
        if not 0 <= keep <= observed:
            raise ValueError(f"model.dct_keep={keep}: expected 0 (all) to data.observed={observed} "
                             "coefficients")
        self.features, self.observed, self.kinematics = features, observed, kinematics
        self.dct = dct_matrix(observed)
        # The forecast's change is a sum of the `keep` lowest DCT frequencies (all when 0): smooth by design.
        self.keep = (np.arange(observed) < (keep or observed)).astype(np.float32)[None, :, None]
        dense = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embed = dense(features + (kinematics.extra_inputs if kinematics else 0), dim)
        self.blocks = nnx.List([TemporalMixBlock(observed, dim, mlp_ratio, dropout, dtype, param_dtype,
                                                 rngs=rngs) for _ in range(depth)])
        self.head = dense(dim, features, kernel_init=nnx.initializers.zeros)

    def __call__(self, x):
        """``[B, N, C, F]`` -> ``[B, N, C, F]`` fp32: frames ``< observed`` copied, the rest predicted."""
        b, n, c, f = x.shape
        p, t = self.observed, n * c
        if f != self.features or not p < t <= 2 * p:
            raise ValueError(f"expected [B, N, C, {self.features}] windows of {p} observed frames and at "
                             f"most {p} more, got {x.shape}")
        frames = jnp.asarray(x, jnp.float32).reshape(b, t, f)
        past, last = frames[:, :p], frames[:, p - 1:p]
        h = past.at[..., :3].add(-last[..., :3])  # root relative to the last observed frame
        if self.kinematics is not None and self.kinematics.input_positions:
            h = jnp.concatenate([h, self.kinematics.positions(past)], axis=-1)
        h = jnp.einsum("kp,bpf->bkf", self.dct, h)  # [B, K = P, F']
        h = self.embed(h)
        for block in self.blocks:
            h = block(h)
        coefficients = self.head(h).astype(jnp.float32) * self.keep
        change = jnp.einsum("kp,bkf->bpf", self.dct, coefficients)  # inverse DCT
        future = last + change[:, : t - p]
        return jnp.concatenate([past, future], axis=1).reshape(b, n, c, f)


def _kinematics(config, info) -> SkeletonLayer | None:
    flags = {k: bool(config[k]) for k in ("input_positions", "global_rotations", "position_head")}
    if not any(flags.values()):
        return None
    if info is None:
        raise ValueError(f"model {', '.join(k for k, v in flags.items() if v)} needs the dataset "
                         "(make_model(..., info=DatasetInfo)) for the skeleton and feature statistics")
    return SkeletonLayer(info.skeleton, info.mean, info.std, **flags)


def make_model(config: ml_collections.ConfigDict, feature_dim: int, chunk: int, rngs: nnx.Rngs, mesh=None,
               info=None, observed: int = 0):
    """The model named by ``config.name`` (the ``model`` section of the experiment config).

    ``observed``: ``data.observed``, the frames a forecaster (``"dct_mlp"``, :class:`DCTPredictor`)
    reads of each window; the autoencoders read them all.

    ``info``: the dataset (skeleton, feature mean/std); needed when ``config.input_positions``,
    ``config.global_rotations`` or ``config.position_head`` is set (:class:`SkeletonLayer`).

    ``mesh``: when given, the chunk axis of the input is expected sharded over its ``'time'`` axis
    (and the batch over ``'data'``) and halos are exchanged between devices.
    """
    common = dict(
        dim=config.dim, depth=config.depth, latent_dim=config.latent_dim, stride=config.stride,
        residual=config.residual, dropout=config.dropout, dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype), mesh=mesh, rngs=rngs, stages=config.stages,
        kinematics=_kinematics(config, info), highpass=config.highpass, upsample=config.upsample,
    )
    if config.name == "dct_mlp":
        if config.global_rotations or config.position_head:
            raise ValueError("model.name='dct_mlp' has one head (rotations and root); model.global_rotations "
                             "and model.position_head are the autoencoders'")
        return DCTPredictor(feature_dim, observed, dim=config.dim, depth=config.depth,
                            mlp_ratio=config.mlp_ratio, dropout=config.dropout, dtype=common["dtype"],
                            param_dtype=common["param_dtype"], rngs=rngs, kinematics=common["kinematics"],
                            keep=config.dct_keep)
    if config.name == "transformer":
        return MotionTransformer(feature_dim, chunk, heads=config.heads, mlp_ratio=config.mlp_ratio,
                                 halo=config.halo, **common)
    if config.name == "tconv":
        return TemporalConvNet(feature_dim, chunk, kernel=config.kernel, **common)
    raise ValueError(f"unknown model.name {config.name!r}; expected 'transformer', 'tconv' or 'dct_mlp'")
