"""Studio-style corruptions planted in a clean clip, with the frames they cover (tests, benchmarks).

:func:`inject` takes a :class:`~motionjax.formats.Motion` in metres (a conformed clip at its
prepare rate: ``corpus.conform`` then ``transforms.resample``) and returns the corrupted motion and
the ground-truth frame ranges ``[(start, end)]``. Each kind has a magnitude in its own unit
(:data:`MAGNITUDES`: the benchmark's three levels) and the detector kind of
:mod:`motionjax.data.clean` that should find it (:data:`DETECTOR`):

=============  ==================================================================  =========
kind           what                                                                magnitude
=============  ==================================================================  =========
``pop``        a limb joint turned for 1-3 frames so its subtree's far end jumps   m
``twist``      a limb joint twisted about its bone for 3-30 frames, then back      degrees
``sign_flip``  single (frame, joint) quaternions negated (the same rotation)       count
``teleport``   the root shifted horizontally from a frame to the end (a splice)    m
``frozen``     one frame held for ``magnitude`` frames (tracking loss)             frames
``stretch``    one bone's position channels lengthened for 5-30 frames             m
``sink``       the root lowered for 5-30 frames (feet through the floor)           m
``float``      the root raised for 1.5-3 s (no contact)                            m
``nonfinite``  ``magnitude`` consecutive frames of NaN                             frames
=============  ==================================================================  =========
"""
from __future__ import annotations

import dataclasses

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.formats import Motion

MAGNITUDES = {"pop": (0.4, 0.6, 1.0), "twist": (120.0, 150.0, 180.0), "sign_flip": (1, 10, 100),
              "teleport": (0.15, 0.3, 1.0), "frozen": (10, 30, 90), "stretch": (0.02, 0.05, 0.1),
              "sink": (0.2, 0.3, 0.5), "float": (0.3, 0.5, 1.0), "nonfinite": (1, 3, 10)}
DETECTOR = {"pop": "pop", "twist": "twist", "sign_flip": "sign_flip", "teleport": "teleport",
            "frozen": "frozen", "stretch": "stretch", "sink": "floor", "float": "floor",
            "nonfinite": "nonfinite"}
KINDS = tuple(MAGNITUDES)


def _limb_joints(motion: Motion) -> np.ndarray:
    """Joints with a grandchild (a limb segment whose turn moves a chain): not the root."""
    kids = motion.skeleton.children
    return np.array([j for j in range(1, motion.skeleton.num_joints) if any(kids[k] for k in kids[j])])


def _bone_axis(motion: Motion, j: int) -> np.ndarray:
    """Unit vector along joint ``j``'s first child's rest offset (its bone), in ``j``'s frame."""
    off = motion.skeleton.offsets[motion.skeleton.children[j][0]]
    return off / max(np.linalg.norm(off), 1e-9)


def _pop(motion: Motion, rots, root, magnitude: float, rng):
    """Turn a limb joint for 1-3 frames so that its farthest descendant (that frame) moves by
    exactly ``magnitude`` m: a world rotation about the joint, about an axis perpendicular to the
    joint -> descendant vector, by ``2 asin(magnitude / 2r)``."""
    sk = motion.skeleton
    s, e = _span(rng, motion.num_frames, 1, 3)
    pos, world = forward_kinematics(sk, rots[s:e], root[s:e])
    limbs = _limb_joints(motion)
    below = {j: [k for k in range(sk.num_joints) if sk.ancestor_mask[k, j] and k != j] for j in limbs}
    reach = {j: np.linalg.norm(pos[:, below[j]] - pos[:, j:j + 1], axis=-1).max(-1).min() for j in limbs}
    able = [j for j in limbs if 2 * reach[j] > 1.05 * magnitude]
    j = int(rng.choice(able)) if able else max(limbs, key=reach.get)
    parent = sk.parents[j]
    random = rng.normal(size=3)
    for f in range(e - s):
        v = pos[f, below[j]] - pos[f, j]
        far = v[np.argmax(np.linalg.norm(v, axis=-1))]
        r = np.linalg.norm(far)
        axis = np.cross(far, random)
        angle = 2 * np.arcsin(min(magnitude / (2 * r), 1.0))
        turn = rot.axis_angle_to_quat(angle * axis / np.linalg.norm(axis))  # world frame, about joint j
        g = world[f, parent]
        local = rot.quat_mul(rot.quat_mul(rot.quat_conj(g), turn), g)
        rots[s + f, j] = rot.quat_mul(local, rots[s + f, j])
    return rots, [(s, e)]


