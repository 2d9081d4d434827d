"""The PyTorch eager peer of the motionjax trainer: what a user would otherwise write.

Same models (:mod:`motionjax.models`' chunked autoencoders, layer for layer, parameters named
alike so the Flax weights copy over: the transformer, and the temporal-conv autoencoder of
``experiments/autoencoder.py`` with its stages, interpolating decoder, FK input positions and IK
position head), same loss (:func:`motionjax.losses.reconstruction_loss` on each window's bones and
real frames, with :func:`motionjax.core.dynamics.dynamics_loss` in either Jacobian form:
``"dense"`` with ``torch.autograd.functional.jacobian`` or ``"blocked"`` with the tree
prefix/subtree sums), same windows, noise and numpy transforms (:mod:`motionjax.data`, read through
a ``torch.utils.data`` ``DataLoader``), same optimizer (AdamW, warmup + cosine, global-norm
clipping). Eager fp32, the way the PyTorch tutorials train. ``tests/test_bench.py`` checks that
models, IK and loss compute the same numbers as motionjax, so the benchmarks compare the speed of
one computation; :func:`run_to_target` is the twin's time to a validation target
(``benchmarks/bench_time_to_target.py --levers optimized,torch``).

torch is an optional extra: ``pip install 'motionjax[bench]'`` (here: ``pip install torch==2.13.0``).
"""
from __future__ import annotations

import contextlib
import math
import time
import typing

import numpy as np
import torch
import torch.nn.functional as F
import tqdm
from torch import nn
from torch.optim._muon import _adjust_lr  # Muon's per-shape rate (torch's own; private in 2.13)

from motionjax.core.dynamics import GRAVITY, HALO
from motionjax.core.features import rotating_joints
from motionjax.core.kinematics import dof_layout, ik_plan, tree_plan
from motionjax.core.skeleton import BALL, HINGE, Skeleton
from motionjax.data import pipeline, transforms
from motionjax.models import POSITION_SCALE, interpolation_weights, stage_strides

# Below this angle the Taylor branches take over (as in motionjax.core.rotations).
_SMALL = 1e-4


# ---------------------------------------------------------------------------------------------
# Rotations (ports of the motionjax.core.rotations functions the loss uses)


def _safe_norm(v, keepdim=False):
    sq = (v * v).sum(-1, keepdim=keepdim)
    nonzero = sq > 0
    return torch.where(nonzero, torch.sqrt(torch.where(nonzero, sq, torch.ones_like(sq))), 0.0)


def quat_mul(a, b):
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], -1)


def quat_conj(q):
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def quat_rotate(q, v):
    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * torch.cross(u, v, dim=-1)
    return v + w * t + torch.cross(u, t, dim=-1)


def axis_angle_to_quat(v):
    theta = _safe_norm(v, keepdim=True)
    small = theta < _SMALL
    safe = torch.where(small, torch.ones_like(theta), theta)
    k = torch.where(small, 0.5 - theta**2 / 48.0, torch.sin(safe / 2) / safe)
    return torch.cat([torch.cos(theta / 2), k * v], -1)


def quat_to_axis_angle(q):
    q = torch.where(q[..., :1] < 0, -q, q)
    w, u = q[..., :1], q[..., 1:]
    s = _safe_norm(u, keepdim=True)
    small = s < _SMALL
    safe_s = torch.where(small, torch.ones_like(s), s)
    safe_w = torch.where(small, w, torch.ones_like(w))
    k = torch.where(small, 2.0 / safe_w * (1.0 - s**2 / (3.0 * safe_w**2)), 2.0 * torch.atan2(s, w) / safe_s)
    return k * u


def sixd_to_matrix(d6):
    a, b = d6[..., :3], d6[..., 3:]
    c0 = a / torch.clamp(_safe_norm(a, keepdim=True), min=1e-8)
    b = b - (c0 * b).sum(-1, keepdim=True) * c0
    c1 = b / torch.clamp(_safe_norm(b, keepdim=True), min=1e-8)
    return torch.stack([c0, c1, torch.cross(c0, c1, dim=-1)], -1)


def matrix_to_quat(m):
    """Shepperd's method, branch-free: the candidate built from the largest diagonal term."""
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    candidates = torch.stack([
        torch.stack([1 + m00 + m11 + m22, m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0],
                     m[..., 1, 0] - m[..., 0, 1]], -1),
        torch.stack([m[..., 2, 1] - m[..., 1, 2], 1 + m00 - m11 - m22, m[..., 0, 1] + m[..., 1, 0],
                     m[..., 0, 2] + m[..., 2, 0]], -1),
        torch.stack([m[..., 0, 2] - m[..., 2, 0], m[..., 0, 1] + m[..., 1, 0], 1 - m00 + m11 - m22,
                     m[..., 1, 2] + m[..., 2, 1]], -1),
        torch.stack([m[..., 1, 0] - m[..., 0, 1], m[..., 0, 2] + m[..., 2, 0], m[..., 1, 2] + m[..., 2, 1],
                     1 - m00 - m11 + m22], -1),
    ], -2)
    best = torch.stack([1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22,
                        1 - m00 - m11 + m22], -1).argmax(-1)
    q = torch.gather(candidates, -2, best[..., None, None].expand(*best.shape, 1, 4))[..., 0, :]
    q = q / torch.clamp(_safe_norm(q, keepdim=True), min=1e-12)
    return torch.where(q[..., :1] < 0, -q, q)


def quat_to_6d(q):
    """The first two columns of the rotation matrix of ``q`` (motionjax.core.rotations.quat_to_6d)."""
    w, x, y, z = q.unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y),
                        2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x)], -1)


# ---------------------------------------------------------------------------------------------
# Kinematics: FK by tree level, the Jacobian products (blocked) and the dense Jacobian


