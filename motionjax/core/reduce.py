"""Masked means, exact under sharding: one definition for every loss.

A mean over the valid elements of a sharded array is a global sum over a global count, so each
shard returns ``(sum, count)`` and the division happens once after the ``psum``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x, where=None):
    """``(Σ x over where, count of where)``; ``where``: bool broadcastable to ``x`` (None: all).
    The count has ``x``'s dtype (float32 counts are exact up to 2**24 elements per shard)."""
    where = jnp.ones_like(x, bool) if where is None else jnp.broadcast_to(where, x.shape)
    return jnp.sum(jnp.where(where, x, 0.0)), jnp.sum(where, dtype=jnp.promote_types(x.dtype, jnp.float32))


def mean_of(total, count):
    """``total / count``, and 0 where nothing was counted (a batch with no valid element adds no
    loss and no gradient, rather than NaN)."""
    return total / jnp.maximum(count, 1.0)


def masked_mean(x, where=None, axis_names=()):
    """Mean of ``x`` over the elements where ``where`` (bool broadcastable to ``x``; None: all),
    global over the mesh axes ``axis_names`` when called inside ``shard_map``."""
    total, count = masked_sum(x, where)
    if axis_names:
        total, count = jax.lax.psum((total, count), axis_names)
    return mean_of(total, count)
