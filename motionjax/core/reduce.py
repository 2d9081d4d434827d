"""Sums over the mesh: masked means exact under sharding, and gradient sums on a compressed wire.

A mean over the valid elements of a sharded array is a global sum over a global count, so each
shard returns ``(sum, count)`` and the division happens once after the ``psum`` (one definition for
every loss). :func:`compressed_psum` and :func:`two_level_psum` sum per-device gradients over a mesh
axis in bf16 or int8 with error feedback, flat or inside-host-then-across (the trainer's use:
:mod:`motionjax.train.grad_reduce`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x, where=None, axis=None):
    """``(Σ x over where, count of where)`` over ``axis`` (None: every axis); ``where``: bool
    broadcastable to ``x`` (None: all). The count has ``x``'s dtype (float32 counts are exact up to
    2**24 elements per shard)."""
    where = jnp.ones_like(x, bool) if where is None else jnp.broadcast_to(where, x.shape)
    return (jnp.sum(jnp.where(where, x, 0.0), axis=axis),
            jnp.sum(where, axis=axis, dtype=jnp.promote_types(x.dtype, jnp.float32)))


def mean_of(total, count):
    """``total / count``, and 0 where nothing was counted (a batch with no valid element adds no
    loss and no gradient, rather than NaN)."""
    return total / jnp.maximum(count, 1.0)


def masked_mean(x, where=None, axis_names=(), axis=None):
    """Mean of ``x`` over the elements where ``where`` (bool broadcastable to ``x``; None: all),
    over ``axis`` (None: every axis), global over the mesh axes ``axis_names`` when called inside
    ``shard_map``."""
    total, count = masked_sum(x, where, axis)
    if axis_names:
        total, count = jax.lax.psum((total, count), axis_names)
    return mean_of(total, count)


# --------------------------------------------------------------------------------------------
# Gradient sums over a mesh axis on a compressed wire (inside shard_map)
# --------------------------------------------------------------------------------------------
WIRE_DTYPES = ("fp32", "bf16", "int8")
BLOCK = 256  # int8: one fp32 scale per this many values (1.6% on top of the int8 payload)


def quantize(x, wire: str):
    """``x [L]`` fp32 (``L`` a multiple of :data:`BLOCK`) -> ``(payload, scales)`` in the ``wire``
    format: bf16 values (no scales), or int8 values ``round(x / s)`` in [-127, 127] with one scale
    ``s = max |x| / 127`` per block of :data:`BLOCK` ``[L / BLOCK]``; fp32 is ``(x, None)``."""
    if wire == "fp32":
        return x, None
    if wire == "bf16":
        return x.astype(jnp.bfloat16), None
    blocks = x.reshape(-1, BLOCK)
    scale = jnp.max(jnp.abs(blocks), axis=1) / 127.0
    safe = jnp.where(scale > 0, scale, 1.0)
    q = jnp.clip(jnp.round(blocks / safe[:, None]), -127, 127).astype(jnp.int8)
    return q.reshape(x.shape), scale


def dequantize(payload, scales, wire: str):
    """Inverse of :func:`quantize`: ``[..., L]`` payload (and ``[..., L / BLOCK]`` scales) -> fp32."""
    if wire != "int8":
        return payload.astype(jnp.float32)
    blocks = payload.astype(jnp.float32).reshape(*payload.shape[:-1], -1, BLOCK)
    return (blocks * scales[..., None]).reshape(payload.shape)


def compressed_psum(x, worker, server, wire: str, axis_name: str, groups=None, ordered: bool = False):
    """``Σ x`` over ``axis_name`` (within each of ``groups``, lists of axis indices; ``None``: the
    whole axis) sent in ``wire`` format, with error feedback; call inside ``shard_map``.

    A reduce-scatter then an all-gather, both in the wire format: each device compresses
    ``x + worker`` and sends its ``k``-th ``1/n`` slice to the ``k``-th device (all-to-all, no
    reduction on the wire, so int8 sums cannot overflow); that device sums the ``n`` decompressed
    slices in fp32, compresses ``sum + server`` and all-gathers it. int8 block scales travel in the
    same messages (one all-to-all and one all-gather per call). What each compression dropped is
    the new ``worker`` / ``server`` residual, added back next step (error feedback, as in
    DoubleSqueeze), so the rounding does not accumulate. Every sum is taken by the device that owns the
    slice, in device order, so it has the same bits whatever carries the messages (a ``psum`` does
    not: XLA:CPU in one process and gloo across processes add in different orders, and training
    amplifies the last bit). fp32: with ``ordered``, the same two collectives uncompressed; without,
    one ``psum`` (one collective's latency instead of two); residuals untouched either way.

    Args:
      x: ``[L]`` fp32, ``L`` a multiple of ``n * BLOCK`` (``n`` devices per group).
      worker: ``[L]`` this device's residual of the first compression.
      server: ``[L / n]`` the residual of the slice this device sums.

    Returns:
      ``(sum [L], worker [L], server [L / n])``; the sum is the same on every device of a group.
    """
    exact = wire == "fp32"
    if exact and not ordered:
        return jax.lax.psum(x, axis_name, axis_index_groups=groups), worker, server
    n = len(groups[0]) if groups else jax.lax.axis_size(axis_name)
    y = x if exact else x + worker
    q, s = quantize(y, wire)
    if not exact:
        worker = y - dequantize(q, s, wire)
    # [n, L / n]: row k goes to device k; row j of the result came from device j. int8 scales ride in
    # the same message (their bytes appended to each row): one collective per stage, not two.
    m = x.shape[0] // n
    sent = _pack(q.reshape(n, m), s, n)
    sent = jax.lax.all_to_all(sent, axis_name, 0, 0, axis_index_groups=groups, tiled=True)
    z = jnp.sum(dequantize(*_unpack(sent, m, wire), wire), axis=0)  # [L / n] fp32, in device order
    if exact:
        return jax.lax.all_gather(z, axis_name, axis_index_groups=groups, tiled=True), worker, server
    z = z + server
    q, s = quantize(z, wire)
    server = z - dequantize(q, s, wire)
    got = jax.lax.all_gather(_pack(q[None], s, 1), axis_name, axis_index_groups=groups, tiled=True)  # [n, .]
    return dequantize(*_unpack(got, m, wire), wire).reshape(-1), worker, server


def _pack(q, scales, rows: int):
    """``q [rows, m]`` int8 (or bf16) and ``scales`` (``[rows * m / BLOCK]`` fp32 or None) -> one
    ``[rows, m (+ 4 m / BLOCK)]`` array: each row's scales appended as their bytes."""
    if scales is None:
        return q
    raw = jax.lax.bitcast_convert_type(scales.reshape(rows, -1), jnp.int8)  # [rows, m / BLOCK, 4]
    return jnp.concatenate([q, raw.reshape(rows, -1)], axis=1)


def _unpack(packed, m: int, wire: str):
    """Inverse of :func:`_pack`: ``[rows, ...]`` -> (payload ``[rows, m]``, scales ``[rows, m / BLOCK]``)."""
    if wire != "int8":
        return packed, None
    raw = packed[:, m:].reshape(packed.shape[0], -1, 4)
    return packed[:, :m], jax.lax.bitcast_convert_type(raw, jnp.float32)


def two_level_psum(x, worker, server, wire: str, axis_name: str, hosts: int, ordered: bool = False):
    """``Σ x`` over ``axis_name`` laid out as ``hosts`` consecutive blocks of ``d`` devices (one block
    per host): an fp32 reduce-scatter inside each host (fast links), :func:`compressed_psum` of each
    device's ``1/d`` slice across the hosts (the slow network carries ``1/d`` of the bytes, in
    ``wire`` format), an fp32 all-gather inside the host. Call inside ``shard_map``.

    ``x [L]`` (``L`` a multiple of ``n * BLOCK``), ``worker [L / d]``, ``server [L / n]`` ->
    ``(sum [L], worker, server)``; ``ordered``: as in :func:`compressed_psum` (fp32 only).
    """
    n = jax.lax.axis_size(axis_name)
    d = n // hosts
    inside = [list(range(h * d, (h + 1) * d)) for h in range(hosts)]
    across = [list(range(i, n, d)) for i in range(d)]
    part = jax.lax.psum_scatter(x, axis_name, scatter_dimension=0, axis_index_groups=inside, tiled=True)
    part, worker, server = compressed_psum(part, worker, server, wire, axis_name, across, ordered)
    return jax.lax.all_gather(part, axis_name, axis_index_groups=inside, tiled=True), worker, server