class Body:
    """A skeleton's constant tensors: FK level plan, DOF layout, ancestor mask, masses, feet."""

    def __init__(self, skeleton: Skeleton):
        self.skeleton = skeleton
        j = skeleton.num_joints
        self.num_joints, self.num_dof, self.up_axis = j, skeleton.num_dof, skeleton.up_axis
        plan = tree_plan(skeleton)  # motionjax's level plan: joint ids and parent slots per level
        as_tensor = lambda a: None if a is None else torch.as_tensor(a)
        self.plan = [(torch.as_tensor(plan.order[start:stop]), as_tensor(slot))
                     for (start, stop), slot in zip(plan.bounds, plan.parent_slot, strict=True)]
        self.unpermute = torch.as_tensor(plan.rank)
        self.offsets = torch.as_tensor(skeleton.offsets, dtype=torch.float32)
        self.ancestor_mask = torch.as_tensor(skeleton.ancestor_mask, dtype=torch.float32)
        self.is_ball = torch.tensor([[k == BALL] for k in skeleton.kinds], dtype=torch.float32)
        hinge = np.array([[k == HINGE] for k in skeleton.kinds], float)
        self.hinge_axes = torch.as_tensor(skeleton.axes * hinge, dtype=torch.float32)
        columns, source, used = dof_layout(skeleton)
        self.dof_columns = torch.as_tensor(columns)
        self.dof_source, self.dof_used = torch.as_tensor(source), torch.as_tensor(used)
        masses = np.asarray(skeleton.masses, float)
        self.mass_fractions = torch.as_tensor(masses / masses.sum(), dtype=torch.float32)
        self.feet = torch.as_tensor(skeleton.foot_joints)
        self.rotating = torch.as_tensor(rotating_joints(skeleton))
        self.ik_levels = _ik_levels(skeleton, [ids.numpy() for ids, _ in self.plan], skeleton.axes * hinge)


class _IKLevel(typing.NamedTuple):
    """One tree level of :func:`inverse_kinematics`: ``n`` joints' tables from motionjax's
    :func:`~motionjax.core.kinematics.ik_plan` (None: a step none of them takes)."""

    swing: torch.Tensor | None    # [n, 1] bool: ball joints aimed at their primary target
    primary: tuple                # (target joint ids [n], rest vectors [n, 3])
    fitted: list                  # per fitted target k: (joint ids [n], rest vectors [n, 3], weights [n, 1])
    hinge: tuple | None           # ([n, 1] bool: a hinge, its axis [n, 3] in the parent frame)
    fits: torch.Tensor            # [n, 1] bool: some target is fitted


def _ik_levels(skeleton: Skeleton, levels, axes) -> list[_IKLevel]:
    targets, rest, swing, weights = ik_plan(skeleton)
    f32 = lambda a: torch.as_tensor(np.asarray(a, np.float32))  # noqa: E731
    out = []
    for j in levels:
        hinged = (axes[j] ** 2).sum(-1) > 0
        out.append(_IKLevel(
            swing=torch.as_tensor(swing[j])[:, None] if swing[j].any() else None,
            primary=(torch.as_tensor(targets[j, 0]), f32(rest[j, 0])),
            fitted=[(torch.as_tensor(targets[j, k]), f32(rest[j, k]), f32(weights[j, k])[:, None])
                    for k in range(weights.shape[1]) if weights[j, k].any()],
            hinge=(torch.as_tensor(hinged)[:, None], f32(axes[j])) if hinged.any() else None,
            fits=torch.as_tensor(weights[j].sum(-1) > 0)[:, None]))
    return out


def forward_kinematics(body: Body, rotations, root_position, offsets=None):
    """``rotations [..., J, 4]``, ``root [..., 3]`` -> ``(positions [..., J, 3], world [..., J, 4])``;
    ``offsets`` (broadcast to ``[..., J, 3]``): the bones, else the skeleton's."""
    offsets = (body.offsets if offsets is None else offsets).expand(*rotations.shape[:-1], 3)
    world_rot, world_pos = [rotations[..., :1, :]], [root_position[..., None, :]]
    for ids, parent_slot in body.plan[1:]:
        parent_rot, parent_pos = world_rot[-1][..., parent_slot, :], world_pos[-1][..., parent_slot, :]
        world_pos.append(parent_pos + quat_rotate(parent_rot, offsets[..., ids, :]))
        world_rot.append(quat_mul(parent_rot, rotations[..., ids, :]))
    return torch.cat(world_pos, -2)[..., body.unpermute, :], torch.cat(world_rot, -2)[..., body.unpermute, :]


def _dot(a, b):
    return (a * b).sum(-1, keepdim=True)


def _normalized(v):
    return v / torch.sqrt(_dot(v, v) + 1e-12)


def inverse_kinematics(body: Body, positions, hint):
    """``positions [..., J, 3]`` targets, ``hint [..., J, 4]`` local rotations -> ``[..., J, 4]`` local
    rotations (motionjax.core.kinematics.inverse_kinematics, level by level down the same plan): each
    joint turns from its hint onto its targets, a ball joint by the shortest arc onto the primary
    one and then about it onto the others by least squares, a hinge about its axis."""
    ex = positions.new_tensor([1.0, 0.0, 0.0])
    out_pos, out_world, local = [], [], []
    for (ids, parent_slot), level in zip(body.plan, body.ik_levels, strict=True):
        q = hint[..., ids, :]
        shape = (*q.shape[:-1], 3)  # per-joint vectors [n, 3] expand to it: torch.cross does not broadcast
        if parent_slot is None:  # the root: at its target, turning from the identity
            p, parent_rot = positions[..., ids, :], positions.new_tensor([1.0, 0.0, 0.0, 0.0]).expand_as(q)
        else:
            parent_rot = out_world[-1][..., parent_slot, :]
            p = out_pos[-1][..., parent_slot, :] + quat_rotate(parent_rot, body.offsets[ids].expand(shape))
        world, t = quat_mul(parent_rot, q), ex.expand(shape)
        if level.swing is not None:  # shortest arc from where the hint points the primary bone to its target
            goal, rest = level.primary
            u = _normalized(torch.where(level.swing, quat_rotate(world, rest.expand(shape)), ex))
            t = _normalized(torch.where(level.swing, positions[..., goal, :] - p, ex))
            world = quat_mul(_normalized(torch.cat([1.0 + _dot(u, t), torch.cross(u, t, dim=-1)], -1)), world)
        if level.fitted:  # least-squares turn about one axis: theta = atan2(sum a.(v x d), sum v_perp.d_perp)
            a = t
            if level.hinge is not None:
                hinged, axis = level.hinge
                a = torch.where(hinged, quat_rotate(parent_rot, axis.expand(shape)), t)
            sin = cos = 0.0
            for goal, rest, w in level.fitted:
                v, d = quat_rotate(world, rest.expand(shape)), positions[..., goal, :] - p
                sin = sin + w * _dot(a, torch.cross(v, d, dim=-1))
                cos = cos + w * (_dot(v, d) - _dot(v, a) * _dot(d, a))
            half = torch.atan2(torch.where(level.fits, sin, 0.0), torch.where(level.fits, cos, 1.0)) / 2
            world = quat_mul(torch.cat([torch.cos(half), torch.sin(half) * a], -1), world)
        out_pos.append(p)
        out_world.append(world)
        local.append(quat_mul(quat_conj(parent_rot), world))
    return torch.cat(local, -2)[..., body.unpermute, :]


