"""Forward kinematics and the kinematic Jacobian's products over a skeleton, by one tree scan.

Everything that walks the tree goes through :func:`tree_scan`: one batched op per depth level, down
the tree (FK, prefix sums for ``J·q̇``) or up it (subtree sums for ``Jᵀ·F``), the scheme of MuJoCo
MJX's ``scan.body_tree``. A 24-joint body takes ~9 levels, not 24 joints, and no step forms a
dense ``[J, J]`` ancestor mask.

Internally the joint axis is reordered by depth level ("level order": each level a contiguous
block, siblings adjacent) and arrays are component-major, ``[C, J, ...]`` with the frames last:
a level's parents are then whole contiguous rows of frames, gathered with ``memcpy``-like copies,
and every vector or quaternion op is elementwise on contiguous arrays, which XLA:CPU vectorises
(a trailing ``[..., 3]`` axis does not). The level gathers carry their own VJPs: the transpose of
"gather each joint's parent" is "sum each joint's children" and vice versa, both gathers, so
autodiff of any tree scan is again a tree scan, never a scatter-add; for reverse mode the vector
and quaternion products have theirs too (:func:`motionjax.core.rotations.algebra`).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.skeleton import Skeleton


@dataclasses.dataclass(frozen=True, eq=False)
class TreePlan:
    """The static index tables of :func:`tree_scan` for one skeleton.

    ``order [J]``: joint id at each level-order position; ``rank [J]``: its inverse. Per level
    ``d``: ``bounds[d] = (start, stop)`` in level order, ``parent_slot[d] [n_d]`` each joint's
    parent's index within level ``d - 1`` (None at the root level) and ``children[d] [n_d, c_d]``
    each joint's children's indices within level ``d + 1``, padded with ``n_{d+1}`` (a zero row).
    """
    order: np.ndarray
    rank: np.ndarray
    bounds: tuple
    parent_slot: tuple
    children: tuple


@functools.lru_cache(maxsize=64)
def tree_plan(skeleton: Skeleton) -> TreePlan:
    parents = np.asarray(skeleton.parents)
    rank = np.zeros(skeleton.num_joints, int)
    levels = []
    for d, ids in enumerate(skeleton.levels):
        if d:  # siblings adjacent, in the order of their parents
            ids = ids[np.argsort(rank[parents[ids]], kind="stable")]
        start = sum(len(level) for level in levels)
        rank[ids] = start + np.arange(len(ids))
        levels.append(ids)
    order = np.concatenate(levels)
    bounds, parent_slot, children, start = [], [], [], 0
    for d, ids in enumerate(levels):
        bounds.append((start, start + len(ids)))
        parent_slot.append(rank[parents[ids]] - bounds[d - 1][0] if d else None)
        start += len(ids)
    for d, ids in enumerate(levels):
        if d + 1 == len(levels):
            children.append(None)
            continue
        kids = [np.flatnonzero(parent_slot[d + 1] == i) for i in range(len(ids))]
        width = max(1, max(len(k) for k in kids))
        table = np.full((len(ids), width), len(levels[d + 1]), int)
        for i, k in enumerate(kids):
            table[i, :len(k)] = k
        children.append(table)
    return TreePlan(order, np.argsort(order), tuple(bounds), tuple(parent_slot), tuple(children))


# Per-level gathers along axis 1 of ``[C, n, ...]`` arrays, each the other's transpose.

def _gather_parents_impl(plan, level, x):
    return jnp.take(x, plan.parent_slot[level], axis=1) if not _is_numpy(x) else x[:, plan.parent_slot[level]]


def _sum_children_impl(plan, level, x):
    table = plan.children[level]
    if table.shape[1] == 1 and (table[:, 0] < x.shape[1]).all():
        return jnp.take(x, table[:, 0], axis=1)
    padded = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
    return sum(jnp.take(padded, table[:, c], axis=1) for c in range(table.shape[1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _gather_parents(plan, level, x):
    """``[C, n_{d-1}, ...]`` -> ``[C, n_d, ...]``: each level-``d`` joint's parent's row."""
    return _gather_parents_impl(plan, level, x)


_gather_parents.defvjp(lambda plan, level, x: (_gather_parents_impl(plan, level, x), None),
                       lambda plan, level, _, g: (_sum_children(plan, level - 1, g),))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _sum_children(plan, level, x):
    """``[C, n_{d+1}, ...]`` -> ``[C, n_d, ...]``: each level-``d`` joint's sum over its children."""
    return _sum_children_impl(plan, level, x)


_sum_children.defvjp(lambda plan, level, x: (_sum_children_impl(plan, level, x), None),
                     lambda plan, level, _, g: (_gather_parents(plan, level + 1, g),))


