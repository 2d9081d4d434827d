"""Forward kinematics over a skeleton, one batched op per tree depth level.

Joints at the same depth are independent given their parents, so FK runs ``depth`` steps, each a
gather of the previous level's results plus one vectorised quaternion product and rotation
(the scheme of MuJoCo MJX's ``scan.body_tree``). A 24-joint body traces ~8 levels, not 24 joints.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from motionjax import rotations as rot
from motionjax.skeleton import Skeleton


def _level_plan(skeleton: Skeleton):
    """Per level: joint ids and each joint's parent's slot in the previous level's arrays."""
    slot = np.zeros(skeleton.num_joints, int)
    plan = []
    for ids in skeleton.levels:
        slot[ids] = np.arange(len(ids))
        parent_slot = slot[np.asarray(skeleton.parents)[ids]] if plan else None
        plan.append((ids, parent_slot))
    order = np.concatenate(skeleton.levels)
    return plan, np.argsort(order)  # argsort(order) maps joint id -> row in the level concat


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
    rotations = xp.asarray(rotations)
    offsets = xp.asarray(skeleton.offsets if offsets is None else offsets, rotations.dtype)
    offsets = xp.broadcast_to(offsets, rotations.shape[:-1] + (3,))
    plan, unpermute = _level_plan(skeleton)

    world_rot = [rotations[..., :1, :]]
    world_pos = [xp.asarray(root_position, rotations.dtype)[..., None, :]]
    for ids, parent_slot in plan[1:]:
        parent_rot = world_rot[-1][..., parent_slot, :]
        parent_pos = world_pos[-1][..., parent_slot, :]
        world_pos.append(parent_pos + rot.quat_rotate(parent_rot, offsets[..., ids, :]))
        world_rot.append(rot.quat_mul(parent_rot, rotations[..., ids, :]))
    positions = xp.concatenate(world_pos, axis=-2)[..., unpermute, :]
    world_rotations = xp.concatenate(world_rot, axis=-2)[..., unpermute, :]
    return positions, world_rotations


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


def pack_dofs(skeleton: Skeleton, root, joints):
    """``root [..., 3]``, padded ``joints [..., J, 3]`` -> generalized vector ``[..., num_dof]``."""
    flat = joints.reshape(*joints.shape[:-2], -1)
    return jnp.concatenate([root, flat[..., _dof_columns(skeleton)]], axis=-1)


def unpack_dofs(skeleton: Skeleton, q):
    """Inverse of :func:`pack_dofs`: ``[..., num_dof]`` -> ``(root [..., 3], joints [..., J, 3])``."""
    columns = _dof_columns(skeleton)
    source = np.zeros(3 * skeleton.num_joints, int)  # padded slot -> packed index (gather, no scatter)
    source[columns] = np.arange(len(columns))
    used = np.zeros(3 * skeleton.num_joints, bool)
    used[columns] = True
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


def _ancestor_sum(skeleton: Skeleton, x):
    """``[..., J, C]`` -> ``Σ_{k ∈ ancestors(j) ∪ {j}} x_k``, a prefix sum down the tree."""
    mask = jnp.asarray(skeleton.ancestor_mask, x.dtype)
    return jnp.einsum("jk,...kc->...jc", mask, x)


def _subtree_sum(skeleton: Skeleton, x):
    """``[..., J, C]`` -> ``Σ_{j ∈ subtree(k)} x_j``, the transpose of :func:`_ancestor_sum`."""
    mask = jnp.asarray(skeleton.ancestor_mask, x.dtype)
    return jnp.einsum("jk,...jc->...kc", mask, x)


def jacobian_vector_product(skeleton: Skeleton, positions, world_rotations, joint_velocity, root_velocity):
    """``J·q̇``: joint linear velocities ``[..., J, 3]`` without forming J.

    ``v_j = v_root + Σ_k ω_k × (p_j - p_k)`` over ancestors ``k``, with ``ω_k = D_k θ̇_k``, factors
    into ``Ω_j × p_j - U_j`` where ``Ω`` and ``U`` are prefix sums of ``ω_k`` and ``ω_k × p_k``.

    Args:
      positions, world_rotations: ``[..., J, 3]``, ``[..., J, 4]`` from :func:`forward_kinematics`.
      joint_velocity: ``[..., J, 3]`` padded DOF velocities (world frame, relative to the parent).
      root_velocity: ``[..., 3]``.
    """
    # Levers are translation invariant; measuring from the root keeps float32 cancellation small.
    local = positions - positions[..., :1, :]
    omega = dofs_to_world(skeleton, world_rotations, joint_velocity)
    summed = _ancestor_sum(skeleton, jnp.concatenate([omega, jnp.cross(omega, local)], axis=-1))
    return root_velocity[..., None, :] + jnp.cross(summed[..., :3], local) - summed[..., 3:]