def dofs_to_world(body: Body, world, joint_velocity):
    return body.is_ball * joint_velocity + quat_rotate(world, body.hinge_axes.expand_as(joint_velocity)) \
        * joint_velocity[..., :1]


def world_to_dofs(body: Body, world, vectors):
    along = (quat_rotate(world, body.hinge_axes.expand_as(vectors)) * vectors).sum(-1, keepdim=True)
    return body.is_ball * vectors + along * vectors.new_tensor([1.0, 0.0, 0.0])


def pack_dofs(body: Body, root, joints):
    return torch.cat([root, joints.flatten(-2)[..., body.dof_columns]], -1)


def unpack_dofs(body: Body, q):
    flat = torch.where(body.dof_used, q[..., 3:][..., body.dof_source], torch.zeros((), dtype=q.dtype))
    return q[..., :3], flat.reshape(*q.shape[:-1], body.num_joints, 3)


def blocked_products(body: Body, positions, world, joint_velocity, root_velocity, forces):
    """``J·q̇`` by prefix sums down the tree and ``Jᵀ·F`` by subtree sums up it (no Jacobian)."""
    local = positions - positions[..., :1, :]
    omega = dofs_to_world(body, world, joint_velocity)
    summed = torch.einsum("jk,...kc->...jc", body.ancestor_mask,
                          torch.cat([omega, torch.cross(omega, local, dim=-1)], -1))
    velocity = root_velocity[..., None, :] + torch.cross(summed[..., :3], local, dim=-1) - summed[..., 3:]
    summed = torch.einsum("jk,...jc->...kc", body.ancestor_mask,
                          torch.cat([forces, torch.cross(local, forces, dim=-1)], -1))
    total, moment = summed[..., :3], summed[..., 3:]
    torques = world_to_dofs(body, world, moment - torch.cross(local, total, dim=-1))
    return velocity, (torques, total[..., 0, :])


def perturbed_positions(body: Body, rotations, root_position, q):
    """FK positions after a generalized displacement ``q [..., num_dof]`` (world-frame DOFs)."""
    _, world = forward_kinematics(body, rotations, root_position)
    translation, theta = unpack_dofs(body, q)
    parent = quat_mul(world, quat_conj(rotations))
    local = quat_rotate(quat_conj(parent), dofs_to_world(body, world, theta))
    perturbed = quat_mul(axis_angle_to_quat(local), rotations)
    return forward_kinematics(body, perturbed, root_position + translation)[0]


def dense_jacobian(body: Body, rotations, root_position):
    """``[M, 3J, num_dof]`` per-frame Jacobians with ``torch.autograd.functional.jacobian``.

    Frames are independent, so the Jacobian of the frame-sum of positions w.r.t. the stacked
    ``[M, num_dof]`` displacements holds every frame's Jacobian (one call, not ``M``).
    ``create_graph`` keeps it differentiable for the training gradient.
    """
    m = rotations.shape[0]
    f = lambda q: perturbed_positions(body, rotations, root_position, q).reshape(m, -1).sum(0)
    q0 = rotations.new_zeros(m, body.num_dof)
    jac = torch.autograd.functional.jacobian(f, q0, create_graph=True, vectorize=True)  # [3J, M, num_dof]
    return jac.permute(1, 0, 2)


def dense_products(body: Body, rotations, root_position, joint_velocity, root_velocity, forces):
    lead = rotations.shape[:-2]
    jac = dense_jacobian(body, rotations.reshape(-1, body.num_joints, 4), root_position.reshape(-1, 3))
    q_dot = pack_dofs(body, root_velocity, joint_velocity).reshape(-1, body.num_dof)
    velocity = torch.einsum("fmn,fn->fm", jac, q_dot).reshape(forces.shape)
    generalized = torch.einsum("fmn,fm->fn", jac, forces.reshape(-1, 3 * body.num_joints)).reshape(*lead, -1)
    root_force, torques = unpack_dofs(body, generalized)
    return velocity, (torques, root_force)


# ---------------------------------------------------------------------------------------------
# Losses (motionjax.losses.reconstruction_loss and motionjax.core.dynamics.dynamics_loss, unsharded)


def _edge_pad(x, width):
    """Repeat the first/last frame ``width`` times along axis 1 (halo padding at the ends)."""
    return torch.cat([x[:, :1].expand(-1, width, *x.shape[2:]), x,
                      x[:, -1:].expand(-1, width, *x.shape[2:])], 1)


def _valid(length, width, device=None):
    t = torch.arange(length, device=device)
    return (t >= width) & (t < length - width)


def _masked_mean(x, where):
    where = where.expand_as(x)
    return torch.where(where, x, torch.zeros_like(x)).sum() / torch.clamp(where.sum(), min=1)


def _stencil_valid(valid, width):
    """``valid [B, T]`` -> frames whose whole stencil ``t - width .. t + width`` is real and inside."""
    padded, t = _edge_pad(valid, width), valid.shape[1]
    whole = torch.stack([padded[:, k:k + t] for k in range(2 * width + 1)]).all(0)
    return whole & _valid(t, width)[None]


