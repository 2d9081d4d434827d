"""The feature layout of a motion window: what the model sees and predicts, and its inverse.

One frame is ``F = 3 + 6·R`` numbers: the root position (already canonicalised by the data
pipeline) followed by the 6D rotation of each of the ``R`` joints that can rotate (fixed joints
carry no information and are left out). Data, model heads, losses and evaluation all go through
:func:`pack` / :func:`unpack` and :func:`standardize` / :func:`destandardize`. Like
:mod:`motionjax.core.rotations`, they return numpy for numpy inputs (the data workers) and jax arrays
otherwise (model and losses).
"""
from __future__ import annotations

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.skeleton import FIXED, Skeleton


def rotating_joints(skeleton: Skeleton) -> np.ndarray:
    """Indices of the joints whose rotations are features (all but fixed joints)."""
    return np.array([j for j, k in enumerate(skeleton.kinds) if k != FIXED])


def feature_dim(skeleton: Skeleton) -> int:
    return 3 + 6 * len(rotating_joints(skeleton))


def pack(skeleton: Skeleton, root_position, rotations):
    """``root_position [..., T, 3]``, ``rotations [..., T, J, 4]`` -> features ``[..., T, F]``."""
    sixd = rot.quat_to_6d(rotations[..., rotating_joints(skeleton), :])
    xp = rot._xp(root_position, sixd)
    return xp.concatenate([root_position, sixd.reshape(*sixd.shape[:-2], -1)], axis=-1)


def unpack(skeleton: Skeleton, features):
    """Inverse of :func:`pack`: ``features [..., T, F]`` -> ``(root_position, rotations)``.

    Any 6D vector decodes to a valid rotation (Gram-Schmidt), so raw model outputs are safe here.
    """
    ids = rotating_joints(skeleton)
    root_position = features[..., :3]
    quats = rot.sixd_to_quat(features[..., 3:].reshape(*features.shape[:-1], len(ids), 6))
    xp = rot._xp(quats)
    # Scatter by a static gather: fixed joints read the identity appended as slot len(ids).
    slot = np.full(skeleton.num_joints, len(ids))
    slot[ids] = np.arange(len(ids))
    padded = xp.concatenate([quats, rot.identity_quat(quats.shape[:-2] + (1,), quats.dtype, xp)], axis=-2)
    return root_position, padded[..., slot, :]


def standardize(features, mean, std):
    """``(x - mean) / std`` with per-feature stats ``[F]``."""
    return (features - mean) / std


def destandardize(features, mean, std):
    return features * std + mean
