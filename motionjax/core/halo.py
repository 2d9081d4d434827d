"""Halo exchange along a sharded time axis, for finite differences and chunk attention.

Code that needs ``w`` neighbour frames on each side of its local time slice calls
:func:`pad_with_halos`. Inside ``jax.shard_map`` with the time axis split over ``axis_name`` the
neighbours come from the adjacent shards by ``jax.lax.ppermute``; outside (``axis_name=None``)
the same function pads the whole sequence, so sharded and unsharded code share one path. At the
two global ends the missing frames repeat the edge frame; callers mask frames whose stencil
reaches past the ends with :func:`valid_frames`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _edge(x, width, axis, first):
    idx = 0 if first else x.shape[axis] - 1
    edge = jax.lax.slice_in_dim(x, idx, idx + 1, axis=axis)
    return jnp.repeat(edge, width, axis=axis)


def pad_with_halos(x, width: int, axis: int, axis_name: str | None = None):
    """``x [..., T_local, ...]`` -> ``[..., width + T_local + width, ...]`` with neighbour frames.

    Requires ``T_local >= width`` when sharded.
    """
    if width == 0:
        return x
    head = jax.lax.slice_in_dim(x, 0, width, axis=axis)
    tail = jax.lax.slice_in_dim(x, x.shape[axis] - width, x.shape[axis], axis=axis)
    left, right = _edge(x, width, axis, True), _edge(x, width, axis, False)
    if axis_name is not None:
        n = jax.lax.axis_size(axis_name)
        if n > 1:
            i = jax.lax.axis_index(axis_name)
            # Shard i receives its left neighbour's tail and its right neighbour's head.
            from_left = jax.lax.ppermute(tail, axis_name, [(s, s + 1) for s in range(n - 1)])
            from_right = jax.lax.ppermute(head, axis_name, [(s + 1, s) for s in range(n - 1)])
            left = jnp.where(i == 0, left, from_left)
            right = jnp.where(i == n - 1, right, from_right)
    return jnp.concatenate([left, x, right], axis=axis)


def valid_frames(t_local: int, width: int, axis_name: str | None = None):
    """``[T_local]`` bool: frames at least ``width`` away from both global sequence ends."""
    offset, total = 0, t_local
    if axis_name is not None:
        offset = jax.lax.axis_index(axis_name) * t_local
        total = jax.lax.axis_size(axis_name) * t_local
    t = offset + jnp.arange(t_local)
    return (t >= width) & (t < total - width)


def stencil_valid(valid, width: int, axis_name: str | None = None):
    """``valid [B, T_local]`` (bool or 0/1) -> ``[B, T_local]`` bool: frames whose whole
    stencil ``t - width .. t + width`` is valid and inside the global sequence. Padding frames
    (``valid = 0``: edge copies past the end of a short segment) then add no finite difference."""
    valid = valid.astype(bool)
    inside = valid_frames(valid.shape[1], width, axis_name)
    padded = pad_with_halos(valid, width, axis=1, axis_name=axis_name)
    t = valid.shape[1]
    whole = functools.reduce(jnp.logical_and, [padded[:, k:k + t] for k in range(2 * width + 1)])
    return whole & inside