def _motion_terms(body, root_position, rotations, fps, jacobian, forces_only, fk):
    """Velocity residual, generalized forces and jerk of one motion ``[B, T, ...]`` with FK ``fk``
    (positions, world rotations) from the reconstruction loss, as motionjax does."""
    length = rotations.shape[1]
    positions, world = fk
    positions_pad, rot_pad = _edge_pad(positions, HALO), _edge_pad(rotations, 1)
    p = lambda s: positions_pad[:, HALO + s:HALO + s + length]
    velocity = (p(1) - p(-1)) * (fps / 2)
    acceleration = (p(1) - 2 * p(0) + p(-1)) * fps**2
    gravity = torch.zeros(3).index_fill_(0, torch.tensor(body.up_axis), -GRAVITY)
    forces = body.mass_fractions[:, None] * (acceleration - gravity)
    q_prev, q_next = rot_pad[:, :-2], rot_pad[:, 2:]
    local_omega = quat_to_axis_angle(quat_mul(q_next, quat_conj(q_prev)))
    parent = quat_mul(world, quat_conj(rotations))
    joint_velocity = world_to_dofs(body, world, quat_rotate(parent, local_omega * (fps / 2)))
    root_velocity = velocity[..., 0, :]
    if jacobian == "blocked":
        predicted, (torques, root_force) = blocked_products(body, positions, world, joint_velocity,
                                                            root_velocity, forces)
    elif jacobian == "dense":
        predicted, (torques, root_force) = dense_products(body, rotations, root_position, joint_velocity,
                                                          root_velocity, forces)
    else:
        raise ValueError(f"the torch peer has jacobian 'blocked' or 'dense', not {jacobian!r}")
    generalized = torch.cat([root_force[..., None, :], torques], -2)
    if forces_only:
        return None, generalized, None
    jerk = (p(2) - 2 * p(1) + 2 * p(-1) - p(-2)) * (fps**3 / 2)
    return predicted - velocity, generalized, jerk


def dynamics_loss(body, pred_root, pred_rot, target_root, target_rot, fps, weights, jacobian, pred_fk,
                  target_fk, valid=None):
    residual, pred_tau, jerk = _motion_terms(body, pred_root, pred_rot, fps, jacobian, False, pred_fk)
    _, target_tau, _ = _motion_terms(body, target_root, target_rot, fps, jacobian, True, target_fk)
    valid = torch.ones(pred_rot.shape[:2], dtype=torch.bool) if valid is None else valid
    # A frame counts where its whole stencil is real: [B, T, 1] against [B, T, J] terms.
    inner, outer = _stencil_valid(valid, 1)[..., None], _stencil_valid(valid, HALO)[..., None]
    sq = lambda x: (x * x).sum(-1)
    terms = {"velocity": _masked_mean(sq(residual), inner),
             "force": _masked_mean(sq(pred_tau - target_tau), inner),
             "jerk": _masked_mean(sq(jerk), outer)}
    return sum(weights.get(k, 0.0) * v for k, v in terms.items()), terms


def _decode(body, x):
    """Features ``[B, T, F]`` -> root ``[B, T, 3]``, quats ``[B, T, J, 4]``, matrices ``[B, T, R, 3, 3]``."""
    r = len(body.rotating)
    mats = sixd_to_matrix(x[..., 3:].reshape(*x.shape[:-1], r, 6))
    quats = torch.zeros(*x.shape[:-1], body.num_joints, 4)
    quats[..., 0] = 1.0
    quats = quats.index_copy(-2, body.rotating, matrix_to_quat(mats))
    return x[..., :3], quats, mats


def reconstruction_loss(cfg, body: Body, fps: float, pred, target, mean, std, offsets=None, valid=None):
    """``pred, target [B, T, F]`` standardized -> ``(loss, terms)``; ``cfg`` = ``config.loss``;
    ``offsets [B, J, 3]``: each window's bones (else the skeleton's); ``valid [B, T]``: real frames
    (padding counts in no term)."""
    pred, target = pred * std + mean, target * std + mean
    valid = torch.ones(pred.shape[:2], dtype=torch.bool) if valid is None else valid.bool()
    frame = valid[..., None]  # [B, T, 1]: per joint
    (p_root, p_rot, p_mat), (t_root, t_rot, t_mat) = _decode(body, pred), _decode(body, target)
    norm = lambda v: torch.sqrt((v * v).sum(-1) + 1e-8)
    terms = {"rotation": _masked_mean(1.0 - ((p_mat * t_mat).sum((-2, -1)) - 1.0) / 2.0, frame)}
    bones = None if offsets is None else offsets[:, None]  # [B, 1, J, 3]: the same bones every frame
    p_fk = forward_kinematics(body, p_rot, p_root, bones)
    t_fk = forward_kinematics(body, t_rot, t_root, bones)
    p_pos, t_pos = p_fk[0], t_fk[0]
    terms["position"] = _masked_mean(norm(p_pos - t_pos), frame)
    rel = lambda pos, root: pos - root[..., None, :]  # root-relative: what MPJPE scores
    terms["pose"] = _masked_mean(norm(rel(p_pos, p_root) - rel(t_pos, t_root)), frame)
    velocity = lambda x: (_edge_pad(x, 1)[:, 2:] - _edge_pad(x, 1)[:, :-2]) * (fps / 2)
    p_feet, t_feet = velocity(p_pos[..., body.feet, :]), velocity(t_pos[..., body.feet, :])
    planted = (norm(t_feet) < cfg.contact_speed) & _stencil_valid(valid, 1)[..., None]
    terms["foot"] = _masked_mean((p_feet**2).sum(-1), planted)
    loss = sum(cfg.get(k, 0.0) * terms[k] for k in ("rotation", "position", "pose", "foot"))
    if cfg.dynamics_weight > 0:
        if cfg.jacobian == "dense" and offsets is not None and not torch.allclose(offsets, body.offsets):
            raise ValueError("the torch peer's dense Jacobian is of the skeleton's bones, not each clip's")
        dyn, _ = dynamics_loss(body, p_root, p_rot, t_root, t_rot, fps, dict(cfg.dynamics), cfg.jacobian,
                               p_fk, t_fk, valid)
        terms["dynamics"] = dyn
        loss = loss + cfg.dynamics_weight * dyn
    return loss, terms


# ---------------------------------------------------------------------------------------------
# The model (motionjax.models.MotionTransformer, unsharded)