def _split_levels_impl(plan, x):
    return tuple(x[:, start:stop] for start, stop in plan.bounds)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _split_levels(plan, x):
    """``[C, J, ...]`` -> one ``[C, n_d, ...]`` block per level. XLA transposes each slice into a
    pad to all ``J`` rows (``depth × J`` rows written and summed); the transpose here is one
    concatenate."""
    return _split_levels_impl(plan, x)


_split_levels.defvjp(lambda plan, x: (_split_levels_impl(plan, x), None),
                     lambda plan, _, g: (jnp.concatenate(g, axis=1),))


def _is_numpy(x):
    return isinstance(x, np.ndarray)


def tree_scan(skeleton: Skeleton, fn, xs, reverse: bool = False, custom_vjp: bool = False):
    """Scan ``fn`` over the tree one depth level at a time (MJX ``scan.body_tree``).

    Args:
      skeleton: the tree.
      fn: ``fn(carry, x) -> y``. Down the tree (``reverse=False``) ``carry`` is the parent's ``y``
        (None at the root); up the tree it is the sum of the children's ``y`` (None at the deepest
        level; a leaf elsewhere gets zeros). ``x`` and ``y`` are pytrees of ``[C, n, ...]`` arrays
        for one level's ``n`` joints.
      xs: a pytree of ``[C, J, ...]`` arrays in level order (:func:`to_tree_layout`).
      custom_vjp: level gathers whose VJPs are the opposite gathers (children sums for parent
        gathers and back), not XLA's scatter-adds: faster reverse mode, but no forward mode
        (``jax.jvp``/``jacfwd``), so off by default.

    Returns:
      The pytree of ``y`` for every joint, ``[C, J, ...]`` in level order. Works on numpy arrays
      too (no autodiff there).
    """
    plan = tree_plan(skeleton)
    leaves = jax.tree.leaves(xs)
    numpy = all(_is_numpy(a) for a in leaves)
    xp = np if numpy else jnp
    if custom_vjp and not numpy:
        per_leaf = [_split_levels(plan, a) for a in leaves]
        level_x = [jax.tree.unflatten(jax.tree.structure(xs), [p[d] for p in per_leaf])
                   for d in range(len(plan.bounds))]
    else:
        level_x = [jax.tree.map(lambda a, b=b: a[:, b[0]:b[1]], xs) for b in plan.bounds]
    if numpy:
        parents = lambda d, t: jax.tree.map(lambda a: _gather_parents_impl(plan, d, a), t)
        kids = lambda d, t: jax.tree.map(
            lambda a: np.concatenate([a, np.zeros_like(a[:, :1])], 1)[:, plan.children[d]].sum(2), t)
    elif custom_vjp:
        parents = lambda d, t: jax.tree.map(lambda a: _gather_parents(plan, d, a), t)
        kids = lambda d, t: jax.tree.map(lambda a: _sum_children(plan, d, a), t)
    else:
        parents = lambda d, t: jax.tree.map(lambda a: _gather_parents_impl(plan, d, a), t)
        kids = lambda d, t: jax.tree.map(lambda a: _sum_children_impl(plan, d, a), t)
    depth = len(plan.bounds)
    out = [None] * depth
    if not reverse:
        for d in range(depth):
            out[d] = fn(parents(d, out[d - 1]) if d else None, level_x[d])
    else:
        for d in reversed(range(depth)):
            out[d] = fn(kids(d, out[d + 1]) if d + 1 < depth else None, level_x[d])
    return jax.tree.map(lambda *a: xp.concatenate(a, axis=1), *out)


def _add(a, b):
    return b if a is None else jax.tree.map(lambda u, v: u + v, a, b)


def prefix_sum(skeleton: Skeleton, x, custom_vjp: bool = False):
    """``[C, J, ...]`` (level order; or a pytree of them) -> ``Σ_{k ∈ ancestors(j) ∪ {j}} x_k``,
    down the tree."""
    return tree_scan(skeleton, _add, x, custom_vjp=custom_vjp)


def subtree_sum(skeleton: Skeleton, x, custom_vjp: bool = False):
    """``[C, J, ...]`` (level order; or a pytree of them) -> ``Σ_{j ∈ subtree(k)} x_j``, up the tree
    (the transpose of :func:`prefix_sum`)."""
    return tree_scan(skeleton, _add, x, reverse=True, custom_vjp=custom_vjp)


# Layout conversion. A permutation's transpose is the inverse permutation (a gather, no scatter).

@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _permute(x, perm, axis):
    return jnp.take(x, np.asarray(perm), axis=axis)


_permute.defvjp(lambda x, perm, axis: (_permute(x, perm, axis), None),
                lambda perm, axis, _, g: (_permute(g, tuple(np.argsort(perm)), axis),))


def _take(x, perm, axis, custom_vjp):
    if _is_numpy(x):
        return np.take(x, perm, axis=axis)
    if custom_vjp:
        return _permute(x, tuple(int(i) for i in perm), axis)
    return jnp.take(x, perm, axis=axis)


