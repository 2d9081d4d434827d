"""Rotation representations as pure functions over arrays with any leading dims: jax arrays in, jax
out (jit- and grad-safe); numpy in, numpy out (the loader's workers run them without jax dispatch).

Conventions: unit quaternions are ``[..., 4]`` in (w, x, y, z) order with the Hamilton product;
matrices ``[..., 3, 3]`` act on column vectors; axis-angle (rotation vectors) are ``[..., 3]``
with the angle as the norm; the 6D representation (Zhou et al., CVPR 2019) is the first two
matrix columns, ``[..., 6]``.

Why our own and not ``jaxlie``: jaxlie wraps each rotation in a pytree object and has no 6D or
Euler conversions; motion code needs plain array-in/array-out functions that broadcast over
``[B, T, J, ...]`` and fuse under jit. The tests check every function against scipy's
independent ``Rotation`` implementation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Below this angle (rad) the Taylor branches take over; float32 sin/cos lose precision there.
_SMALL = 1e-4


def _xp(*arrays):
    """The array module for these inputs: numpy when none is a jax Array (or tracer), else jax.numpy.

    The same functions then serve jitted model code and the numpy-only data workers, which must
    not pay jax's per-op dispatch on every small window.
    """
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def _cross(a, b, xp):
    """``a × b`` over the last axis, written out: numpy's ``cross`` costs ~10x more on small arrays."""
    ax, ay, az = a[..., 0], a[..., 1], a[..., 2]
    bx, by, bz = b[..., 0], b[..., 1], b[..., 2]
    return xp.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], axis=-1)


def _safe_norm(v, axis=-1, keepdims=False):
    """Norm with a finite gradient at zero."""
    xp = _xp(v)
    sq = xp.sum(v * v, axis=axis, keepdims=keepdims)
    nonzero = sq > 0
    return xp.where(nonzero, xp.sqrt(xp.where(nonzero, sq, 1.0)), 0.0)


def identity_quat(shape=(), dtype=jnp.float32, xp=jnp):
    """Identity quaternions ``[*shape, 4]`` (``xp``: the array module, jax.numpy or numpy)."""
    return xp.concatenate([xp.ones((*shape, 1), dtype), xp.zeros((*shape, 3), dtype)], axis=-1)


def quat_normalize(q):
    xp = _xp(q)
    return q / xp.maximum(_safe_norm(q, keepdims=True), 1e-12)


def quat_conj(q):
    xp = _xp(q)
    return q * xp.array([1, -1, -1, -1], q.dtype)


def quat_mul(a, b):
    """Hamilton product ``a ⊗ b`` (apply ``b`` first, then ``a``)."""
    xp = _xp(a, b)
    aw, ax, ay, az = xp.moveaxis(a, -1, 0)
    bw, bx, by, bz = xp.moveaxis(b, -1, 0)
    return xp.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], axis=-1)


def quat_rotate(q, v):
    """Rotate vectors ``v [..., 3]`` by unit quaternions ``q [..., 4]``."""
    xp = _xp(q, v)
    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * _cross(u, v, xp)
    return v + w * t + _cross(u, t, xp)


def quat_canonical(q):
    """Pick the representative with w >= 0 (q and -q are the same rotation)."""
    xp = _xp(q)
    return xp.where(q[..., :1] < 0, -q, q)


def axis_angle_to_quat(v):
    """Exponential map: rotation vector ``[..., 3]`` -> unit quaternion ``[..., 4]``."""
    xp = _xp(v)
    theta = _safe_norm(v, keepdims=True)
    small = theta < _SMALL
    safe_theta = xp.where(small, 1.0, theta)
    # sin(θ/2)/θ with its Taylor expansion near 0 keeps values and gradients finite.
    k = xp.where(small, 0.5 - theta**2 / 48.0, xp.sin(safe_theta / 2) / safe_theta)
    return xp.concatenate([xp.cos(theta / 2), k * v], axis=-1)