def chunk_windows(x, halo):
    """``[B, N, C, D]`` -> each chunk with ``halo`` neighbour frames each side, and ``valid [N, W]``."""
    b, n, c, d = x.shape
    padded = _edge_pad(x.reshape(b, n * c, d), halo)
    left = padded[:, :n * c].reshape(b, n, c, d)[:, :, :halo]
    right = padded[:, 2 * halo:].reshape(b, n, c, d)[:, :, c - halo:]
    t = torch.arange(n)[:, None] * c + torch.arange(-halo, c + halo)[None, :]
    return torch.cat([left, x, right], 2), (t >= 0) & (t < n * c)


def rope(x, positions, max_wavelength):
    half = x.shape[-1] // 2
    freq = max_wavelength ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = positions.float()[:, None, None] * freq
    sin, cos = torch.sin(angle), torch.cos(angle)
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _layer_norm(dim):
    return nn.LayerNorm(dim, eps=1e-6)  # Flax's default epsilon


class AttentionBlock(nn.Module):
    def __init__(self, dim, heads, mlp_ratio, halo, chunk, dropout):
        super().__init__()
        self.heads, self.halo, self.max_wavelength = heads, halo, 4.0 * (chunk + 2 * halo)
        self.norm1, self.norm2 = _layer_norm(dim), _layer_norm(dim)
        self.q, self.kv, self.out = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.mlp_in, self.mlp_out = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, n, c, d = x.shape
        h = self.norm1(x)
        kv, valid = chunk_windows(self.kv(h), self.halo)
        w = kv.shape[2]
        q = rope(self.q(h).reshape(b * n, c, self.heads, -1), torch.arange(c), self.max_wavelength)
        k, v = kv.reshape(b * n, w, 2 * self.heads, -1).chunk(2, 2)
        k = rope(k, torch.arange(-self.halo, c + self.halo), self.max_wavelength)
        mask = valid.expand(b, n, w).reshape(b * n, 1, 1, w)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              attn_mask=mask).transpose(1, 2).reshape(b, n, c, d)
        x = x + self.dropout(self.out(attn))
        return x + self.dropout(self.mlp_out(F.gelu(self.mlp_in(self.norm2(x)), approximate="tanh")))


class MatrixConv(nn.Module):
    """A (1 x kernel) ``nn.Conv2d`` whose weight is stored as the matrix ``[out, in · kernel]``, the
    view Muon orthogonalizes (``torch.optim.Muon`` takes 2-D parameters only; motionjax's
    ``muon_dimensions`` gives the same matrix, its rows in another order, which orthogonalization
    commutes with)."""

    def __init__(self, dim_in, dim_out, kernel):
        super().__init__()
        conv = nn.Conv2d(dim_in, dim_out, (1, kernel))  # torch's initialization
        self.shape = conv.weight.shape
        self.weight = nn.Parameter(conv.weight.detach().reshape(dim_out, -1))
        self.bias = conv.bias

    def forward(self, x):
        return F.conv2d(x, self.weight.view(self.shape), self.bias)