def to_tree_layout(skeleton: Skeleton, x, custom_vjp: bool = False):
    """``[..., J, C]`` -> ``[C, J, ...]`` in level order (numpy in, numpy out)."""
    xp = np if _is_numpy(x) else jnp
    return _take(xp.moveaxis(x, (-1, -2), (0, 1)), tree_plan(skeleton).order, 1, custom_vjp)


def from_tree_layout(skeleton: Skeleton, x, custom_vjp: bool = False):
    """Inverse of :func:`to_tree_layout`: ``[C, J, ...]`` -> ``[..., J, C]``."""
    xp = np if _is_numpy(x) else jnp
    return xp.moveaxis(_take(x, tree_plan(skeleton).rank, 1, custom_vjp), (0, 1), (-1, -2))


def _xp_of(*arrays):
    return np if all(_is_numpy(a) for a in arrays) else jnp


def _fk_tree(skeleton: Skeleton, rotations, root_position, offsets, custom_vjp=False):
    """FK in the tree layout: ``rotations [4, J, ...]``, ``root_position [3, ...]``, ``offsets``
    ``[3, J, ...]`` (broadcastable) -> ``(positions [3, J, ...], world rotations [4, J, ...])``."""
    xp = _xp_of(rotations, root_position, offsets)
    ops = rot.algebra(custom_vjp and xp is jnp)

    def step(parent, x):
        q, offset = x
        if parent is None:  # the root: its rotation is already a world rotation
            return xp.broadcast_to(root_position[:, None], (3,) + q.shape[1:]), q
        parent_pos, parent_rot = parent
        return parent_pos + ops.quat_rotate(parent_rot, offset), ops.quat_mul(parent_rot, q)

    offsets = xp.broadcast_to(offsets, (3,) + rotations.shape[1:])
    return tree_scan(skeleton, step, (rotations, offsets), custom_vjp=custom_vjp)


def _offsets_tree(skeleton: Skeleton, offsets, batch_ndim: int, dtype, xp):
    """Offsets ``[J, 3]`` or ``[..., J, 3]`` -> ``[3, J, ...]`` broadcastable against the batch."""
    offsets = xp.asarray(skeleton.offsets if offsets is None else offsets, dtype)
    tree = to_tree_layout(skeleton, offsets)  # [3, J, *own batch]
    missing = batch_ndim - (offsets.ndim - 2)
    return tree.reshape(tree.shape[:2] + (1,) * missing + tree.shape[2:])


def forward_kinematics(skeleton: Skeleton, rotations, root_position, offsets=None):
    """World joint positions and rotations.

    Args:
      skeleton: the kinematic tree.
      rotations: ``[..., J, 4]`` local joint rotations (unit quaternions, wxyz); joint 0's is the
        root's world rotation.
      root_position: ``[..., 3]`` world position of joint 0.
      offsets: optional ``[J, 3]`` or ``[..., J, 3]`` joint translations replacing the skeleton's
        rest offsets (per-frame translation channels, retargeted bone lengths).

    Returns:
      ``(positions [..., J, 3], world_rotations [..., J, 4])``.
    """
    xp = rot._xp(rotations, root_position, offsets)  # numpy in, numpy out (the data workers)
    positions, world = forward_kinematics_tree(skeleton, rotations, root_position, offsets, xp=xp)
    return from_tree_layout(skeleton, positions), from_tree_layout(skeleton, world)


def forward_kinematics_tree(skeleton: Skeleton, rotations, root_position, offsets=None, xp=jnp,
                            custom_vjp: bool = False):
    """:func:`forward_kinematics` with results in the tree layout: ``(positions [3, J, ...], world
    rotations [4, J, ...])``, level order (the dynamics loss keeps working in it). ``custom_vjp``:
    see :func:`tree_scan`."""
    rotations = xp.asarray(rotations)
    batch = rotations.shape[:-2]
    root = xp.moveaxis(xp.asarray(root_position, rotations.dtype), -1, 0)
    root = xp.broadcast_to(root, (3,) + batch)
    offsets = _offsets_tree(skeleton, offsets, len(batch), rotations.dtype, xp)
    return _fk_tree(skeleton, to_tree_layout(skeleton, rotations, custom_vjp), root, offsets, custom_vjp)


