"""Window transforms (augmentation, normalization, noise) and their model-side inverse.

The window transforms are written once over the array module of their inputs, like
:mod:`motionjax.core.rotations`: numpy in, numpy out (evaluation, inference, the reference the tests
hold the device path to); jax in, jax out (:mod:`motionjax.data.augment` runs them on the device,
inside one jitted program per batch). Every function takes arrays with any leading dims, so one call
transforms one window ``[T, ...]`` or a whole batch ``[B, T, ...]``. No in-place writes and no
data-dependent Python branches on jax inputs (they would not trace).

Forward, per window (:func:`make_example`):
  mirror (augmentation, both targets) -> canonicalize (root-relative, heading removed at the
  window start, floor at 0, optional uniform retarget) -> clean features -> noisy copy: time-warp
  jitter, tangent-space rotation noise, root position noise -> standardize -> joint/frame masking
  -> chunk ``[T, F] -> [T/C, C, F]``.
Inverse (model side, jax or numpy): :func:`unchunk`, :func:`denormalize` (destandardize, decode) and
:func:`uncanonicalize` (back to the clip's world frame).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import NamedTuple

import numpy as np

from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics, forward_kinematics_tree
from motionjax.core.skeleton import Skeleton

# --------------------------------------------------------------------------------------------
# Clip-level (prepare time)


def resample(root_position, rotations, src_fps: float, dst_fps: float):
    """Resample a clip ``[T, 3]``, ``[T, J, 4]`` to ``dst_fps``: lerp the root, slerp rotations.

    The output covers the same duration, ``floor((T-1)·dst/src) + 1`` frames. Rates within 10 ppm
    are the same rate written with rounding (BVH ``Frame Time: 0.0333333``): returned unchanged.
    """
    if abs(src_fps / dst_fps - 1) < 1e-5:
        return root_position, rotations
    n = int(np.floor((root_position.shape[0] - 1) * dst_fps / src_fps + 1e-6)) + 1
    return interpolate_frames(root_position, rotations, np.arange(n) * (src_fps / dst_fps))


def interpolate_frames(root_position, rotations, frames):
    """A clip ``[T, 3]``, ``[T, J, 4]`` at fractional frame indices ``frames [N]`` (in ``[0, T-1]``):
    root lerped, rotations slerped between the neighbouring frames."""
    t = root_position.shape[0]
    i0 = np.minimum(np.floor(frames).astype(int), max(t - 2, 0))
    i1 = np.minimum(i0 + 1, t - 1)
    frac = (frames - i0)[:, None].astype(root_position.dtype)
    root = root_position[i0] * (1 - frac) + root_position[i1] * frac
    quats = rot.quat_slerp(rotations[i0], rotations[i1], np.broadcast_to(frac, rotations[i0].shape[:-1]))
    return root, rot.quat_normalize(quats).astype(rotations.dtype)


def dynamics_score(skeleton: Skeleton, root_position, rotations, fps: float, positions=None):
    """``[T]`` per-frame abruptness: mean joint |acceleration| + |jerk|·dt (both m/s²).

    Central differences of FK positions (``positions [T, J, 3]`` when the caller has them);
    edge frames repeat their neighbour's value.
    """
    pos = forward_kinematics(skeleton, rotations, root_position)[0] if positions is None else positions
    t = pos.shape[0]
    score = np.zeros(t, np.float32)
    if t >= 4:
        acc = np.linalg.norm(np.diff(pos, 2, axis=0), axis=-1).mean(-1) * fps**2  # [T-2]
        jerk = np.linalg.norm(np.diff(pos, 3, axis=0), axis=-1).mean(-1) * fps**2  # |jerk|·dt
        score[1:-1] = acc
        score[1:-2] += jerk
        score[0], score[-1] = score[1], score[-2]
    return score


def window_scores(score, length: int):
    """``[S - length + 1]``: mean per-frame ``score [S]`` of every window of ``length`` frames."""
    csum = np.concatenate([[0.0], np.cumsum(score, dtype=np.float64)])
    return (csum[length:] - csum[:-length]) / length


SHORT_SEGMENT = 0.5  # a segment of at least this fraction of a window trains as one padded window


def segment_windows(score, window: int):
    """Scores of the training windows of one segment with per-frame ``score [S]``: every full
    window; or, for ``SHORT_SEGMENT·window <= S < window`` (e.g. walk and run at 30 fps), the one
    edge-padded window (frames past the end repeat the last frame and have ``valid = 0``), scored
    by the segment mean; or none."""
    if score.size >= window:
        return window_scores(score, window)
    return np.array([score.mean()]) if score.size >= SHORT_SEGMENT * window else np.zeros(0)


def window_weights(scores, dynamics_sampling: float, num_windows: int, total_score: float):
    """Probability of each window with score ``scores [n]`` among all ``num_windows`` training
    windows (scores summing to ``total_score``): ``(1 - w)/N + w·score/S``.

    ``w = 0`` is uniform over windows; ``w = 1`` draws windows in proportion to their dynamics, so
    abrupt segments (flips, kicks, landings) stay hot.
    """
    if total_score <= 0:
        return np.full(np.shape(scores), 1.0 / num_windows)
    return (1 - dynamics_sampling) / num_windows + dynamics_sampling * np.asarray(scores) / total_score


# --------------------------------------------------------------------------------------------
# Windows from spans (training draws)


def floor_from_spans(cfg) -> bool:
    """Whether training windows take their floor from their spans' per-frame floor
    (:func:`window_floor`; the spans then carry ``"lowest"``, the program runs no FK for it), for
    ``config.data`` (``cfg``): with ``floor_align``, unless a pose offset (another pose than the
    span's) or a forecast (a floor from the observed frames only) changes what the floor is of."""
    return bool(cfg.floor_align) and not cfg.pose_offset and not cfg.observed


def span_frames(window: int, speed_range: float = 1.0) -> int:
    """Frames a training draw reads from its start: ``window``, or at speeds up to ``speed_range``
    the frames ``0 … (window-1)·speed_range`` and one more to interpolate towards."""
    return window if speed_range == 1.0 else int(np.ceil((window - 1) * speed_range)) + 2


def frame_rows(root_position, rotations, lowest=None) -> np.ndarray:
    """A segment's frames as rows: ``root_position [N, 3]``, ``rotations [N, J, 4]`` and optionally
    each frame's floor ``lowest [N]`` -> ``[N, 3 + 4J (+ 1)]`` float32, in that order. The streamed
    tier's spans travel in this layout (``pipeline.SampleWindow.gather``) and the resident corpus's
    table holds it (``resident.Corpus.arrays``): a span is one slice of its segment's rows, and on
    the device the root and rotations are adjacent columns of one array, which :func:`lerp_frames`
    gathers as whole rows with no concatenation (a pass over the span of its own, ~0.3 ms of the
    headline autoencoder's ~2.5 ms streamed program on XLA:CPU)."""
    parts = [root_position, rotations.reshape(len(rotations), -1)]
    parts += [lowest[:, None]] if lowest is not None else []
    return np.concatenate(parts, axis=1).astype(np.float32)


def split_frames(frames, joints: int) -> dict:
    """Frame rows ``[..., S, W]`` (:func:`frame_rows`) -> ``{"root_position" [..., S, 3], "rotations"
    [..., S, J, 4]}``, with ``"lowest" [..., S]`` when ``W = 3 + 4J + 1``: views (numpy), or slices that
    XLA fuses into their readers (jax)."""
    r = 3 + 4 * joints
    out = {"root_position": frames[..., :3],
           "rotations": frames[..., 3:r].reshape(*frames.shape[:-1], joints, 4)}
    if frames.shape[-1] > r:
        out["lowest"] = frames[..., r]
    return out


def read_rows(rows, start, end, frames: int, out=None):
    """``frames`` rows of ``rows [T, ...]`` from ``start``, the rows past the segment ``end`` (exclusive)
    repeating row ``end - 1``: ``[frames, ...]``, written into ``out`` when given (e.g. a batch's row:
    the span copied once, as slices, with no array of its own)."""
    if out is None:
        out = np.empty((frames, *rows.shape[1:]), rows.dtype)
    real = max(0, min(frames, end - start))  # frames inside the segment; the rest repeat its last
    out[:real] = rows[start:start + real]
    if real < frames:
        out[real:] = rows[end - 1]
    return out


def read_span(root_position, rotations, start, end, frames: int, out=None):
    """``frames`` frames of clips ``[T, 3]``, ``[T, J, 4]`` from ``start``, the frames past the segment
    ``end`` (exclusive) repeating frame ``end - 1`` (:func:`read_rows` of each): ``(root [frames, 3],
    rotations [frames, J, 4])``, written into ``out`` when given."""
    root_out, rot_out = (None, None) if out is None else out
    return (read_rows(root_position, start, end, frames, root_out),
            read_rows(rotations, start, end, frames, rot_out))


def read_window(root_span, rot_span, length, window: int, speed=None):
    """A window from each span ``[..., S, 3]``, ``[..., S, J, 4]`` whose first ``length [...]`` frames
    are real (the later ones repeat the last real one, :func:`read_span`).

    Frame ``i`` is span frame ``min(i·speed, length - 1)`` (``speed [...]``; None: 1), root lerped and
    rotations nlerped between neighbouring frames (within θ³/200 rad of slerp, :func:`rot.quat_nlerp`:
    5e-6 rad for frames 0.1 rad apart, at a tenth of its cost on XLA:CPU), so ``speed > 1`` plays the
    motion faster. Returns
    ``(root [..., T, 3], rotations [..., T, J, 4], valid [..., T] float32)``, valid = 1 where
    ``i·speed <= length - 1`` (0: edge padding past the segment's end)."""
    xp = rot._xp(root_span, rot_span, length, speed)
    if speed is None:  # frame i is span frame min(i, length - 1): the span's own frame i
        i = xp.asarray(np.arange(window))
        return (root_span[..., :window, :], rot_span[..., :window, :, :],
                (i <= xp.asarray(length)[..., None] - 1).astype(np.float32))
    i0, i1, frac, valid = _read_frames(xp, length, window, speed, root_span.shape[-2])
    root, quats = lerp_frames(root_span, rot_span, i0, i1, frac)
    return root, quats.astype(rot_span.dtype), valid


def _read_frames(xp, length, window: int, speed, span: int):
    """Where :func:`read_window` reads its frames at ``speed [...]`` from spans of ``span`` frames whose
    first ``length [...]`` are real: ``(i0, i1 [..., T] int32, frac [..., T], valid [..., T])``, frame
    ``i`` between span frames ``i0`` and ``i1`` at ``frac``."""
    length = xp.asarray(length)[..., None]
    f = np.arange(window, dtype=np.float32) * xp.asarray(speed, np.float32)[..., None]  # [..., T]
    valid = (f <= length - 1).astype(np.float32)
    f = xp.minimum(f, (length - 1).astype(np.float32))
    i0 = xp.floor(f).astype(np.int32)
    return i0, xp.minimum(i0 + 1, span - 1), f - i0, valid


def window_floor(lowest, length, window: int, speed=None):
    """``[...]``: the floor of :func:`read_window`'s window (``length``, ``window``, ``speed`` as
    there) from its span's per-frame floor ``lowest [..., S]`` (:func:`frame_floor` of the span's
    frames), with no FK: the minimum over the window's frames of the per-frame floor read as the
    frames are, lerped between the two span frames a frame lies between.

    At ``speed`` None (every frame a span frame) this is the floor :func:`canonicalize` computes,
    exactly. Between span frames it is an approximation: FK of an nlerped pose is not the lerp of
    its frames' joint heights (a foot planted on both frames dips a little in between; another
    joint may be lowest there). Measured against FK of the interpolated windows on Bandai-2 (30
    fps, speeds in [0.8, 1.25], 3,000 windows): 0.45 mm above it on average, 3.9 mm at most; the
    floor only sets the canonical root height (docs/input.md, eighth pass; the bound is held by
    ``tests/test_data.py``)."""
    xp = rot._xp(lowest, length, speed)
    if speed is None:  # frames past the segment's end repeat its last real one: the same minimum
        return lowest[..., :window].min(-1)
    i0, i1, frac, _ = _read_frames(xp, length, window, speed, lowest.shape[-1])
    bounds = {} if xp is np else {"mode": "promise_in_bounds"}
    l0, l1 = (xp.take_along_axis(lowest, i, axis=-1, **bounds) for i in (i0, i1))
    frac = frac.astype(lowest.dtype)
    return (l0 * (1 - frac) + l1 * frac).min(-1)


def lerp_frames(root_position, rotations, i0, i1, frac):
    """Windows ``[..., S, 3]``, ``[..., S, J, 4]`` at fractional frames: frame ``t`` of the result is
    ``(1 - frac)·x[i0] + frac·x[i1]`` (``i0``, ``i1`` ``[..., T]`` int, ``frac [..., T]``), the root
    lerped and the rotations nlerped (:func:`rot.quat_nlerp`: ``q1`` negated where its dot product
    with ``q0`` is negative, the shortest arc). Returns ``(root [..., T, 3], rotations [..., T, J, 4])``.

    Whole frames (root and every joint's quaternion, ``[..., 3 + 4J]`` rows) are gathered, each once,
    and the pair's sign is folded into the lerp weight: on XLA:CPU per-joint gathers, and a sign
    flip that every quaternion component recomputes, cost a fifth of the augmentation program; so
    did aligning every frame to its predecessor's hemisphere (a cumulative count of sign flips) before
    a single lerp, which this replaces (docs/input.md). The same numbers bit for bit up to a
    rotation's sign, which no feature sees."""
    xp = rot._xp(root_position, rotations, i0, i1, frac)
    s, j = rotations.shape[-3:-1]
    x = xp.concatenate([root_position, rotations.reshape(*rotations.shape[:-3], s, j * 4)], -1)
    # The indices are in bounds by construction: no out-of-bounds select in jax's gather.
    bounds = {} if xp is np else {"mode": "promise_in_bounds"}
    x0, x1 = (xp.take_along_axis(x, i[..., None], axis=-2, **bounds) for i in (i0, i1))
    return lerp_rows(x0, x1, frac, j)


def lerp_rows(x0, x1, frac, joints: int):
    """:func:`lerp_frames` of the frame rows it gathered: ``x0``, ``x1 [..., T, 3 + 4J (+ more)]`` (root,
    rotations, then columns it does not read), ``frac [..., T]`` -> ``(root [..., T, 3], rotations [...,
    T, J, 4])``, ``(1 - frac)·x0 + frac·x1``, the rotations nlerped."""
    xp = rot._xp(x0, x1, frac)
    dtype, j = x0.dtype, joints
    # Each gather once (rot.materialize): fused into the lerp, every component would redo it.
    x0, x1 = rot.materialize(x0), rot.materialize(x1)
    q0, q1 = (y[..., 3:3 + 4 * j].reshape(*y.shape[:-1], j, 4) for y in (x0, x1))
    frac = xp.asarray(frac).astype(dtype)[..., None]  # [..., T, 1]
    f = frac[..., None]
    w1 = xp.where(rot.component_sum(q0 * q1, keepdims=True) < 0, -f, f)  # [..., T, J, 1]
    # The lerp computed once: the normalization reads it per component.
    q = rot.materialize(q0 * (1 - f) + q1 * w1)
    return x0[..., :3] * (1 - frac) + x1[..., :3] * frac, rot.quat_normalize(q)


def read_window_rows(table, rows, length, window: int, joints: int, speed=None):
    """:func:`read_window` and :func:`window_floor` of the spans ``table[rows]`` without gathering them:
    ``table [N, 3 + 4J + 1]`` frame rows (root, rotations, each frame's floor: a resident corpus's),
    ``rows [..., S]`` int the table row of each span frame, ``length [...]`` its real frames. Each
    window frame's two span frames are gathered from the table directly (two ``[..., T, W]`` row
    gathers; the span, ``[..., S, W]``, is never made: on XLA:CPU its gather and the concatenation of
    its columns were ~30% of the resident autoencoder's program, docs/input.md tenth pass). The same
    numbers as :func:`read_window` and :func:`window_floor` of the gathered span. Returns ``(root [...,
    T, 3], rotations [..., T, J, 4], valid [..., T] float32, floor [...])``."""
    xp = rot._xp(table, rows, length, speed)
    bounds = {} if xp is np else {"mode": "promise_in_bounds"}
    r = 3 + 4 * joints
    take = lambda i: xp.take_along_axis(rows, i, axis=-1, **bounds)  # noqa: E731  span frame -> table row
    if speed is None:  # frame i is span frame min(i, length - 1): the span's own frame i
        i = xp.asarray(np.arange(window))
        x = rot.materialize(table[rows[..., :window]])
        return (x[..., :3], x[..., 3:r].reshape(*x.shape[:-1], joints, 4),
                (i <= xp.asarray(length)[..., None] - 1).astype(np.float32), x[..., r].min(-1))
    i0, i1, frac, valid = _read_frames(xp, length, window, speed, rows.shape[-1])
    x0, x1 = rot.materialize(table[take(i0)]), rot.materialize(table[take(i1)])  # each gather once
    root, quats = lerp_rows(x0, x1, frac, joints)
    f = frac.astype(table.dtype)
    return root, quats.astype(table.dtype), valid, (x0[..., r] * (1 - f) + x1[..., r] * f).min(-1)


def reverse_window(root_position, rotations, valid, flip):
    """Windows ``[..., T, 3]``, ``[..., T, J, 4]``, ``valid [..., T]`` played backwards where ``flip
    [...]`` (bool) is set."""
    xp = rot._xp(root_position, rotations, valid, flip)
    f = lambda x: xp.where(flip.reshape(flip.shape + (1,) * (x.ndim - flip.ndim)), xp.flip(x, flip.ndim), x)  # noqa: E731
    return f(root_position), f(rotations), f(valid)


def offset_pose(skeleton: Skeleton, rotations, eps):
    """Every frame's joint rotations ``[..., T, J, 4]`` turned by the same rotation vectors ``eps [...,
    J, 3]`` (rad, in each joint's tangent space; the root's left alone, so heading and trajectory
    stay): the same motion from a pose the corpus may not hold (``data.pose_offset``)."""
    eps = eps * (np.arange(skeleton.num_joints) > 0).astype(eps.dtype)[:, None]
    return rotation_noise(skeleton, rotations, eps[..., None, :, :]).astype(rotations.dtype)


# --------------------------------------------------------------------------------------------
# Window normalization


@functools.lru_cache(maxsize=16)
def rest_height(skeleton: Skeleton) -> float:
    """Height of the root above the lowest joint in the rest pose (m)."""
    rest = rot.identity_quat((skeleton.num_joints,), np.float64, np)
    pos, _ = forward_kinematics(skeleton, rest, np.zeros(3))
    return float(-pos[:, skeleton.up_axis].min())


def _unit(axis: int, size: int, dtype) -> np.ndarray:
    """``[size]``: 1 at ``axis``, 0 elsewhere (selects a component without an in-place write)."""
    return (np.arange(size) == axis).astype(dtype)


def heading(skeleton: Skeleton, root_rotation):
    """Yaw part (twist about the up axis) of root rotations ``[..., 4]`` -> ``[..., 4]``."""
    xp = rot._xp(root_rotation)
    dtype = root_rotation.dtype
    yaw = root_rotation * (_unit(0, 4, dtype) + _unit(1 + skeleton.up_axis, 4, dtype))
    norm = xp.linalg.norm(yaw, axis=-1, keepdims=True)
    # A root upside down about a horizontal axis has no defined yaw: keep identity there.
    identity = rot.identity_quat(yaw.shape[:-1], yaw.dtype, xp)
    return xp.where(norm > 1e-6, yaw / xp.maximum(norm, 1e-6), identity)


def frame_floor(skeleton: Skeleton, root_position, rotations, offsets=None):
    """``[..., T]``: each frame's lowest joint height (up axis) by FK of ``root_position [..., T, 3]``,
    ``rotations [..., T, J, 4]`` on ``offsets [..., J, 3]`` (None: the skeleton's). The floor
    :func:`canonicalize` takes is a window's minimum of it, scaled: neither the heading removal nor the
    ground translation nor the mirror (a reflection across a vertical plane, with its mirrored
    offsets) moves a height, so a resident corpus computes it once per frame (``lowest``)."""
    bones = skeleton.offsets if offsets is None else offsets[..., None, :, :]
    pos, _ = forward_kinematics_tree(skeleton, rotations, root_position, bones, xp=rot._xp(rotations))
    return pos[skeleton.up_axis].min(axis=0)


def stored_floor(skeleton: Skeleton, root_position, rotations, offsets) -> np.ndarray:
    """``[T]`` float32: :func:`frame_floor` of a segment's frames ``root_position [T, 3]``, ``rotations
    [T, J, 4]`` as the input path keeps it beside them (the resident corpus's ``lowest``, the streamed
    host cache's): FK in float64 on ``offsets [J, 3]``, the bones its windows move on."""
    return frame_floor(skeleton, np.asarray(root_position, np.float64), np.asarray(rotations, np.float64),
                       np.asarray(offsets, np.float64)).astype(np.float32)


def canonicalize(skeleton: Skeleton, root_position, rotations, *, floor: bool = True, scale: float = 1.0,
                 offsets=None, floor_frames: int = 0, lowest=None):
    """Express windows ``[..., T, 3]``, ``[..., T, J, 4]`` in their own start frame.

    Root-relative: the root's ground position at frame 0 goes to the origin. Heading: the root's
    yaw at frame 0 is removed (the window starts facing the same way). Floor: the lowest joint over
    the window touches height 0, by FK on ``offsets [..., J, 3]`` (each window's clip's rest
    offsets; None: the skeleton's), or over its first ``floor_frames`` frames when that is > 0 (a
    forecast's observed past: the floor may not come from the future it predicts); ``lowest [...]``,
    when given, is that window minimum of :func:`frame_floor` of the unscaled input (the FK
    skipped). Retarget:
    positions scale by ``scale`` (uniform bone-length retargeting to a canonical body size; bone
    offsets scale alike, rotations are unchanged).

    Returns ``(root_position, rotations, yaw [..., 4], origin [..., 3])``; :func:`uncanonicalize`
    with ``yaw``/``origin`` undoes it exactly.
    """
    xp = rot._xp(root_position, rotations, offsets)
    up = _unit(skeleton.up_axis, 3, root_position.dtype)
    yaw = heading(skeleton, rotations[..., 0, 0, :])
    inv = rot.quat_conj(yaw)[..., None, :]
    origin = root_position[..., 0, :] * (1 - up)
    root = rot.quat_rotate(inv, root_position - origin[..., None, :]) * scale
    raw, rotations = rotations, xp.concatenate([rot.quat_mul(inv, rotations[..., :, 0, :])[..., :, None, :],
                                                rotations[..., :, 1:, :]], axis=-2)
    if floor:
        if lowest is None:  # on the input as given: the heading removal moves no height
            seen = slice(0, floor_frames or None)
            lowest = frame_floor(skeleton, root_position[..., seen, :], raw[..., seen, :, :], offsets).min(-1)
        root = root - (lowest * scale)[..., None, None] * up
        origin = origin + lowest[..., None] * up
    return root, rotations, yaw, origin


def uncanonicalize(root_position, rotations, yaw, origin, *, scale: float = 1.0):
    """Inverse of :func:`canonicalize` (numpy or jax): back to the clip's world frame."""
    root = rot.quat_rotate(yaw[..., None, :], root_position / scale) + origin[..., None, :]
    xp = rot._xp(rotations, yaw)
    root_rot = rot.quat_mul(yaw[..., None, :], rotations[..., :, 0, :])
    return root, xp.concatenate([root_rot[..., :, None, :], rotations[..., :, 1:, :]], axis=-2)


@functools.lru_cache(maxsize=16)
def mirrorable(skeleton: Skeleton, tol: float = 1e-3) -> bool:
    """Whether :func:`mirror` with the plain frames is exact for this skeleton: every joint's rest
    offset is its twin's reflected across ``lateral_axis`` (within ``tol`` m), i.e. all joint
    frames are parallel to the world's at rest (DeepMimic, SMPL-like bodies). Rigs whose left and
    right joint frames differ (Bandai Namco's bones point along +x on the left and -x on the right)
    are not; :func:`mirror_frames` finds their frames from the data."""
    return bool(np.abs(mirror_offsets(skeleton, skeleton.offsets) - skeleton.offsets).max() <= tol)


class MirrorFrames(NamedTuple):
    """The reflections :func:`mirror` applies: diagonal sign matrices with det -1."""
    world: np.ndarray   # [3]: the world's, across a vertical plane
    joints: np.ndarray  # [J, 3]: ``N_j``, each joint frame's onto its twin's


def _plain_frames(skeleton: Skeleton) -> MirrorFrames:
    """The world reflection across ``lateral_axis``, in the world and in every joint frame."""
    flip = _lateral_flip(skeleton, np.float64)
    return MirrorFrames(flip, np.tile(flip, (skeleton.num_joints, 1)))


# The reflections a joint frame may map onto its twin's: diagonal sign matrices with det -1.
_REFLECTIONS = np.array([(-1, 1, 1), (1, -1, 1), (1, 1, -1), (-1, -1, -1)], np.float64)


def mirror_frames(skeleton: Skeleton, mean=None, tol: float = 1e-3) -> MirrorFrames | None:
    """The frames that mirror this skeleton's motion, or ``None`` when it cannot be mirrored.

    With all joint frames parallel to the world's at rest (:func:`mirrorable`) every reflection is
    the world's across ``lateral_axis``. Other rigs give each side its own joint frames (Bandai
    Namco: every bone along its joint's ±x), and the offsets alone leave the reflections ambiguous,
    so the data decide: the feature ``mean [F]`` holds each joint's mean rotation (its first two
    columns), and the mirrored rotation of joint ``j`` is ``N_parent R_j N_j``. Down the tree, each
    ``N_j`` is the candidate whose mirrored mean rotation and bone directions are nearest the
    twin's own (for the root, together with the world's reflection: any vertical plane mirrors a
    motion, up to a turn that canonicalization removes). ``None`` unless every choice wins clearly
    (by 2x), the chosen frames make the rest offsets mirror images within ``tol`` m, and there are
    no hinges (a hinge's mirror must stay a hinge).
    """
    if mirrorable(skeleton, tol):
        return _plain_frames(skeleton)
    key = None if mean is None else np.asarray(mean, np.float64).tobytes()
    return _data_frames(skeleton, key, tol)


@functools.lru_cache(maxsize=16)
def _data_frames(skeleton: Skeleton, mean_bytes, tol: float) -> MirrorFrames | None:
    def off(why):
        logging.warning("mirror augmentation is off for %s: %s", skeleton, why)
        return None

    if mean_bytes is None:
        return off("its left and right joint frames differ and no feature statistics were given")
    if "hinge" in skeleton.kinds:
        return off("it has hinge joints")
    ids = features.rotating_joints(skeleton)
    m = np.frombuffer(mean_bytes, np.float64)[3:].reshape(len(ids), 2, 3)
    mean_rot = {j: m[k].T for k, j in enumerate(ids)}  # [3, 2]: the first two matrix columns

    length = np.linalg.norm(skeleton.offsets, axis=-1, keepdims=True)
    direction = np.where(length > 1e-6, skeleton.offsets / np.maximum(length, 1e-6), 0.0)  # [J, 3]

    def choose(j, n_parent):
        """(cost, N_j, second-best cost) of joint ``j`` under its parent's reflection: the distance
        of the mirrored mean rotation from the twin's, plus that of the mirrored bone directions
        (in ``j``'s frame) from the twin's children's."""
        sym, kids = skeleton.symmetry, list(skeleton.children[j])
        cost = [np.abs(n_parent[:, None] * mean_rot[j] * n[None, :2] - mean_rot[sym[j]]).sum()
                + np.abs(direction[kids] * n - direction[sym[kids]]).sum() for n in _REFLECTIONS]
        best, second = np.sort(cost)[:2]
        return best, _REFLECTIONS[int(np.argmin(cost))], second

    worlds = [np.where(np.arange(3) == a, -1.0, 1.0) for a in range(3) if a != skeleton.up_axis]
    joints = np.zeros((skeleton.num_joints, 3))
    world = worlds[0]
    for j in range(skeleton.num_joints):  # parents come first
        p = skeleton.parents[j]
        if j not in mean_rot:  # a fixed joint stays the identity: N_parent I N_j = I
            joints[j] = world if p < 0 else joints[p]
            continue
        if p < 0:
            (best, n, second), world = min(((choose(j, w), w) for w in worlds), key=lambda c: c[0][0])
        else:
            best, n, second = choose(j, joints[p])
        if not best * 2 < second:
            return off(f"joint {skeleton.names[j]!r}'s mirrored frame is ambiguous in the data")
        joints[j] = n
    frames = MirrorFrames(world, joints)
    if np.abs(mirror_offsets(skeleton, skeleton.offsets, frames) - skeleton.offsets).max() > tol:
        return off("its rest offsets are not mirror images in the frames the data pick")
    return frames


def _sign_quat(signs) -> np.ndarray:
    """``[..., 3]`` diagonal of a rotation (det +1) -> its quaternion ``[..., 4]``: the identity or a
    half turn about the axis whose sign is +1."""
    s = np.asarray(signs)
    q = np.zeros(s.shape[:-1] + (4,))
    q[..., 0] = s.sum(-1) == 3
    q[..., 1:] = (s > 0) & (s.sum(-1, keepdims=True) == -1)
    return q


def _parent_frames(skeleton: Skeleton, frames: MirrorFrames) -> np.ndarray:
    """``[J, 3]``: the reflection of each joint's parent frame (the world's for the root)."""
    return np.stack([frames.world if p < 0 else frames.joints[p] for p in skeleton.parents])


def mirror(skeleton: Skeleton, root_position, rotations, frames: MirrorFrames | None = None):
    """Reflect windows across the body's sagittal plane and swap left/right joints.

    ``frames`` (:func:`mirror_frames`; default: the world reflection ``M`` across ``lateral_axis``
    everywhere) holds the reflections ``N_j``. The root position becomes ``M p``, and joint ``j``'s
    twin takes the local rotation ``N_parent R_j N_j`` (``N_parent = M`` for the root), a rotation
    since both factors reflect: as quaternions ``p_parent ⊗ q_j ⊗ p_j`` with ``p`` the half turn
    ``-N``. FK of the result is FK of the input reflected, provided the rest offsets are mirror
    images in these frames or FK runs on :func:`mirror_offsets` of them.
    """
    frames = _plain_frames(skeleton) if frames is None else frames
    source, sign = _mirror_permutation(skeleton, np.asarray(frames.world, np.float64).tobytes(),
                                       np.asarray(frames.joints, np.float64).tobytes())
    flat = rotations.reshape(*rotations.shape[:-2], -1)  # [..., J*4]
    out = flat[..., source] * sign.astype(rotations.dtype)
    return (root_position * frames.world.astype(root_position.dtype),
            out.reshape(rotations.shape))


@functools.lru_cache(maxsize=16)
def _mirror_permutation(skeleton: Skeleton, world: bytes, joints: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(source [J*4] int, sign [J*4])``: :func:`mirror`'s ``p_parent ⊗ q_j ⊗ p_j`` then the swap of
    twins, on a frame's quaternions flattened ``[J*4]``: ``out[i] = sign[i] * q[source[i]]``. Each
    ``p`` is the identity or a half turn about a coordinate axis (a unit basis quaternion), so both
    products only permute a quaternion's components and flip signs: one gather instead of two
    Hamilton products (exactly the same numbers, a zero's sign aside). ``world``, ``joints``: the
    :class:`MirrorFrames`' float64 bytes (hashable)."""
    frames = MirrorFrames(np.frombuffer(world), np.frombuffer(joints).reshape(-1, 3))
    half = _sign_quat(-frames.joints)                         # [J, 4]
    parent = _sign_quat(-_parent_frames(skeleton, frames))    # [J, 4]
    basis = np.eye(4)[:, None, :]                             # [4 (component), 1, 4]
    image = rot.quat_mul(parent, rot.quat_mul(basis, half))   # [4, J, 4]: where each component goes
    source, sign = np.zeros((skeleton.num_joints, 4), int), np.zeros((skeleton.num_joints, 4))
    for k, j in enumerate(skeleton.symmetry):  # twin k takes joint j's mirrored rotation
        for c in range(4):
            (src,) = np.flatnonzero(image[:, j, c])
            source[k, c], sign[k, c] = 4 * j + src, image[src, j, c]
    return source.reshape(-1), sign.reshape(-1)


def _lateral_flip(skeleton: Skeleton, dtype) -> np.ndarray:
    """``[3]``: the reflection across the body's sagittal plane (-1 on ``lateral_axis``)."""
    flip = np.ones(3, dtype)
    flip[skeleton.lateral_axis] = -1
    return flip


def mirror_offsets(skeleton: Skeleton, offsets, frames: MirrorFrames | None = None):
    """The rest offsets ``[..., J, 3]`` of the mirrored body: joint ``c``'s twin takes ``N_parent o_c``
    (``frames`` as in :func:`mirror`). With them, FK of :func:`mirror`'s output is FK of its input
    reflected for any offsets, also a performer whose two sides differ; offsets that are already
    mirror images come back unchanged."""
    frames = _plain_frames(skeleton) if frames is None else frames
    return (offsets * _parent_frames(skeleton, frames).astype(offsets.dtype))[..., skeleton.symmetry, :]


def normalize(skeleton: Skeleton, root_position, rotations, mean, std, *, floor=True, scale=1.0):
    """Windows -> standardized features ``[..., T, F]`` plus the ``(yaw, origin)`` frame."""
    root, rots, yaw, origin = canonicalize(skeleton, root_position, rotations, floor=floor, scale=scale)
    x = features.standardize(features.pack(skeleton, root, rots), mean, std)
    return x.astype(np.float32), yaw, origin


def denormalize(skeleton: Skeleton, x, mean, std):
    """Model side: standardized features ``[..., T, F]`` (chunked ones go through :func:`unchunk`
    first) -> canonical ``(root_position [..., T, 3], rotations [..., T, J, 4])``, jax or numpy."""
    return features.unpack(skeleton, features.destandardize(x, mean, std))


def chunk(x, size: int):
    """``[..., T, F] -> [..., T/size, size, F]`` (time chunks for the model and the mesh)."""
    t = x.shape[-2]
    if t % size:
        raise ValueError(f"window of {t} frames does not split into chunks of {size}")
    return x.reshape(*x.shape[:-2], t // size, size, x.shape[-1])


def unchunk(x):
    """``[..., N, C, F] -> [..., N·C, F]``."""
    return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])


# --------------------------------------------------------------------------------------------
# Noise injection


@dataclasses.dataclass(frozen=True)
class Noise:
    """Corruption of the ``noisy`` input (units in the field names); ``mirror_prob`` augments both.

    rot_std: per-axis std (rad) of the tangent-space rotation noise on every rotating joint (hinges
      get only the component along their axis, so they stay hinges).
    pos_std: per-axis std (m) of the root position noise.
    joint_mask_prob / frame_mask_prob: chance a (frame, joint) rotation / a whole frame is masked
      (its standardized features set to 0, the dataset mean).
    time_warp: max shift (frames) of the smooth warp ``u = t + δ·sin(πt/(T-1))``, ``δ ~ U(±time_warp)``
      (end frames fixed; monotone while ``time_warp < (T-1)/π``).
    mirror_prob: chance a window is mirrored (clean and noisy alike).
    clean_prob: chance a window's input is left uncorrupted (no noise, mask or warp), so a denoiser
      also learns to keep clean motion as it is.
    """

    rot_std: float = 0.0
    pos_std: float = 0.0
    joint_mask_prob: float = 0.0
    frame_mask_prob: float = 0.0
    time_warp: float = 0.0
    mirror_prob: float = 0.0
    clean_prob: float = 0.0

    @classmethod
    def from_config(cls, cfg) -> Noise:
        """The training corruption of ``config.data``."""
        return cls(cfg.rot_noise, cfg.pos_noise, cfg.joint_mask_prob, cfg.frame_mask_prob, cfg.time_warp,
                   cfg.mirror_prob, cfg.clean_prob)

    @classmethod
    def evaluation(cls, cfg, level: float) -> Noise:
        """The evaluation's corruption: ``config.data``'s rotation and root-position noise scaled by
        ``level`` (0: clean), no masking, time warp or mirroring."""
        return cls(rot_std=cfg.rot_noise * level, pos_std=cfg.pos_noise * level)

    def sample(self, rng: np.random.Generator, frames: int, skeleton: Skeleton, batch: tuple = ()) -> dict:
        """Random draws for windows ``[*batch, frames]`` (the transform is deterministic given these)."""
        r, j = len(features.rotating_joints(skeleton)), skeleton.num_joints
        draws = {
            "rot": (rng.standard_normal((*batch, frames, j, 3)) * self.rot_std).astype(np.float32),
            "pos": (rng.standard_normal((*batch, frames, 3)) * self.pos_std).astype(np.float32),
            "joint_mask": rng.random((*batch, frames, r)) < self.joint_mask_prob,
            "frame_mask": rng.random((*batch, frames)) < self.frame_mask_prob,
            "warp": rng.uniform(-self.time_warp, self.time_warp, batch).astype(np.float32),
            "mirror": rng.random(batch) < self.mirror_prob,
        }
        if self.clean_prob:  # no extra draw when off: same stream
            corrupt = rng.random(batch) >= self.clean_prob
            for k in ("rot", "pos", "joint_mask", "frame_mask", "warp"):
                v = draws[k]
                draws[k] = v * corrupt.reshape(corrupt.shape + (1,) * (v.ndim - corrupt.ndim))
        return draws


def rotation_noise(skeleton: Skeleton, rotations, eps):
    """``q ⊗ exp(P_j ε)``: perturb ``rotations [..., J, 4]`` by rotation vectors ``eps [..., J, 3]``
    in each joint's local tangent space. ``P_j`` is the identity for ball joints, ``a aᵀ`` for
    hinges (they stay on their axis) and zero for fixed joints."""
    ball = skeleton.ball_mask.astype(eps.dtype)[:, None]
    hinge_axes = skeleton.hinge_axes.astype(eps.dtype)
    eps = eps * ball + rot.component_sum(eps * hinge_axes, keepdims=True) * hinge_axes
    # Projected once: fused into the exp map, XLA:CPU recomputed it per component (10% of the
    # device augmentation program, docs/input.md).
    return rot.quat_mul(rotations, rot.axis_angle_to_quat(rot.materialize(eps)))


def time_warp(root_position, rotations, delta):
    """Resample windows at ``u = t + δ·sin(πt/(T-1))`` (``delta [...]`` frames): lerp / nlerp."""
    xp = rot._xp(root_position, rotations, delta)
    t = root_position.shape[-2]
    base = np.arange(t, dtype=np.float32)
    shift = xp.asarray(delta, np.float32)[..., None] * np.sin(np.pi * base / max(t - 1, 1)).astype(np.float32)
    u = xp.clip(base + shift, 0, t - 1)  # [..., T]
    i0 = xp.minimum(xp.floor(u).astype(np.int32), t - 2)
    return lerp_frames(root_position, rotations, i0, i0 + 1, u - i0)


def hold_last(x, observed: int):
    """``x [..., T, F]`` with frames ``observed..T-1`` replaced by frame ``observed - 1`` (numpy or jax)."""
    t = x.shape[-2]
    idx = np.minimum(np.arange(t), observed - 1)
    return x[..., idx, :]


SEAM_FRAMES = 3  # observed frames a forecast's time differences reach back into (a jerk stencil's span)


def forecast_frames(window: int, observed: int, seam: bool = False) -> np.ndarray:
    """``[T]`` float32: 1 on the frames a forecast is scored on, ``observed..T-1``; with ``seam`` also
    the last :data:`SEAM_FRAMES` observed ones (true in prediction and truth alike), so every
    finite difference that reaches the first predicted frame counts: a jump at the seam is an error
    of the forecast. ``observed = 0``: every frame."""
    first = max(observed - (SEAM_FRAMES if seam else 0), 0) if observed else 0
    return (np.arange(window) >= first).astype(np.float32)


def mask_features(skeleton: Skeleton, x, joint_mask, frame_mask):
    """Zero standardized features ``[..., T, F]`` of masked joints ``[..., T, R]`` and frames ``[..., T]``."""
    xp = rot._xp(x, joint_mask, frame_mask)
    root = xp.ones(joint_mask.shape[:-1] + (3,), bool)
    keep = xp.concatenate([root, ~xp.repeat(joint_mask, 6, axis=-1)], -1) & ~frame_mask[..., None]
    return xp.where(keep, x, np.float32(0))


def make_example(skeleton: Skeleton, root_position, rotations, draws: dict, mean, std, *,
                 chunk_size: int, floor: bool = True, scale: float = 1.0, offsets=None,
                 observed: int = 0, lowest=None) -> dict:
    """Windows ``[..., T, 3]``, ``[..., T, J, 4]`` and their noise ``draws`` -> the training example.

    ``offsets [..., J, 3]``: each window's clip's rest offsets (m); the example then carries them
    as its body (mirrored with the window, scaled with the motion).
    ``observed > 0`` (forecasting): the input sees the first ``observed`` frames only; its later
    frames hold the last observed one (the zero-velocity forecast) and the floor comes from the
    observed frames, so nothing of the future reaches the input.

    Returns ``{"noisy", "clean": [..., N, C, F] float32, "mask": [..., N, C, 1]}`` (mask = 1 on
    masked-out frames), plus ``"offsets" [..., J, 3]`` float32 when ``offsets`` is given.
    ``lowest [...]``: the window's floor, precomputed (:func:`canonicalize`).
    """
    xp = rot._xp(root_position, rotations, offsets, *draws.values())
    frames = mirror_frames(skeleton, mean)
    m = draws.get("mirror")
    # numpy: mirror only when some window is (a branch on values); jax: whenever the draws hold the flag.
    if frames is not None and m is not None and (xp is not np or np.any(m)):
        flip = lambda a, b: xp.where(m.reshape(m.shape + (1,) * (a.ndim - m.ndim)), a, b)  # noqa: E731
        mroot, mrots = mirror(skeleton, root_position, rotations, frames)
        root_position, rotations = flip(mroot, root_position), flip(mrots, rotations)
        if offsets is not None:
            offsets = flip(mirror_offsets(skeleton, offsets, frames), offsets)
    root, rots, _, _ = canonicalize(skeleton, root_position, rotations, floor=floor, scale=scale,
                                    offsets=offsets, floor_frames=observed, lowest=lowest)
    clean = features.standardize(features.pack(skeleton, root, rots), mean, std)
    # A draw left out (the device leaves out what its config turns off) corrupts nothing: with none,
    # the input is the clean window.
    warp = draws.get("warp")
    if warp is not None and (xp is not np or np.any(warp)):  # as the mirror above
        nroot, nrots = time_warp(root, rots, warp)
    else:
        nroot, nrots = root, rots
    if "rot" in draws:
        nrots = rotation_noise(skeleton, nrots, draws["rot"])
    if "pos" in draws:
        nroot = nroot + draws["pos"]
    noisy = clean
    if nroot is not root or nrots is not rots:
        noisy = features.standardize(features.pack(skeleton, nroot, nrots), mean, std)
    frame_mask = draws.get("frame_mask")
    if frame_mask is not None or "joint_mask" in draws:
        rotating = len(features.rotating_joints(skeleton))
        joint_mask = draws.get("joint_mask", xp.zeros(rots.shape[:-2] + (rotating,), bool))
        frame_mask = xp.zeros(rots.shape[:-3] + rots.shape[-3:-2], bool) if frame_mask is None else frame_mask
        noisy = mask_features(skeleton, noisy, joint_mask, frame_mask)
    if observed:
        noisy = hold_last(noisy, observed)
    mask = xp.zeros(rots.shape[:-2], np.float32) if frame_mask is None else frame_mask
    mask = mask[..., None].astype(np.float32)
    out = {"noisy": chunk(noisy.astype(np.float32), chunk_size),
           "clean": chunk(clean.astype(np.float32), chunk_size), "mask": chunk(mask, chunk_size)}
    if offsets is not None:
        out["offsets"] = (offsets * scale).astype(np.float32)
    return out