class ConvBlock(nn.Module):
    """motionjax.models.ConvBlock: a (1 x kernel) convolution over each chunk and its halos."""

    def __init__(self, dim, kernel, dropout):
        super().__init__()
        self.halo = kernel // 2
        self.norm = _layer_norm(dim)
        self.conv, self.mix = MatrixConv(dim, dim, kernel), nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        windows, valid = chunk_windows(self.norm(x), self.halo)
        windows = windows * valid[None, :, :, None]  # zero padding at the sequence ends
        y = self.conv(windows.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # [B, N, W, D] -> [B, N, C, D]
        return x + self.dropout(self.mix(F.gelu(y, approximate="tanh")))


class Kinematics:
    """motionjax.models.SkeletonLayer's input positions and position head (constants, not trained)."""

    def __init__(self, body: Body, mean, std, input_positions: bool, position_head: bool):
        self.body, self.input_positions, self.position_head = body, input_positions, position_head
        self.mean, self.std = torch.as_tensor(mean), torch.as_tensor(std)

    @property
    def extra_inputs(self) -> int:
        return 3 * self.body.num_joints if self.input_positions else 0

    def positions(self, x):
        """Standardized features ``[..., F]`` -> root-relative joint positions ``[..., 3·J]`` / scale."""
        root, quats, _ = _decode(self.body, x * self.std + self.mean)
        return forward_kinematics(self.body, quats, torch.zeros_like(root))[0].flatten(-2) / POSITION_SCALE

    def project(self, rotations, correction):
        """Standardized rotation features ``[..., 6·R]`` and a position correction ``[..., 3·J]`` ->
        the rotation features of the IK projection of FK(rotations) + correction."""
        mean, std = self.mean[3:], self.std[3:]
        _, hint, _ = _decode(self.body, F.pad(rotations * std + mean, (3, 0)))
        goal = forward_kinematics(self.body, hint, rotations.new_zeros(*rotations.shape[:-1], 3))[0]
        goal = goal + correction.reshape(goal.shape) * POSITION_SCALE
        local = inverse_kinematics(self.body, goal, hint)[..., self.body.rotating, :]
        return (quat_to_6d(local).flatten(-2) - mean) / std


class ChunkedAutoencoder(nn.Module):
    """motionjax.models.ChunkedAutoencoder: embedding, ``stages`` of blocks and downsampling, the
    latent, the mirrored decoder (``upsample`` "linear" or "interp"), heads; named as motionjax names
    its parameters, so :func:`load_flax_params` copies them by name."""

    def __init__(self, features, chunk, *, dim, depth, latent_dim, stride, residual, make_block, stages=1,
                 kinematics: Kinematics | None = None, upsample="linear"):
        super().__init__()
        self.residual, self.kinematics, self.upsample = residual, kinematics, upsample
        self.strides = stage_strides(stride, stages)
        self.embed = nn.Linear(features + (kinematics.extra_inputs if kinematics else 0), dim)
        rates = [chunk // int(np.prod(self.strides[:s])) for s in range(stages)]
        blocks = lambda rate: nn.ModuleList([make_block(rate) for _ in range(depth)])  # noqa: E731
        self.encoder = nn.ModuleList([blocks(r) for r in rates])
        outs = [dim] * (stages - 1) + [latent_dim]
        self.downs = nn.ModuleList([nn.Linear(k * dim, o) for k, o in zip(self.strides, outs, strict=True)])
        width = (lambda k: dim) if upsample == "interp" else (lambda k: k * dim)
        self.ups = nn.ModuleList([nn.Linear(o, width(k)) for k, o in zip(self.strides, outs, strict=True)])
        self.decoder = nn.ModuleList([blocks(r) for r in rates])
        self.norm = _layer_norm(dim)
        self.root_head, self.rotation_head = nn.Linear(dim, 3), nn.Linear(dim, features - 3)
        if kinematics is not None and kinematics.position_head:
            self.position_head = nn.Linear(dim, 3 * kinematics.body.num_joints)

    def _interpolate(self, h, k: int):
        """One vector per ``k`` frames -> every frame, linear between group centres (edges held)."""
        windows, _ = chunk_windows(h, 1)
        weights = torch.tensor(interpolation_weights(h.shape[2], k))  # motionjax's matrix (cached there)
        return torch.einsum("fw,bnwd->bnfd", weights, windows)

    def forward(self, x):
        b, n, c, _ = x.shape
        h = x
        if self.kinematics is not None and self.kinematics.input_positions:
            h = torch.cat([x, self.kinematics.positions(x)], -1)
        h = self.embed(h)
        for blocks, down, k in zip(self.encoder, self.downs, self.strides, strict=True):
            for blk in blocks:
                h = blk(h)
            h = down(h.reshape(b, n, h.shape[2] // k, -1))
        for blocks, up, k in zip(self.decoder[::-1], self.ups[::-1], self.strides[::-1], strict=True):
            if self.upsample == "interp":
                h = self._interpolate(up(h), k)
            else:  # one vector -> k consecutive frames
                h = up(h).reshape(b, n, h.shape[2] * k, -1)
            for blk in blocks:
                h = blk(h)
        h = self.norm(h)
        rotations = self.rotation_head(h)
        if self.kinematics is not None and self.kinematics.position_head:
            rotations = self.kinematics.project(rotations, self.position_head(h))
        y = torch.cat([self.root_head(h), rotations], -1)
        return x + y if self.residual else y


def make_model(cfg, feature_dim: int, chunk: int, info=None) -> ChunkedAutoencoder:
    """The torch twin of ``motionjax.models.make_model`` for ``model.name`` "transformer" and "tconv";
    ``cfg`` = ``config.model``; ``info`` (the dataset) for ``input_positions`` / ``position_head``."""
    if cfg.name not in ("transformer", "tconv"):
        raise ValueError(f"the torch peer implements model.name 'transformer' and 'tconv', not {cfg.name!r}")
    if cfg.get("highpass", 0) or cfg.get("global_rotations"):
        raise ValueError("the torch peer does not implement model.highpass or model.global_rotations")
    kinematics = None
    if cfg.get("input_positions") or cfg.get("position_head"):
        if info is None:
            raise ValueError("model.input_positions / position_head need the dataset (info) for the skeleton")
        kinematics = Kinematics(Body(info.skeleton), info.mean, info.std, bool(cfg.get("input_positions")),
                                bool(cfg.get("position_head")))
    if cfg.name == "transformer":  # a coarser stage has fewer frames per chunk: its halo shrinks with it
        block = lambda frames: AttentionBlock(cfg.dim, cfg.heads, cfg.mlp_ratio,  # noqa: E731
                                              max(1, cfg.halo * frames // chunk), frames, cfg.dropout)
    else:
        block = lambda frames: ConvBlock(cfg.dim, cfg.kernel, cfg.dropout)  # noqa: E731
    return ChunkedAutoencoder(feature_dim, chunk, dim=cfg.dim, depth=cfg.depth, latent_dim=cfg.latent_dim,
                              stride=cfg.stride, residual=cfg.residual, make_block=block,
                              stages=cfg.get("stages", 1), kinematics=kinematics,
                              upsample=cfg.get("upsample", "linear"))


def initial_params(config, info):
    """The Flax ``Param`` state motionjax's model starts from for ``config.seed``: what the twin
    starts from, so both frameworks train the same weights."""
    from flax import nnx

    from motionjax import models
    model = models.make_model(config.model, info.feature_dim, config.data.chunk, nnx.Rngs(config.seed),
                              info=info)
    return nnx.state(model, nnx.Param)


def load_flax_params(module: nn.Module, params) -> None:
    """Copy an ``nnx.State`` of Params (``nnx.state(model, nnx.Param)``) into the twin ``module``."""
    from flax import nnx
    names = {"kernel": "weight", "scale": "weight", "bias": "bias"}
    torch_params = dict(module.named_parameters())
    flat = nnx.to_flat_state(params)
    if len(flat) != len(torch_params):
        raise ValueError(f"{len(flat)} Flax params vs {len(torch_params)} torch params: different models")
    with torch.no_grad():
        for path, variable in flat:
            name = ".".join(str(p) for p in path[:-1]) + "." + names[path[-1]]
            value = torch.tensor(np.asarray(variable.get_value(), np.float32))
            if path[-1] == "kernel":  # Flax: [in, out] and [1, k, in, out]; torch: [out, in], [out, in, 1, k]
                value = value.T if value.ndim == 2 else value.permute(3, 2, 0, 1)
            torch_params[name].copy_(value.reshape(torch_params[name].shape))  # MatrixConv: [out, in·k]


# ---------------------------------------------------------------------------------------------
# Data: the motionjax windows and numpy transforms behind a torch DataLoader


class WindowDataset(torch.utils.data.Dataset):
    """Training example ``i``: a slot of :func:`motionjax.data.pipeline.train_slots`, its window and
    noise drawn from a generator seeded by ``(seed, i)``, transformed on the host by the pipeline's
    ``host_window`` and ``MakeExample`` (the numpy copy of the device augmentation: a PyTorch
    loader's way)."""

    def __init__(self, cfg, info, seed: int = 0):
        self.slots, self.seed = pipeline.train_slots(info, cfg.window, cfg.dynamics_sampling), seed
        self.cfg, self.skeleton = cfg, info.skeleton
        self.sample = pipeline.SampleWindow(pipeline.ClipSource(info), info, cfg)
        self.make = pipeline.MakeExample(info, cfg, transforms.Noise.from_config(cfg))

    def __len__(self):
        return len(self.slots)

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        w = self.sample(self.slots[i], rng)
        while w is None:  # a bad record (already counted by SampleWindow): draw another slot
            w = self.sample(self.slots[rng.integers(len(self.slots))], rng)
        out = self.make(pipeline.host_window(w, self.cfg, self.skeleton, rng), rng)
        # noisy, clean [N, C, F], valid [N, C, 1], and with data.bones = "clip" the clip's offsets [J, 3]
        return {k: out[k] for k in ("noisy", "clean", "valid", "offsets") if k in out}


def make_loader(cfg, info, seed: int = 0, workers: int = 0):
    """A shuffling ``DataLoader`` of ``cfg.batch_size`` examples, repeated forever."""
    # Workers are spawned, not forked: the parent runs XLA's threads, which a fork would copy mid-flight.
    loader = torch.utils.data.DataLoader(
        WindowDataset(cfg, info, seed), batch_size=cfg.batch_size, shuffle=True, drop_last=True,
        num_workers=workers, persistent_workers=workers > 0,
        multiprocessing_context="spawn" if workers else None, generator=torch.Generator().manual_seed(seed))
    while True:
        yield from loader


# ---------------------------------------------------------------------------------------------
# Training


class Float32Muon(torch.optim.Muon):
    """``torch.optim.Muon`` with its Newton-Schulz iteration in float32, as optax runs it. Torch's
    runs in bfloat16, which a CPU without bf16 instructions emulates: for the headline model's 16
    matrices, 3.3-4.3 s a step here against 0.12-0.14 s in float32. Otherwise torch's update, line
    for line (``torch.optim._muon._single_tensor_muon``)."""

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "no closure"
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            a, b, c = group["ns_coefficients"]
            for param, grad, buf in zip(params, grads, bufs, strict=True):
                buf.lerp_(grad, 1 - group["momentum"])
                x = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                tall = x.shape[0] > x.shape[1]
                x = x.T if tall else x
                x = x / x.norm().clamp(min=group["eps"])
                for _ in range(group["ns_steps"]):
                    gram = x @ x.T
                    x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
                rate = _adjust_lr(group["lr"], group["adjust_lr_fn"], param.shape)
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(x.T if tall else x, alpha=-rate)


def make_optimizer(model: nn.Module, cfg, muon_bf16: bool = False):
    """motionjax's ``train.step.make_optimizer`` in torch: ``(optimizers, schedulers)``, each stepped
    once an update; warmup + cosine decay (``optax.warmup_cosine_decay_schedule``); ``cfg`` =
    ``config.train``. ``"adamw"``: ``torch.optim.AdamW``. ``"muon"``: ``torch.optim.Muon`` (its
    ``"match_rms_adamw"`` scaling is optax's ``consistent_rms = 0.2``) for every 2-D weight (the
    convolutions are :class:`MatrixConv`), and for biases and norms AdamW with Nesterov momentum as
    optax's Muon has it (``torch.optim.NAdam`` with a constant momentum coefficient). Newton-Schulz
    in float32 (:class:`Float32Muon`) unless ``muon_bf16`` (torch's own, bfloat16). One difference
    left, torch's own: Muon's momentum is not bias-corrected (optax's is: their directions differ in
    the first ~1 / (1 - 0.95) updates, while the warmup's rate is small)."""
    if cfg.optimizer not in ("adamw", "muon") or cfg.grad_accum_steps != 1:
        raise ValueError(f"train.optimizer={cfg.optimizer!r}, grad_accum_steps={cfg.grad_accum_steps}: "
                         "the PyTorch twin trains with AdamW or Muon, one batch an update; against another "
                         "optimizer the comparison would measure the optimizers, not the frameworks "
                         "(expected 'adamw' or 'muon', 1)")
    if cfg.optimizer == "adamw":
        opts = [torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(cfg.b1, cfg.b2),
                                  weight_decay=cfg.weight_decay, eps=1e-8)]
    else:
        params = list(model.parameters())
        muon = torch.optim.Muon if muon_bf16 else Float32Muon
        opts = [muon([p for p in params if p.ndim == 2], lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                     momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw"),
                # momentum_decay -> inf: NAdam's mu_t = b1 (1 - 0.5 · 0.96^(t·decay)) is b1 at every t.
                torch.optim.NAdam([p for p in params if p.ndim != 2], lr=cfg.learning_rate,
                                  betas=(cfg.b1, cfg.b2), eps=1e-8, weight_decay=cfg.weight_decay,
                                  momentum_decay=1e9, decoupled_weight_decay=True)]
    warmup, total, floor = min(cfg.warmup_steps, cfg.steps - 1), max(cfg.steps, 1), cfg.final_lr_fraction

    def factor(step):
        if step < warmup:
            return step / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return opts, [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in opts]


def make_train_step(config, info, params=None, muon_bf16: bool = False, device: str | None = None):
    """``(model, step)``: the twin and ``step(noisy, clean [B, N, C, F], offsets [B, J, 3] = None, valid
    [B, N, C, 1] = None) -> loss``, one optimizer update.

    ``params``: optional Flax ``Param`` state to start from (the motionjax model's init), else torch's;
    ``muon_bf16``: :func:`make_optimizer`'s; ``device``: where the model, its constants and the step
    live (``"cuda"``; default: torch's default device, the CPU). The step moves its inputs there and
    creates every tensor there (``with torch.device``), as a PyTorch user's loop on a GPU does.
    """
    torch.manual_seed(config.seed)
    device = torch.device(device) if device is not None else torch.get_default_device()
    # On the CPU (the default) no device context (a TorchFunctionMode on every op): the twin's CPU path
    # stays the one docs/benchmarks.md measured (A/B here: no difference within this VM's noise).
    on_device = device if device.type != "cpu" else contextlib.nullcontext()
    with on_device:
        body, fps = Body(info.skeleton), float(info.fps)
        mean, std = torch.as_tensor(info.mean), torch.as_tensor(info.std)
        model = make_model(config.model, info.feature_dim, config.data.chunk, info)
        if params is not None:
            load_flax_params(model, params)
    opts, schedules = make_optimizer(model, config.train, muon_bf16)

    def step(noisy, clean, offsets=None, valid=None):
        with on_device:
            return _step(*(None if x is None else x.to(device) for x in (noisy, clean, offsets, valid)))

    def _step(noisy, clean, offsets, valid):
        b, n, c, f = clean.shape
        pred = model(noisy)
        loss, _ = reconstruction_loss(config.loss, body, fps, pred.reshape(b, n * c, f),
                                      clean.reshape(b, n * c, f), mean, std, offsets,
                                      None if valid is None else valid.reshape(b, n * c))
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        for opt, schedule in zip(opts, schedules, strict=True):
            opt.step()
            schedule.step()
        return loss.detach()

    return model, step


def train(config, info, steps: int, *, params=None, workers: int = 0, threads: int | None = None,
          eval_batches=None, untimed: int = 1, device: str | None = None) -> dict:
    """Train the torch twin for ``steps`` steps; frames/s over the steps after the first ``untimed``.

    Args:
      config: the experiment config (``model``, ``loss``, ``data``, ``train`` sections are read).
      params: optional Flax ``Param`` state to start from (the motionjax model's init), else torch init.
      workers: ``DataLoader`` worker processes.
      threads: ``torch.set_num_threads`` (default: torch's choice, one per core).
      eval_batches: optional held-out batches; returns their MPJPE after training.
      untimed: steps not timed: the first pays one-off allocations, like the compiled step's compile,
        and eager PyTorch keeps getting faster over its first few (allocator, oneDNN kernel caches).
      device: :func:`make_train_step`'s. On a GPU each step waits for its kernels before the clock
        reads (``torch.cuda.synchronize``), so compute is the step's, not its launch's.
    """
    if threads:
        torch.set_num_threads(threads)
    model, train_step = make_train_step(config, info, params, device=device)
    sync = _synchronizer(device)
    loader = make_loader(config.data, info, seed=config.seed, workers=workers)
    frames_per_step = config.data.batch_size * config.data.window
    wait = compute = 0.0
    for step in range(steps):
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        loss = train_step(batch["noisy"], batch["clean"], batch.get("offsets"), batch.get("valid"))
        sync()
        if step >= untimed:
            wait, compute = wait + t1 - t0, compute + time.perf_counter() - t1
    loader.close()  # shuts the DataLoader's workers down
    timed = max(steps - untimed, 1)
    out = {"steps": steps, "frames_per_s": timed * frames_per_step / (wait + compute),
           "step_s": (wait + compute) / timed, "data_wait_fraction": wait / (wait + compute),
           "final_loss": float(loss), "threads": torch.get_num_threads(), "workers": workers}
    if eval_batches is not None:
        out["heldout_mpjpe"] = evaluate(model, info, config.loss.contact_speed, eval_batches)
    return out


def _synchronizer(device):
    """A call that waits for ``device``'s queued kernels (CUDA runs them asynchronously); else a no-op."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def evaluate(model, info, contact_speed, batches) -> float:
    """Held-out MPJPE (cm) of the torch model with motionjax's evaluation code."""
    from motionjax.evaluation import metrics as motion_metrics
    device = next(model.parameters()).device

    def predict(x):
        with torch.no_grad(), (device if device.type != "cpu" else contextlib.nullcontext()):
            return model(torch.as_tensor(np.asarray(x))).cpu().numpy()

    model.eval()
    metrics = motion_metrics.evaluate(predict, batches, info.skeleton, float(info.fps), info.mean, info.std,
                                  contact_speed)
    model.train()
    return float(metrics["mpjpe"])


def run_to_target(config, target: float, *, max_seconds: float | None = None, metric="validation/mpjpe",
                  params=None, threads: int | None = None, workers: int = 0) -> dict:
    """The twin trained until ``metric`` (root-relative MPJPE, cm, clean input) is at or below
    ``target`` at an evaluation every ``config.train.eval_every`` steps, or the budget is spent
    (``train.steps``, ``max_seconds`` of counted time): the record of
    :func:`benchmarks.time_to_target.run_to_target`, counted the same way (the first step is
    ``compile_s``; data wait, compute and evaluations apart; no checkpoints). The validation windows
    and the metric code are motionjax's; ``test`` is evaluated once, at the stopping evaluation.
    ``params``: the Flax initial weights to start from (motionjax's init for the seed)."""
    split = metric.split("/")[0]
    if threads:
        torch.set_num_threads(threads)
    info = pipeline.dataset_info(config.data)
    model, train_step = make_train_step(config, info, params)
    loader = make_loader(config.data, info, seed=config.seed, workers=workers)
    sets = {s: pipeline.make_eval_batches(config.data, info, s, 0.0, seed=config.seed)
            for s in dict.fromkeys((split, "test"))}
    frames_per_step = config.data.batch_size * config.data.window
    timing = dict.fromkeys(("compile_s", "compute_s", "data_wait_s", "eval_s", "checkpoint_s"), 0.0)
    curve, status = [], "budget"
    score = lambda batches: evaluate(model, info, config.loss.contact_speed, batches)  # noqa: E731
    bar = tqdm.tqdm(range(1, config.train.steps + 1), desc=f"torch seed{config.seed}", unit="step")
    for step in bar:
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        train_step(batch["noisy"], batch["clean"], batch.get("offsets"), batch.get("valid"))
        t2 = time.perf_counter()
        if step == 1:  # one-off allocations: what the compiled step's compile is to motionjax
            timing["compile_s"] += t2 - t0
        else:
            timing["data_wait_s"] += t1 - t0
            timing["compute_s"] += t2 - t1
        if step % config.train.eval_every and step < config.train.steps:
            continue
        t = time.perf_counter()
        value = score(sets[split])
        timing["eval_s"] += time.perf_counter() - t
        wall = sum(timing.values())
        curve.append({"step": step, "frames": step * frames_per_step, "wall_s": wall, "value": value,
                      **timing})
        bar.set_postfix({split: f"{value:.3f} cm"})
        if value <= target:
            status = "target"
            break
        if max_seconds is not None and wall >= max_seconds:
            break
    bar.close()
    loader.close()
    last = curve[-1]
    final = {f"{s}/mpjpe": last["value"] if s == split else score(b) for s, b in sets.items()}
    return {"reached": last["value"] <= target, **{k: last[k] for k in ("step", "frames", "wall_s")},
            **timing, "value": last["value"], "curve": curve, "final": final, "status": status,
            "seed": config.seed, "threads": torch.get_num_threads(), "workers": workers}