@functools.lru_cache(maxsize=64)
def ik_plan(skeleton: Skeleton):
    """Static tables of :func:`inverse_kinematics`, per joint ``j`` (joint order):

    ``targets [J, K]``: the joints ``j``'s rotation places, its children and, through fixed joints,
    their descendants, the longest rest vector first (the "primary"), padded with ``j``;
    ``rest [J, K, 3]``: each target's rest vector from ``j`` in ``j``'s frame (zero for padding);
    ``swing [J]``: a ball joint with a target (its primary target is met exactly);
    ``weights [J, K]``: the targets the least-squares turn about one axis fits (a ball joint's
    secondary targets, about the primary's direction; all of a hinge's, about its axis).
    Zero-length targets (end sites at their parent) carry no direction and are left out."""
    num, parents, kinds = skeleton.num_joints, skeleton.parents, skeleton.kinds
    found = [[] for _ in range(num)]
    for k in range(1, num):
        rest, a = np.array(skeleton.offsets[k], float), parents[k]
        while a > 0 and kinds[a] == "fixed":  # a fixed joint turns with its parent
            rest, a = rest + skeleton.offsets[a], parents[a]
        if np.linalg.norm(rest) > 1e-6:
            found[a].append((np.linalg.norm(rest), k, rest))
    width = max(1, max(len(f) for f in found))
    targets = np.repeat(np.arange(num)[:, None], width, axis=1)
    rest, weights = np.zeros((num, width, 3)), np.zeros((num, width))
    swing = np.zeros(num, bool)
    for j, f in enumerate(found):
        for i, (_, k, r) in enumerate(sorted(f, key=lambda e: -e[0])):
            targets[j, i], rest[j, i] = k, r
        swing[j] = kinds[j] == "ball" and bool(f)
        if kinds[j] == "hinge":  # every target, about the hinge axis
            weights[j, : len(f)] = 1
        elif kinds[j] == "ball":  # the secondary targets, about the primary's direction
            weights[j, 1 : len(f)] = 1
    return targets, rest, swing, weights


def _dot(a, b):
    return jnp.sum(a * b, axis=0, keepdims=True)


def _normalized(v, eps=1e-12):
    return v / jnp.sqrt(_dot(v, v) + eps)


def inverse_kinematics(skeleton: Skeleton, positions, hint):
    """Local joint rotations whose FK on the skeleton's bones places the joints at ``positions``
    (exactly where the bones allow), the rotations the positions leave free taken from ``hint``.

    Down the tree (one level at a time, :func:`tree_scan`), each joint starts from its hint and
    turns to aim at its targets (:func:`ik_plan`) from the position FK has already given it: a
    ball joint by the shortest arc onto its primary target, then about that direction by the
    least-squares angle onto the others (the pelvis: spine exactly, hips fitted); a hinge about its
    axis by the least-squares angle onto all of them. Aiming each bone from the joint FK placed,
    not from the predicted parent, keeps a position error from piling up down a chain. A bone's
    twist and an end joint's rotation (nothing below it has a length) are the hint's.

    Args:
      skeleton: the tree and its rest offsets (the bones FK will use).
      positions: ``[..., J, 3]`` target joint positions; joint 0's is the root position.
      hint: ``[..., J, 4]`` local rotations (unit quaternions, wxyz; identity for fixed joints).

    Returns:
      ``[..., J, 4]`` local rotations; with the positions of FK of ``hint``, ``hint`` again.
    """
    targets, rest, swing, weights = ik_plan(skeleton)
    dtype, batch = positions.dtype, positions.shape[:-2]
    # Static tables stay numpy, so each level skips the steps none of its joints takes.
    const = lambda a: to_tree_layout(skeleton, np.asarray(a, np.float32)).reshape(
        (a.shape[-1], skeleton.num_joints) + (1,) * len(batch))  # [C, J, 1...]
    goal = tuple(to_tree_layout(skeleton, positions[..., targets[:, k], :]) for k in range(targets.shape[1]))
    xs = (to_tree_layout(skeleton, hint), const(skeleton.offsets), goal,
          tuple(const(rest[:, k]) for k in range(rest.shape[1])),
          tuple(const(weights[:, k : k + 1]) for k in range(weights.shape[1])),
          const(swing[:, None]), const(skeleton.axes * (np.array(skeleton.kinds) == "hinge")[:, None]))
    root = jnp.moveaxis(positions[..., 0, :], -1, 0)[:, None]  # [3, 1, ...]
    ex = jnp.asarray([1.0, 0.0, 0.0], dtype).reshape((3, 1) + (1,) * len(batch))

    def step(parent, x):
        q, offset, goal, rest, weights, swing, axis = x
        if parent is None:
            p, parent_rot = root, jnp.zeros_like(q).at[0].set(1.0)
        else:
            parent_pos, parent_rot, _ = parent
            p = parent_pos + rot.quat_rotate_cm(parent_rot, offset)
        world, t = rot.quat_mul_cm(parent_rot, q), ex
        if swing.any():  # shortest arc from where the hint points the primary bone to where it should
            u = _normalized(jnp.where(swing > 0, rot.quat_rotate_cm(world, rest[0]), ex))
            t = _normalized(jnp.where(swing > 0, goal[0] - p, ex))
            arc = jnp.concatenate([1.0 + _dot(u, t), rot.cross_cm(u, t)])
            world = rot.quat_mul_cm(_normalized(arc), world)
        fitted = [k for k, w in enumerate(weights) if w.any()]
        if fitted:  # least-squares turn about one axis: max Σ d·(R v)  =>  θ = atan2(Σ a·(v × d), Σ v⊥·d⊥)
            a = t if not axis.any() else jnp.where(np.sum(axis * axis, 0, keepdims=True) > 0,
                                                    rot.quat_rotate_cm(parent_rot, axis), t)
            sin = cos = 0.0
            for k in fitted:
                v, d = rot.quat_rotate_cm(world, rest[k]), goal[k] - p
                sin = sin + weights[k] * _dot(a, rot.cross_cm(v, d))
                cos = cos + weights[k] * (_dot(v, d) - _dot(v, a) * _dot(d, a))
            fits = sum(weights) > 0
            half = jnp.arctan2(jnp.where(fits, sin, 0.0), jnp.where(fits, cos, 1.0)) / 2
            world = rot.quat_mul_cm(jnp.concatenate([jnp.cos(half), jnp.sin(half) * a]), world)
        return p, world, rot.quat_mul_cm(rot.quat_conj_cm(parent_rot), world)

    return from_tree_layout(skeleton, tree_scan(skeleton, step, xs)[2])