def quat_to_axis_angle(q):
    """Logarithm map: unit quaternion -> rotation vector with angle in [0, π]."""
    xp = _xp(q)
    q = quat_canonical(q)
    w, u = q[..., :1], q[..., 1:]
    s = _safe_norm(u, keepdims=True)
    small = s < _SMALL
    safe_s = xp.where(small, 1.0, s)
    safe_w = xp.where(small, w, 1.0)
    # 2·atan2(s, w)/s, with its series 2/w·(1 − s²/(3w²)) near the identity (w ≈ 1 there).
    k = xp.where(small, 2.0 / safe_w * (1.0 - s**2 / (3.0 * safe_w**2)),
                 2.0 * xp.arctan2(s, w) / safe_s)
    return k * u


quat_exp = axis_angle_to_quat
quat_log = quat_to_axis_angle


def quat_to_matrix(q):
    xp = _xp(q)
    w, x, y, z = xp.moveaxis(q, -1, 0)
    return xp.stack([
        xp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        xp.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        xp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], axis=-2)


def _floored_norm(*v, floor: float):
    """``sqrt(|v|² + floor²)`` of a vector given as separate component arrays: the norm, held off
    zero with a finite gradient there. Smooth on purpose: a ``max`` or ``where`` floor made the
    backward pass of :func:`sixd_to_quat` ~8x slower on XLA:CPU."""
    return _xp(*v).sqrt(sum(c * c for c in v) + floor * floor)


def _quat_from_matrix_entries(m):
    """Shepperd's method on ``m[i][j]`` given as separate ``[...]`` arrays -> ``[..., 4]`` (w >= 0).

    All four candidate solutions are formed and, per element, the one built from the largest
    diagonal term kept (no square root of a tiny number is divided by), by a one-hot select: every
    op is elementwise both ways. Stacking ``[..., 3, 3]`` first and slicing it apart made the
    backward pass of :func:`sixd_to_quat` ~7x slower on XLA:CPU (22 vs 3 ms, 43k rotations)."""
    xp = _xp(*m[0], *m[1], *m[2])
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = m
    candidates = [
        (1 + m00 + m11 + m22, m21 - m12, m02 - m20, m10 - m01),
        (m21 - m12, 1 + m00 - m11 - m22, m01 + m10, m02 + m20),
        (m02 - m20, m01 + m10, 1 - m00 + m11 - m22, m12 + m21),
        (m10 - m01, m02 + m20, m12 + m21, 1 - m00 - m11 + m22),
    ]
    best = xp.argmax(xp.stack([c[i] for i, c in enumerate(candidates)]), axis=0)
    q = [sum(xp.where(best == i, c[k], 0.0) for i, c in enumerate(candidates)) for k in range(4)]
    sign = xp.where(q[0] < 0, -1.0, 1.0) / _floored_norm(*q, floor=1e-12)
    return xp.stack([c * sign for c in q], axis=-1)


def matrix_to_quat(m):
    """Rotation matrix ``[..., 3, 3]`` -> unit quaternion (w >= 0), branch-free and stable for all
    angles (Shepperd's method, :func:`_quat_from_matrix_entries`)."""
    m = _xp(m).moveaxis(m, (-2, -1), (0, 1))
    return _quat_from_matrix_entries([list(row) for row in m])


def matrix_to_6d(m):
    """First two columns, ``[..., 6]`` = (col0, col1)."""
    xp = _xp(m)
    return xp.concatenate([m[..., :, 0], m[..., :, 1]], axis=-1)


def _gram_schmidt(d6):
    """``[..., 6]`` -> the three columns of the rotation, each a tuple of 3 ``[...]`` arrays."""
    xp = _xp(d6)
    # Component-major first: reads along the leading axis are contiguous, and so are their transposes.
    d6 = xp.moveaxis(d6, -1, 0)
    a, b = list(d6[:3]), list(d6[3:])
    na = _floored_norm(*a, floor=1e-8)
    c0 = [x / na for x in a]
    dot = sum(x * y for x, y in zip(c0, b, strict=True))
    b = [y - dot * x for x, y in zip(c0, b, strict=True)]
    nb = _floored_norm(*b, floor=1e-8)
    c1 = [y / nb for y in b]
    c2 = [c0[1] * c1[2] - c0[2] * c1[1], c0[2] * c1[0] - c0[0] * c1[2], c0[0] * c1[1] - c0[1] * c1[0]]
    return c0, c1, c2