def jacobian_transpose_product(skeleton: Skeleton, positions, world_rotations, forces):
    """``Jᵀ·F``: generalized forces of joint forces ``F [..., J, 3]``, without forming J.

    ``τ_k = D_kᵀ Σ_j (p_j - p_k) × F_j`` over the subtree of ``k`` factors into
    ``D_kᵀ (M_k - p_k × S_k)`` with subtree sums ``S = ΣF`` and ``M = Σ p × F``.

    Returns:
      ``(joint_torques [..., J, 3] padded DOF layout, root_force [..., 3])``.
    """
    local = positions - positions[..., :1, :]
    summed = _subtree_sum(skeleton, jnp.concatenate([forces, jnp.cross(local, forces)], axis=-1))
    total_force, moment = summed[..., :3], summed[..., 3:]
    torques = world_to_dofs(skeleton, world_rotations, moment - jnp.cross(local, total_force))
    return torques, total_force[..., 0, :]


def _parent_world_rotations(rotations, world_rotations):
    """``R_parent = R_k ⊗ q_k⁻¹`` per joint (identity for the root), without a gather."""
    return rot.quat_mul(world_rotations, rot.quat_conj(rotations))


def perturbed_positions(skeleton: Skeleton, rotations, root_position, q):
    """FK positions ``[..., J, 3]`` after a generalized displacement ``q [..., num_dof]``.

    The definition of the generalized coordinates as code: the root moves by ``q[:3]`` and each
    joint's local rotation becomes ``R_parent⁻¹ exp(D_k θ_k) R_parent q_k``. At ``q = 0`` its
    ``jax.jacfwd`` is the Jacobian (:func:`jacfwd_jacobian`).
    """
    _, world = forward_kinematics(skeleton, rotations, root_position)
    translation, theta = unpack_dofs(skeleton, q)
    parent = _parent_world_rotations(rotations, world)
    local_delta = rot.quat_rotate(rot.quat_conj(parent), dofs_to_world(skeleton, world, theta))
    perturbed = rot.quat_mul(rot.axis_angle_to_quat(local_delta), rotations)
    return forward_kinematics(skeleton, perturbed, root_position + translation)[0]


def jacfwd_jacobian(skeleton: Skeleton, rotations, root_position):
    """The dense Jacobian ``[..., 3J, num_dof]`` by ``jax.jacfwd`` of FK, frame by frame.

    The straightforward reference: ``num_dof`` forward-mode passes through FK per frame.
    """
    def one_frame(rotations, root_position):
        f = lambda q: perturbed_positions(skeleton, rotations, root_position, q).reshape(-1)
        return jax.jacfwd(f)(jnp.zeros(skeleton.num_dof, rotations.dtype))

    return jnp.vectorize(one_frame, signature="(j,w),(c)->(m,n)")(rotations, root_position)


def autodiff_jacobian_vector_product(skeleton: Skeleton, rotations, root_position, joint_velocity,
                                     root_velocity):
    """:func:`jacobian_vector_product` by one ``jax.jvp`` of FK (no Jacobian, no blocks)."""
    _, world = forward_kinematics(skeleton, rotations, root_position)
    local = rot.quat_rotate(rot.quat_conj(_parent_world_rotations(rotations, world)),
                            dofs_to_world(skeleton, world, joint_velocity))
    # d/dt exp(u t) ⊗ q = ½ [0, u] ⊗ q
    tangent = 0.5 * rot.quat_mul(jnp.concatenate([jnp.zeros_like(local[..., :1]), local], -1), rotations)
    fk = lambda q, r: forward_kinematics(skeleton, q, r)[0]
    return jax.jvp(fk, (rotations, root_position), (tangent, root_velocity))[1]


def autodiff_jacobian_transpose_product(skeleton: Skeleton, rotations, root_position, forces):
    """:func:`jacobian_transpose_product` by one ``jax.vjp`` of FK (no Jacobian, no blocks)."""
    fk = lambda q, r: forward_kinematics(skeleton, q, r)[0]
    _, pullback = jax.vjp(fk, rotations, root_position)
    rotation_cotangent, root_force = pullback(forces)
    _, world = forward_kinematics(skeleton, rotations, root_position)
    # <ḡ, ½[0,u] ⊗ q> = ½ vec(ḡ ⊗ q⁻¹)·u (right multiplication by a unit q is orthogonal),
    # and u = R_parentᵀ δθ maps the local perturbation to the world one.
    moment = 0.5 * rot.quat_mul(rotation_cotangent, rot.quat_conj(rotations))[..., 1:]
    world_moment = rot.quat_rotate(_parent_world_rotations(rotations, world), moment)
    return world_to_dofs(skeleton, world, world_moment), root_force