# --------------------------------------------------------------------------------------------
# The kinematic Jacobian ∂p/∂q in block form.
#
# Generalized coordinates q (one ordering for every packed vector and dense matrix here): the root
# translation (3), then each joint in index order with its rotational DOFs: 3 for a ball joint,
# 1 for a hinge, none for a fixed joint. A rotational DOF is a WORLD-frame perturbation of the
# joint: δθ_k turns joint k's world rotation R_k into exp(δθ_k)·R_k, rotating its whole subtree
# about p_k; a hinge turns about its world axis R_parent·axes[k] (= R_k·axes[k]).
# The blocked functions use a padded per-joint layout ``[..., J, 3]`` instead: ball joints use
# all 3 components, hinges component 0, fixed joints none (:func:`pack_dofs` converts).
#
# With D_k ``[3, 3]`` holding joint k's world DOF axes as columns (I; [a, 0, 0]; 0), the block
#     ∂p_j/∂θ_k = -[p_j - p_k]× D_k   for k an ancestor of j (zero otherwise, and zero at k = j),
# and the root translation block is I₃ for every joint. Storing blocks per (joint, ancestor depth)
# costs O(J·depth); the products factor into prefix sums down the tree (J·ω) and subtree sums up
# it (Jᵀ·F), so they never form a block at all.


def ancestor_table(skeleton: Skeleton):
    """Padded ancestor lists ``(ancestors [J, D], valid [J, D])``, ``D`` = number of levels.

    ``ancestors[j, d]`` is ``j``'s ancestor at depth ``d`` (``j`` itself at ``d = depth[j]``);
    entries past ``depth[j]`` are padding (index ``j``, ``valid`` False).
    """
    num_levels = len(skeleton.levels)
    ancestors = np.repeat(np.arange(skeleton.num_joints)[:, None], num_levels, axis=1)
    for j in range(skeleton.num_joints):
        k = j
        while k >= 0:
            ancestors[j, skeleton.depth[k]] = k
            k = skeleton.parents[k]
    valid = np.arange(num_levels)[None, :] <= skeleton.depth[:, None]
    return ancestors, valid


def _dof_constants(skeleton: Skeleton, dtype):
    """``(is_ball [J, 1], hinge_axes [J, 3])`` (hinge axes in the joint frame, zero elsewhere)."""
    is_ball = np.array([k == "ball" for k in skeleton.kinds], float)[:, None]
    hinge_axes = skeleton.axes * np.array([k == "hinge" for k in skeleton.kinds], float)[:, None]
    return jnp.asarray(is_ball, dtype), jnp.asarray(hinge_axes, dtype)


def dofs_to_world(skeleton: Skeleton, world_rotations, joint_velocity):
    """``D_k θ̇_k``: padded DOF values ``[..., J, 3]`` -> world rotation vectors ``[..., J, 3]``."""
    is_ball, hinge_axes = _dof_constants(skeleton, joint_velocity.dtype)
    world_axes = rot.quat_rotate(world_rotations, hinge_axes)
    return is_ball * joint_velocity + world_axes * joint_velocity[..., :1]


def world_to_dofs(skeleton: Skeleton, world_rotations, vectors):
    """``D_kᵀ v_k``: world vectors ``[..., J, 3]`` -> padded DOF values ``[..., J, 3]``."""
    is_ball, hinge_axes = _dof_constants(skeleton, vectors.dtype)
    world_axes = rot.quat_rotate(world_rotations, hinge_axes)
    along_axis = jnp.sum(world_axes * vectors, axis=-1, keepdims=True)
    return is_ball * vectors + along_axis * jnp.asarray([1.0, 0.0, 0.0], vectors.dtype)