def _span(rng, frames: int, lo: int, hi: int, margin: int = 8) -> tuple[int, int]:
    """A random range of ``lo..hi`` frames at least ``margin`` frames inside the clip."""
    n = int(rng.integers(lo, hi + 1))
    n = min(n, frames - 2 * margin - 1)
    s = int(rng.integers(margin, frames - margin - n))
    return s, s + n


def inject(motion: Motion, kind: str, magnitude: float, rng: np.random.Generator):
    """``motion`` corrupted by one ``kind`` defect of ``magnitude`` -> ``(motion, [(start, end)])``.

    The input is not changed. ``sign_flip`` returns ``(frame, joint)`` pairs instead of ranges;
    ``teleport`` returns the one frame where the root jumps."""
    if kind not in MAGNITUDES:
        raise ValueError(f"unknown anomaly {kind!r}; expected one of {KINDS}")
    t = motion.num_frames
    if t < 40:
        raise ValueError(f"clip {motion.name!r}: {t} frames; anomalies need at least 40")
    root = np.array(motion.root_position, np.float64)
    rots = np.array(motion.rotations, np.float64)
    offsets = None if motion.offsets is None else np.array(motion.offsets, np.float64)
    up = motion.skeleton.up_axis
    if kind == "pop":
        rots, ranges = _pop(motion, rots, root, magnitude, rng)
    elif kind == "twist":
        j = int(rng.choice(_limb_joints(motion)))
        turn = rot.axis_angle_to_quat(np.radians(magnitude) * _bone_axis(motion, j))
        s, e = _span(rng, t, 3, 30)
        rots[s:e, j] = rot.quat_mul(rots[s:e, j], np.broadcast_to(turn, rots[s:e, j].shape))
        ranges = [(s, e)]
    elif kind == "sign_flip":
        cells = rng.choice(t * motion.skeleton.num_joints, size=min(int(magnitude), t), replace=False)
        pairs = sorted((int(c // motion.skeleton.num_joints), int(c % motion.skeleton.num_joints))
                       for c in cells)
        for f, j in pairs:
            rots[f, j] *= -1
        return dataclasses.replace(motion, rotations=rots.astype(motion.rotations.dtype)), pairs
    elif kind == "teleport":
        s = int(rng.integers(t // 4, 3 * t // 4))
        direction = rng.normal(size=3)
        direction[up] = 0
        root[s:] += magnitude * direction / np.linalg.norm(direction)
        ranges = [(s, s + 1)]
    elif kind == "frozen":
        s, e = _span(rng, t, int(magnitude), int(magnitude))
        root[s:e] = root[s - 1]
        rots[s:e] = rots[s - 1]
        ranges = [(s, e)]
    elif kind == "stretch":
        j = int(rng.choice(np.arange(1, motion.skeleton.num_joints)))
        if offsets is None:
            offsets = np.broadcast_to(motion.skeleton.offsets, (t, *motion.skeleton.offsets.shape)).copy()
        s, e = _span(rng, t, 5, 30)
        base = offsets[s:e, j]
        norm = np.linalg.norm(base, axis=-1, keepdims=True)
        offsets[s:e, j] = base + magnitude * (base / np.maximum(norm, 1e-9) if norm.min() > 1e-6 else
                                              np.eye(3)[(up + 1) % 3])
        ranges = [(s, e)]
    elif kind in ("sink", "float"):
        # At most 40% of the clip: the floor is the clip's median lowest-joint height.
        longest = int(0.4 * t)
        s, e = _span(rng, t, min(5, longest), min(30, longest)) if kind == "sink" else _span(
            rng, t, min(int(1.5 * motion.fps), longest), min(int(3 * motion.fps), longest))
        root[s:e, up] += -magnitude if kind == "sink" else magnitude
        ranges = [(s, e)]
    else:  # nonfinite
        s, e = _span(rng, t, int(magnitude), int(magnitude))
        root[s:e] = np.nan
        rots[s:e] = np.nan
        ranges = [(s, e)]
    out = dataclasses.replace(motion, root_position=root.astype(motion.root_position.dtype),
                              rotations=rots.astype(motion.rotations.dtype), offsets=offsets)
    return out, ranges
