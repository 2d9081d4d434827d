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

from collections.abc import Callable
from typing import NamedTuple

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


def component_sum(x, keepdims: bool = False):
    """``x [..., K] -> [...]``: the sum over the few components of the last axis, added one by one.

    Elementwise adds, which XLA fuses with their neighbours; a ``sum(axis=-1)`` over a 3- or
    4-wide minor axis becomes a reduction that XLA:CPU hands to a library kernel (YNNPACK) as its
    own pass, ~10 ns an element: the norms and dots of the device augmentation program took 1.2 of
    its 2.4 ms that way (32 x 32 x 15 rotations)."""
    s = x[..., 0]
    for i in range(1, x.shape[-1]):
        s = s + x[..., i]
    return s[..., None] if keepdims else s


def materialize(x):
    """``x``, computed once as its own pass (jax: an optimization barrier; numpy: ``x`` itself).

    XLA fuses a cheap producer into each of its consumers and recomputes it there; where the
    consumers read ``[..., 3]`` / ``[..., 4]`` components apart (an exp map, a quaternion product)
    that is one recomputation per component, which costs more on XLA:CPU than one pass to memory."""
    return x if _xp(x) is np else jax.lax.optimization_barrier(x)


def _safe_norm(v, axis=-1, keepdims=False):
    """Norm with a finite gradient at zero."""
    xp = _xp(v)
    sq = (component_sum(v * v, keepdims) if axis in (-1, v.ndim - 1)
          else xp.sum(v * v, axis=axis, keepdims=keepdims))
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
    b = xp.where(component_sum(a * b, keepdims=True) < 0, -b, b)
    return quat_normalize(a + (b - a) * t[..., None])


def relative_rotation_vector(q_from, q_to):
    """Rotation vector of ``q_to ⊗ q_from⁻¹`` (the world-frame rotation taking one to the other)."""
    return quat_to_axis_angle(quat_mul(q_to, quat_conj(q_from)))


# The component-major layout: ``[3 or 4, ...]`` arrays, components first (the tree layout of
# :mod:`motionjax.core.kinematics`, where every op is elementwise on contiguous frames). The same
# formulas as the ``[..., 4]`` functions above, so both layouts give the same numbers; ``*_cm``.

def cross_cm(a, b):
    ax, ay, az = a[0], a[1], a[2]
    bx, by, bz = b[0], b[1], b[2]
    return _xp(a, b).stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx])


def quat_mul_cm(a, b):
    aw, ax, ay, az = a[0], a[1], a[2], a[3]
    bw, bx, by, bz = b[0], b[1], b[2], b[3]
    return _xp(a, b).stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ])


def quat_conj_cm(q):
    return _xp(q).concatenate([q[:1], -q[1:]])


def quat_rotate_cm(q, v):
    t = 2.0 * cross_cm(q[1:], v)
    return v + q[:1] * t + cross_cm(q[1:], t)


def quat_to_axis_angle_cm(q):
    """:func:`quat_to_axis_angle` on ``[4, ...]`` -> ``[3, ...]``."""
    q = jnp.where(q[:1] < 0, -q, q)
    w, u = q[:1], q[1:]
    sq = jnp.sum(u * u, axis=0, keepdims=True)
    nonzero = sq > 0
    s = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, sq, 1.0)), 0.0)
    small = s < _SMALL
    safe_s = jnp.where(small, 1.0, s)
    safe_w = jnp.where(small, w, 1.0)
    k = jnp.where(small, 2.0 / safe_w * (1.0 - s**2 / (3.0 * safe_w**2)), 2.0 * jnp.arctan2(s, w) / safe_s)
    return k * u



# The same three products for reverse mode with their own VJPs. XLA transposes each component read
# (``a[0]``) into a pad of the cotangent to all components, one full-size buffer per read; the rules
# below are the same algebra again (stacks of elementwise products), so the backward pass has none:
#   a × b:       ā = b × g,            b̄ = g × a
#   a ⊗ b:       ā = g ⊗ b*,           b̄ = a* ⊗ g      (x ↦ x ⊗ b has the transpose x ↦ x ⊗ b*)
#   rotate(q, v) = v + w·t + u × t, t = 2 u × v:
#                v̄ = rotate(q*, g),    w̄ = g·t,        ū = 2w (v × g) + t × g + 2 v × (g × u)
# With the pair tree sums of kinematics and the stencil VJP of the dynamics loss, measured in one process,
# interleaved (J = 24, loss + gradient): 1.20× faster at 1,024 frames, 1.19× at 4,096.

def _varying_axes(x) -> frozenset:
    """The mesh axes ``x`` varies over inside ``jax.shard_map`` (empty outside)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax >= 0.10; earlier: aval.vma
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def _unbroadcast(g, like):
    """The cotangent ``g`` of an operand ``like`` that was broadcast against the other (offsets,
    hinge axes): summed over the broadcast axes and, inside ``jax.shard_map``, over the mesh axes
    ``like`` is replicated on (the transpose of a broadcast is a sum)."""
    shape = like.shape
    if g.shape != shape:
        lead = g.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                          if n == 1 and g.shape[lead + i] != 1)
        g = jnp.sum(g, axis=axes, keepdims=True).reshape(shape)
    replicated = _varying_axes(g) - _varying_axes(like)
    return jax.lax.psum(g, tuple(sorted(replicated))) if replicated else g


@jax.custom_vjp
def _cross_reverse(a, b):
    return cross_cm(a, b)


_cross_reverse.defvjp(lambda a, b: (cross_cm(a, b), (a, b)),
                      lambda ab, g: (_unbroadcast(cross_cm(ab[1], g), ab[0]),
                                     _unbroadcast(cross_cm(g, ab[0]), ab[1])))


@jax.custom_vjp
def _quat_mul_reverse(a, b):
    return quat_mul_cm(a, b)


_quat_mul_reverse.defvjp(lambda a, b: (quat_mul_cm(a, b), (a, b)),
                         lambda ab, g: (_unbroadcast(quat_mul_cm(g, quat_conj_cm(ab[1])), ab[0]),
                                        _unbroadcast(quat_mul_cm(quat_conj_cm(ab[0]), g), ab[1])))


def _quat_rotate_vjp(qv, g):
    q, v = qv
    w, u = q[:1], q[1:]
    t = 2.0 * cross_cm(u, v)
    grad_w = (g[0] * t[0] + g[1] * t[1] + g[2] * t[2])[None]
    grad_u = 2.0 * w * cross_cm(v, g) + cross_cm(t, g) + 2.0 * cross_cm(v, cross_cm(g, u))
    grad_v = quat_rotate_cm(quat_conj_cm(q), g)
    return _unbroadcast(jnp.concatenate([grad_w, grad_u]), q), _unbroadcast(grad_v, v)


@jax.custom_vjp
def _quat_rotate_reverse(q, v):
    return quat_rotate_cm(q, v)


_quat_rotate_reverse.defvjp(lambda q, v: (quat_rotate_cm(q, v), (q, v)), _quat_rotate_vjp)


class Algebra(NamedTuple):
    cross: Callable
    quat_mul: Callable
    quat_rotate: Callable


def algebra(custom_vjp: bool = False) -> Algebra:
    """``(cross_cm, quat_mul_cm, quat_rotate_cm)``; ``custom_vjp``: the versions
    with their own VJPs (reverse mode only, as in :func:`tree_scan`)."""
    if custom_vjp:
        return Algebra(_cross_reverse, _quat_mul_reverse, _quat_rotate_reverse)
    return Algebra(cross_cm, quat_mul_cm, quat_rotate_cm)