def _dof_columns(skeleton: Skeleton) -> np.ndarray:
    """Flat ``3k + b`` index into a padded ``[J, 3]`` layout of every packed rotational DOF."""
    return np.array([3 * k + b for k, n in enumerate(skeleton.dofs) for b in range(n)], int)


def dof_layout(skeleton: Skeleton):
    """The numpy index plan of :func:`pack_dofs` / :func:`unpack_dofs`: ``columns [num_dof - 3]``
    the padded slot ``3k + b`` of each packed rotational DOF, ``source [3J]`` each padded slot's packed
    index (a gather, no scatter) and ``used [3J]`` whether the slot holds a DOF."""
    columns = _dof_columns(skeleton)
    source = np.zeros(3 * skeleton.num_joints, int)
    source[columns] = np.arange(len(columns))
    used = np.zeros(3 * skeleton.num_joints, bool)
    used[columns] = True
    return columns, source, used


def pack_dofs(skeleton: Skeleton, root, joints):
    """``root [..., 3]``, padded ``joints [..., J, 3]`` -> generalized vector ``[..., num_dof]``."""
    flat = joints.reshape(*joints.shape[:-2], -1)
    return jnp.concatenate([root, flat[..., _dof_columns(skeleton)]], axis=-1)


def unpack_dofs(skeleton: Skeleton, q):
    """Inverse of :func:`pack_dofs`: ``[..., num_dof]`` -> ``(root [..., 3], joints [..., J, 3])``."""
    _, source, used = dof_layout(skeleton)
    flat = jnp.where(used, q[..., 3:][..., source], 0.0)
    return q[..., :3], flat.reshape(*q.shape[:-1], skeleton.num_joints, 3)


def _skew(v):
    """``[..., 3]`` -> ``[..., 3, 3]`` with ``skew(v) @ u = v × u``."""
    x, y, z = jnp.moveaxis(v, -1, 0)
    zero = jnp.zeros_like(x)
    return jnp.stack([jnp.stack([zero, -z, y], -1), jnp.stack([z, zero, -x], -1),
                      jnp.stack([-y, x, zero], -1)], axis=-2)


def block_jacobian(skeleton: Skeleton, positions, world_rotations):
    """Rotational blocks of the kinematic Jacobian, ``[..., J, D, 3, 3]``.

    ``blocks[..., j, d]`` is ``∂p_j/∂θ_k`` for ``k = ancestor_table(skeleton)[0][j, d]`` in the
    padded DOF layout (columns past a joint's DOF count are zero; padding entries are zero). The
    root translation block is the identity for every joint and is not stored.

    Args:
      positions, world_rotations: ``[..., J, 3]``, ``[..., J, 4]`` from :func:`forward_kinematics`.
    """
    ancestors, valid = ancestor_table(skeleton)
    eye = jnp.eye(3, dtype=positions.dtype)
    axes = jnp.stack([dofs_to_world(skeleton, world_rotations, jnp.broadcast_to(eye[b], positions.shape))
                      for b in range(3)], axis=-1)  # D_k [..., J, 3, 3], columns = DOF directions
    lever = positions[..., :, None, :] - positions[..., ancestors, :]  # p_j - p_k  [..., J, D, 3]
    blocks = -_skew(lever) @ axes[..., ancestors, :, :]
    return jnp.where(valid[:, :, None, None], blocks, 0.0)


def dense_jacobian(skeleton: Skeleton, positions, world_rotations):
    """The full Jacobian ``[..., 3J, num_dof]`` (rows ``3j + xyz``), assembled from the blocks.

    For tests and plots: it costs O(J²) memory per frame, which the blocked products avoid.
    """
    ancestors, valid = ancestor_table(skeleton)
    num_joints = skeleton.num_joints
    scatter = (ancestors[:, :, None] == np.arange(num_joints)) & valid[:, :, None]  # [J, D, J]
    blocks = block_jacobian(skeleton, positions, world_rotations)
    rotational = jnp.einsum("jdk,...jdab->...jakb", scatter.astype(blocks.dtype), blocks)
    rotational = rotational.reshape(*rotational.shape[:-4], 3 * num_joints, 3 * num_joints)
    translation = jnp.broadcast_to(jnp.tile(jnp.eye(3, dtype=blocks.dtype), (num_joints, 1)),
                                   rotational.shape[:-1] + (3,))
    return jnp.concatenate([translation, rotational[..., _dof_columns(skeleton)]], axis=-1)


