"""Physical plausibility of a motion on its own, without a true motion to compare with (generated motion).

Every measure is of one motion ``root [B, T, 3]``, local rotations ``[B, T, J, 4]`` on its bones
(``offsets [B, J, 3]`` or the skeleton's), in the canonical window frame of the data (the floor at height
0: :func:`motionjax.data.transforms.canonicalize`); the real motion's value is the reference beside it:

* ``foot_skate`` (cm/s): horizontal speed of a foot joint on its contact frames (the joint within
  ``contact_m`` of its own floor height, :class:`Feet`), the measure of foot sliding of generation papers
  (PhysDiff, Yuan et al. 2023; GMD, Karunratanakul et al. 2023: contact by height, not by speed, which
  would hide sliding);
* ``skate_ratio`` and ``skate_ratio_avg5``: the foot-skating ratio of GMD (Karunratanakul et al. 2023)
  and OmniControl (Xie et al. 2024), the one papers report: the share of frame pairs ``(t, t+1)`` in which
  a foot joint (:attr:`Feet.standard`, one per side) is within ``band_m`` of the floor in both frames and
  moves horizontally faster than 0.5 m/s; ``_avg5`` also asks its 5-frame mean speed (centred,
  zero-padded: ``scipy.ndimage.uniform_filter1d(size=5, mode="constant")``) to exceed 0.5 m/s, as their
  code does. ``foot_skate`` is ours beside it;
* ``contact``: the share of (foot joint, frame) in the band: a motion that "skates less" by lifting its
  feet out of the band shows here;
* ``penetration`` (cm): how far the lowest joint is below the floor, 0 above it, per frame;
* ``floating`` (cm): how far the lowest standard foot joint is above the band, per frame (a jump floats
  too: the real motion's value says how much of it is real);
* ``jitter`` (m/s³): mean norm of the third difference of the joint positions;
* ``bone_error`` (cm): ``| |p_j − p_parent| − |offset_j| |`` over bones, 0 for a motion decoded through
  FK on its bones (what a generator that predicted positions would get wrong);
* ``root_force`` (N/kg), ``root_torque`` (N·m/kg): the root's part of the generalized forces
  ``τ = Jᵀ m (a − g)`` (:func:`motionjax.core.dynamics.generalized_forces`): the wrench on the floating
  root that no joint can supply, only contact with the world; a person standing still needs 9.81 N/kg
  (gravity), and anything a motion adds beyond its real counterpart is force from nowhere.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from motionjax.core import dynamics, halo
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import Skeleton
from motionjax.evaluation import generative

METRICS = ("skate_ratio", "skate_ratio_avg5", "contact", "foot_skate", "penetration", "floating", "jitter",
           "bone_error", "root_force", "root_torque")
SKATE_SPEED = 0.5  # m/s: GMD's and OmniControl's threshold
SKATE_AVERAGE = 5  # frames of their mean-speed filter
UNITS = {
    "skate_ratio": "",
    "skate_ratio_avg5": "",
    "contact": "",
    "foot_skate": "cm/s",
    "penetration": "cm",
    "floating": "cm",
    "jitter": "m/s3",
    "bone_error": "cm",
    "root_force": "N/kg",
    "root_torque": "Nm/kg",
}


@dataclasses.dataclass(frozen=True)
class Feet:
    """The foot joints and the height each stands at on the floor, from real motion (a skeleton's rest
    pose need not stand: Bandai-1's bones point along ±x at rest).

    ``joints [K]``: the paired (left/right) joints whose median height over the real frames is within
    ``reach_m`` of the lowest paired joint's (ankles and toes); ``floor [K]`` (m): each one's 5th
    percentile height, its height when planted; ``contact_m``: our skating's contact band above it.
    ``standard``: the two joints (left, right) of the papers' skating ratio, measured against the floor
    (height 0) with the band ``band_m``."""

    joints: tuple[int, ...]
    floor: tuple[float, ...]
    contact_m: float = 0.05
    standard: tuple[int, ...] = ()
    band_m: float = 0.05

    @classmethod
    def fit(cls, skeleton: Skeleton, positions, reach_m: float = 0.12, contact_m: float = 0.05,
            standard=(), band_m: float = 0.05, valid=None) -> Feet:
        """From real joint positions ``[..., J, 3]`` (m, floor at 0; ``valid [...]``: the frames to use, None:
        all). ``standard``: joint names of the skating ratio; empty: the lowest paired joint and its twin."""
        height = np.asarray(positions)[..., skeleton.up_axis].reshape(-1, skeleton.num_joints)
        if valid is not None:
            height = height[np.asarray(valid).reshape(-1) > 0]
        paired = np.flatnonzero(skeleton.symmetry != np.arange(skeleton.num_joints))
        median = np.median(height, axis=0)
        if not paired.size:
            paired = np.arange(skeleton.num_joints)
        joints = paired[median[paired] <= median[paired].min() + reach_m]
        floor = np.percentile(height[:, joints], 5, axis=0)
        if standard:
            missing = [n for n in standard if n not in skeleton.names]
            if missing:
                raise ValueError(f"skating joints {missing} are not joints of the skeleton {skeleton.names}")
            pair = tuple(skeleton.index(n) for n in standard)
        else:
            low = int(paired[np.argmin(median[paired])])
            pair = tuple(sorted({low, int(skeleton.symmetry[low])}))
        return cls(tuple(int(j) for j in joints), tuple(float(f) for f in floor), contact_m, pair, band_m)


def skating_pairs(height, horizontal_step, valid, fps: float, band_m: float):
    """The papers' skating of foot joints: ``height [B, T, K]`` (m above the floor), ``horizontal_step
    [B, T-1, K]`` (m moved on the floor from frame t to t+1), ``valid [B, T]`` -> ``(skating [B, T-1],
    skating with the 5-frame mean speed too [B, T-1], pair counted [B, T-1])`` (bool): a pair skates when
    any joint is below ``band_m`` in both frames and moves faster than :data:`SKATE_SPEED`."""
    pair = valid[:, 1:] & valid[:, :-1]
    speed = jnp.where(pair[..., None], horizontal_step * fps, 0.0)  # invalid pairs: still (zero-padded)
    h = SKATE_AVERAGE // 2
    padded = jnp.pad(speed, ((0, 0), (h, h), (0, 0)))
    average = sum(padded[:, i : i + speed.shape[1]] for i in range(SKATE_AVERAGE)) / SKATE_AVERAGE
    contact = (height[:, 1:] < band_m) & (height[:, :-1] < band_m)
    fast = contact & (speed > SKATE_SPEED)
    return (fast.any(-1) & pair, (fast & (average > SKATE_SPEED)).any(-1) & pair, pair)


@functools.partial(jax.jit, static_argnames=("skeleton", "fps", "feet"))
def plausibility_sums(skeleton: Skeleton, fps: float, feet: Feet, root, rotations, offsets=None, valid=None):
    """``{metric: (sums [B], counts [B])}`` of the :data:`METRICS` per window (``root [B, T, 3]``,
    ``rotations [B, T, J, 4]``, ``offsets [B, J, 3]`` or None: the skeleton's; ``valid [B, T]`` the frames
    counted, None: all), so windows and batches combine exactly; a time difference counts where its whole
    stencil is valid."""
    root, rotations = jnp.asarray(root, jnp.float32), jnp.asarray(rotations, jnp.float32)
    b, t = root.shape[:2]
    valid = jnp.ones((b, t), bool) if valid is None else jnp.asarray(valid).astype(bool)
    bones = None if offsets is None else jnp.asarray(offsets, jnp.float32)[:, None]
    fk = forward_kinematics(skeleton, rotations, root, bones)  # once, for the metrics and the forces
    pos = fk[0]  # [B, T, J, 3]
    up = skeleton.up_axis
    total = lambda x, where: (
        jnp.sum(jnp.where(where, x, 0.0), axis=tuple(range(1, x.ndim))),
        jnp.sum(jnp.broadcast_to(where, x.shape), axis=tuple(range(1, x.ndim)), dtype=jnp.float32),
    )
    inner = halo.stencil_valid(valid, 1)  # [B, T]
    inner3 = valid[:, 3:] & valid[:, 2:-1] & valid[:, 1:-2] & valid[:, :-3]

    idx = np.asarray(feet.joints)
    foot = pos[:, :, idx]  # [B, T, K, 3]
    lift = foot[..., up] - jnp.asarray(feet.floor, jnp.float32)  # [B, T, K]: above its planted height
    contact = lift < feet.contact_m
    speed = jnp.pad((foot[:, 2:] - foot[:, :-2]) * (fps / 2), ((0, 0), (1, 1), (0, 0), (0, 0)))
    horizontal = jnp.linalg.norm(jnp.delete(speed, up, axis=-1), axis=-1)  # [B, T, K]
    standard = pos[:, :, np.asarray(feet.standard)]  # [B, T, 2, 3]
    step = jnp.linalg.norm(jnp.delete(standard[:, 1:] - standard[:, :-1], up, axis=-1), axis=-1)
    skating, skating5, pair = skating_pairs(standard[..., up], step, valid, fps, feet.band_m)
    lowest = pos[..., up].min(-1)  # [B, T]
    jerk = (pos[:, 3:] - 3 * pos[:, 2:-1] + 3 * pos[:, 1:-2] - pos[:, :-3]) * fps**3
    parents = np.asarray(skeleton.parents)[1:]
    length = jnp.linalg.norm(pos[..., 1:, :] - pos[..., parents, :], axis=-1)  # [B, T, J-1]
    rest = jnp.linalg.norm(
        jnp.asarray(skeleton.offsets, jnp.float32)[1:] if bones is None else bones[..., 1:, :], axis=-1
    )
    tau = dynamics.generalized_forces(skeleton, root, rotations, fps, offsets, fk=fk)  # [B, T, J + 1, 3]
    count = lambda x, where: (jnp.sum(x & where, axis=1, dtype=jnp.float32),  # noqa: E731
                              jnp.sum(where, axis=1, dtype=jnp.float32))
    return {
        "skate_ratio": count(skating, pair),
        "skate_ratio_avg5": count(skating5, pair),
        "contact": total((standard[..., up] < feet.band_m).astype(jnp.float32), valid[..., None]),
        "foot_skate": (lambda s: (100 * s[0], s[1]))(total(horizontal, contact & inner[..., None])),
        "penetration": (lambda s: (100 * s[0], s[1]))(total(jnp.maximum(-lowest, 0.0), valid)),
        "floating": (lambda s: (100 * s[0], s[1]))(
            total(jnp.maximum(standard[..., up].min(-1) - feet.band_m, 0.0), valid)
        ),
        "jitter": total(jnp.linalg.norm(jerk, axis=-1), inner3[..., None]),
        "bone_error": (lambda s: (100 * s[0], s[1]))(total(jnp.abs(length - rest), valid[..., None])),
        "root_force": total(jnp.linalg.norm(tau[..., 0, :], axis=-1), inner),
        "root_torque": total(jnp.linalg.norm(tau[..., 1, :], axis=-1), inner),
    }


def window_sums(
    skeleton: Skeleton,
    fps: float,
    feet: Feet,
    root,
    rotations,
    offsets=None,
    valid=None,
    batch_size: int = 256,
) -> dict:
    """:func:`plausibility_sums` over any number of windows (numpy ``[K, T, ...]``, in batches): ``{metric:
    (sums [K], counts [K])}`` float64, to aggregate over any subset of windows (:func:`mean`)."""
    fn = lambda r, q, o, v: plausibility_sums(skeleton, float(fps), feet, r, q, o, v)  # noqa: E731
    out = generative.in_batches(
        fn,
        batch_size,
        np.asarray(root, np.float32),
        np.asarray(rotations, np.float32),
        None if offsets is None else np.asarray(offsets, np.float32),
        None if valid is None else np.asarray(valid, np.float32),
    )
    return {k: (np.asarray(s, np.float64), np.asarray(c, np.float64)) for k, (s, c) in out.items()}


def mean(sums: dict, index=None) -> dict:
    """``{metric: value}`` over the windows ``index`` (None: all) of :func:`window_sums`'s output."""
    pick = (lambda x: x) if index is None else (lambda x: x[index])
    return {k: float(pick(s).sum() / max(pick(c).sum(), 1.0)) for k, (s, c) in sums.items()}


def plausibility(
    skeleton: Skeleton, fps: float, feet: Feet, root, rotations, offsets=None, valid=None
) -> dict:
    """The :data:`METRICS` over all windows ``[K, T, ...]``, as floats."""
    return mean(window_sums(skeleton, fps, feet, root, rotations, offsets, valid))