def sixd_to_matrix(d6):
    """Gram-Schmidt on the two 3-vectors; any non-degenerate 6D input maps to a rotation."""
    columns = _gram_schmidt(d6)
    xp = _xp(d6)
    return xp.stack([xp.stack([c[i] for c in columns], axis=-1) for i in range(3)], axis=-2)


def quat_to_6d(q):
    """The first two columns of :func:`quat_to_matrix`, without the third."""
    xp = _xp(q)
    w, x, y, z = xp.moveaxis(q, -1, 0)
    return xp.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y),
                     2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x)], axis=-1)


def sixd_to_quat(d6):
    """:func:`sixd_to_matrix` then :func:`matrix_to_quat`, without forming the matrix."""
    c0, c1, c2 = _gram_schmidt(d6)
    return _quat_from_matrix_entries([[c0[i], c1[i], c2[i]] for i in range(3)])


def _axis_quat(axis: str, angle):
    """Quaternion of a rotation by ``angle [...]`` about the named principal axis."""
    xp = _xp(angle)
    half = angle / 2
    zero = xp.zeros_like(half)
    vec = [zero, zero, zero]
    vec["xyz".index(axis.lower())] = xp.sin(half)
    return xp.stack([xp.cos(half), *vec], axis=-1)


def euler_to_quat(angles, order: str):
    """Intrinsic Euler angles (rad) ``[..., 3]`` applied in ``order`` (e.g. "ZXY") -> quaternion.

    ``order`` is the BVH channel order: R = R_order[0] · R_order[1] · R_order[2].
    """
    q = _axis_quat(order[0], angles[..., 0])
    for i in (1, 2):
        q = quat_mul(q, _axis_quat(order[i], angles[..., i]))
    return q


def matrix_to_euler(m, order: str):
    """Inverse of :func:`euler_to_quat` on matrices, for any of the 6 Tait-Bryan orders.

    For R = R_a(α)·R_b(β)·R_c(γ) with (a, b, c) a permutation of (x, y, z): R[a, c] = ±sin β,
    α comes from atan2 of R[b, c] and R[c, c], and γ from row b of R_a(α)ᵀ·R = R_b(β)·R_c(γ), so
    the angles reproduce R even at gimbal lock (cos β = 0), where only α ± γ is determined.
    """
    xp = _xp(m)
    i, j, k = ("xyz".index(c) for c in order.lower())
    sign = 1.0 if (j - i) % 3 == 1 else -1.0  # even permutation of xyz
    beta = xp.arctan2(sign * m[..., i, k], xp.hypot(m[..., i, i], m[..., i, j]))
    alpha = xp.arctan2(-sign * m[..., j, k], m[..., k, k])
    s, c = xp.sin(alpha), xp.cos(alpha)
    gamma = xp.arctan2(sign * c * m[..., j, i] + s * m[..., k, i], c * m[..., j, j] + sign * s * m[..., k, j])
    return xp.stack([alpha, beta, gamma], axis=-1)


def quat_to_euler(q, order: str):
    return matrix_to_euler(quat_to_matrix(q), order)


def quat_slerp(a, b, t):
    """Spherical interpolation from ``a`` to ``b`` at fraction ``t [...]`` (shortest arc)."""
    xp = _xp(a, b, t)
    b = xp.where(xp.sum(a * b, axis=-1, keepdims=True) < 0, -b, b)
    delta = quat_to_axis_angle(quat_mul(quat_conj(a), b))
    return quat_mul(a, axis_angle_to_quat(delta * t[..., None]))


def quat_nlerp(a, b, t):
    """Normalized linear interpolation from ``a`` to ``b`` at ``t [...]`` (shortest arc).

    Within ``θ³/200`` rad of :func:`quat_slerp` for ``a``, ``b`` ``θ`` rad apart (5e-6 rad for
    frames 0.1 rad apart) at a fraction of its cost: enough to resample neighbouring frames.
    """
    xp = _xp(a, b, t)
    b = xp.where(xp.sum(a * b, axis=-1, keepdims=True) < 0, -b, b)
    return quat_normalize(a + (b - a) * t[..., None])


def relative_rotation_vector(q_from, q_to):
    """Rotation vector of ``q_to ⊗ q_from⁻¹`` (the world-frame rotation taking one to the other)."""
    return quat_to_axis_angle(quat_mul(q_to, quat_conj(q_from)))