def _dof_constants_tree(skeleton: Skeleton, dtype, batch_ndim: int):
    """``(is_ball [1, J, 1...], hinge_axes [3, J, 1...])`` in the tree layout."""
    is_ball = np.array([k == "ball" for k in skeleton.kinds], float)[:, None]
    hinge_axes = skeleton.axes * np.array([k == "hinge" for k in skeleton.kinds], float)[:, None]
    shape = (1,) * batch_ndim
    return (jnp.asarray(to_tree_layout(skeleton, is_ball).reshape((1, -1) + shape), dtype),
            jnp.asarray(to_tree_layout(skeleton, hinge_axes).reshape((3, -1) + shape), dtype))


def dofs_to_world_tree(skeleton: Skeleton, world_rotations, joint_velocity, custom_vjp: bool = False):
    """:func:`dofs_to_world` in the tree layout (``[4, J, ...]``, ``[3, J, ...]``)."""
    is_ball, hinge_axes = _dof_constants_tree(skeleton, joint_velocity.dtype, joint_velocity.ndim - 2)
    axes = rot.algebra(custom_vjp).quat_rotate(world_rotations, hinge_axes)
    return is_ball * joint_velocity + axes * joint_velocity[:1]


def world_to_dofs_tree(skeleton: Skeleton, world_rotations, vectors, custom_vjp: bool = False):
    """:func:`world_to_dofs` in the tree layout (``[4, J, ...]``, ``[3, J, ...]``)."""
    is_ball, hinge_axes = _dof_constants_tree(skeleton, vectors.dtype, vectors.ndim - 2)
    axes = rot.algebra(custom_vjp).quat_rotate(world_rotations, hinge_axes)
    along_axis = jnp.sum(axes * vectors, axis=0, keepdims=True)
    zero = jnp.zeros_like(along_axis)
    return is_ball * vectors + jnp.concatenate([along_axis, zero, zero])


def jacobian_vector_product_tree(skeleton: Skeleton, positions, world_rotations, joint_velocity,
                                 root_velocity, custom_vjp: bool = False):
    """:func:`jacobian_vector_product` in the tree layout: ``positions [3, J, ...]``,
    ``world_rotations [4, J, ...]``, ``joint_velocity [3, J, ...]``, ``root_velocity [3, ...]`` ->
    ``[3, J, ...]``. One prefix sum (down the tree) of ``(ω, ω × p)``."""
    ops = rot.algebra(custom_vjp)
    # Levers are translation invariant; measuring from the root keeps float32 cancellation small.
    local = positions - positions[:, :1]
    omega = dofs_to_world_tree(skeleton, world_rotations, joint_velocity, custom_vjp)
    # A pair, not one [6, ...] array: slicing the sum apart would transpose into pads.
    total_omega, moment = prefix_sum(skeleton, (omega, ops.cross(omega, local)), custom_vjp)
    return root_velocity[:, None] + ops.cross(total_omega, local) - moment


def jacobian_transpose_product_tree(skeleton: Skeleton, positions, world_rotations, forces,
                                    custom_vjp: bool = False):
    """:func:`jacobian_transpose_product` in the tree layout: ``forces [3, J, ...]`` ->
    ``(torques [3, J, ...], root force [3, ...])``. One subtree sum (up the tree) of
    ``(F, p × F)``."""
    ops = rot.algebra(custom_vjp)
    local = positions - positions[:, :1]
    total_force, moment = subtree_sum(skeleton, (forces, ops.cross(local, forces)), custom_vjp)
    torques = world_to_dofs_tree(skeleton, world_rotations, moment - ops.cross(local, total_force),
                                 custom_vjp)
    return torques, total_force[:, 0]


def jacobian_vector_product(skeleton: Skeleton, positions, world_rotations, joint_velocity, root_velocity):
    """``J·q̇``: joint linear velocities ``[..., J, 3]`` without forming J.

    ``v_j = v_root + Σ_k ω_k × (p_j - p_k)`` over ancestors ``k``, with ``ω_k = D_k θ̇_k``, factors
    into ``Ω_j × p_j - U_j`` where ``Ω`` and ``U`` are prefix sums of ``ω_k`` and ``ω_k × p_k``.

    Args:
      positions, world_rotations: ``[..., J, 3]``, ``[..., J, 4]`` from :func:`forward_kinematics`.
      joint_velocity: ``[..., J, 3]`` padded DOF velocities (world frame, relative to the parent).
      root_velocity: ``[..., 3]``.
    """
    tree = functools.partial(to_tree_layout, skeleton)
    velocity = jacobian_vector_product_tree(skeleton, tree(positions), tree(world_rotations),
                                            tree(joint_velocity), jnp.moveaxis(root_velocity, -1, 0))
    return from_tree_layout(skeleton, velocity)


