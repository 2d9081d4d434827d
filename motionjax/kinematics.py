"""Forward kinematics over a skeleton, one batched op per tree depth level.

Joints at the same depth are independent given their parents, so FK runs ``depth`` steps, each a
gather of the previous level's results plus one vectorised quaternion product and rotation
(the scheme of MuJoCo MJX's ``scan.body_tree``). A 24-joint body traces ~8 levels, not 24 joints.
"""
from __future__ import annotations

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