def jacobian_transpose_product(skeleton: Skeleton, positions, world_rotations, forces):
    """``Jᵀ·F``: generalized forces of joint forces ``F [..., J, 3]``, without forming J.

    ``τ_k = D_kᵀ Σ_j (p_j - p_k) × F_j`` over the subtree of ``k`` factors into
    ``D_kᵀ (M_k - p_k × S_k)`` with subtree sums ``S = ΣF`` and ``M = Σ p × F``.

    Returns:
      ``(joint_torques [..., J, 3] padded DOF layout, root_force [..., 3])``.
    """
    tree = functools.partial(to_tree_layout, skeleton)
    torques, root_force = jacobian_transpose_product_tree(skeleton, tree(positions), tree(world_rotations),
                                                          tree(forces))
    return from_tree_layout(skeleton, torques), jnp.moveaxis(root_force, 0, -1)


def _parent_world_rotations(rotations, world_rotations):
    """``R_parent = R_k ⊗ q_k⁻¹`` per joint (identity for the root), without a gather."""
    return rot.quat_mul(world_rotations, rot.quat_conj(rotations))


def perturbed_positions(skeleton: Skeleton, rotations, root_position, q, offsets=None):
    """FK positions ``[..., J, 3]`` after a generalized displacement ``q [..., num_dof]``.

    The definition of the generalized coordinates as code: the root moves by ``q[:3]`` and each
    joint's local rotation becomes ``R_parent⁻¹ exp(D_k θ_k) R_parent q_k``. At ``q = 0`` its
    ``jax.jacfwd`` is the Jacobian (:func:`jacfwd_jacobian`). ``offsets``: as in :func:`forward_kinematics`.
    """
    _, world = forward_kinematics(skeleton, rotations, root_position, offsets)
    translation, theta = unpack_dofs(skeleton, q)
    parent = _parent_world_rotations(rotations, world)
    local_delta = rot.quat_rotate(rot.quat_conj(parent), dofs_to_world(skeleton, world, theta))
    perturbed = rot.quat_mul(rot.axis_angle_to_quat(local_delta), rotations)
    return forward_kinematics(skeleton, perturbed, root_position + translation, offsets)[0]


def jacfwd_jacobian(skeleton: Skeleton, rotations, root_position, offsets=None):
    """The dense Jacobian ``[..., 3J, num_dof]`` by ``jax.jacfwd`` of FK, frame by frame.

    The straightforward reference: ``num_dof`` forward-mode passes through FK per frame.
    ``offsets``: ``[..., J, 3]`` rest offsets broadcast against the frames, or None (the skeleton's).
    """
    def one_frame(rotations, root_position, offsets):
        f = lambda q: perturbed_positions(skeleton, rotations, root_position, q, offsets).reshape(-1)
        return jax.jacfwd(f)(jnp.zeros(skeleton.num_dof, rotations.dtype))

    if offsets is None:
        offsets = jnp.asarray(skeleton.offsets, rotations.dtype)
    return jnp.vectorize(one_frame, signature="(j,w),(c),(j,k)->(m,n)")(rotations, root_position, offsets)


def autodiff_jacobian_vector_product(skeleton: Skeleton, rotations, root_position, joint_velocity,
                                     root_velocity, offsets=None):
    """:func:`jacobian_vector_product` by one ``jax.jvp`` of FK (no Jacobian, no blocks)."""
    _, world = forward_kinematics(skeleton, rotations, root_position, offsets)
    local = rot.quat_rotate(rot.quat_conj(_parent_world_rotations(rotations, world)),
                            dofs_to_world(skeleton, world, joint_velocity))
    # d/dt exp(u t) ⊗ q = ½ [0, u] ⊗ q
    tangent = 0.5 * rot.quat_mul(jnp.concatenate([jnp.zeros_like(local[..., :1]), local], -1), rotations)
    fk = lambda q, r: forward_kinematics(skeleton, q, r, offsets)[0]
    return jax.jvp(fk, (rotations, root_position), (tangent, root_velocity))[1]


def autodiff_jacobian_transpose_product(skeleton: Skeleton, rotations, root_position, forces, offsets=None):
    """:func:`jacobian_transpose_product` by one ``jax.vjp`` of FK (no Jacobian, no blocks)."""
    fk = lambda q, r: forward_kinematics(skeleton, q, r, offsets)[0]
    _, pullback = jax.vjp(fk, rotations, root_position)
    rotation_cotangent, root_force = pullback(forces)
    _, world = forward_kinematics(skeleton, rotations, root_position, offsets)
    # <ḡ, ½[0,u] ⊗ q> = ½ vec(ḡ ⊗ q⁻¹)·u (right multiplication by a unit q is orthogonal),
    # and u = R_parentᵀ δθ maps the local perturbation to the world one.
    moment = 0.5 * rot.quat_mul(rotation_cotangent, rot.quat_conj(rotations))[..., 1:]
    world_moment = rot.quat_rotate(_parent_world_rotations(rotations, world), moment)
    return world_to_dofs(skeleton, world, world_moment), root_force
