"""Held-out evaluation: motion metrics and the per-frame PCA reference (plots and BVH export of a
run: :mod:`motionjax.evaluation.artifacts`).

Metrics compare joint positions after FK, ``[B, T, J, 3]`` in metres:

* MPJPE (cm): the standard root-relative mean per-joint position error (Human3.6M protocol #1):
  the root joint's position is subtracted from every joint of the prediction and of the truth,
  then the Euclidean joint distances are averaged — pose error, independent of the trajectory;
* global MPJPE (cm): the same without root alignment, in the canonical window frame, so it adds
  the root trajectory's error (``root_error``, cm: the root joint's own distance);
* PA-MPJPE (cm): MPJPE after a per-frame similarity Procrustes alignment (rotation, scale,
  translation) of the prediction onto the truth — pose error without global placement;
* acceleration error (m/s²): mean norm of the difference of second finite differences;
* jitter (m/s³): mean norm of the prediction's third finite difference (the truth's own jitter is
  the floor a faithful reconstruction reaches);
* foot skate (cm/s): mean horizontal speed of the predicted feet on frames where the true foot is
  planted (the contact rule of :func:`motionjax.losses.foot_contacts`);
* bone-length error (cm): mean ``| |p_j − p_parent| − |t_j − t_parent| |`` over bones. A motion
  decoded from rotations through FK on the clip's true bones has 0 by construction; the metric
  bites for position outputs or a model that predicts bone lengths;
* floor penetration (cm) and the generalized forces ``Jᵀ m (a − g)`` (N/kg) of a motion and their
  error against the truth's (:func:`physics_sums`, the plausibility of a forecast).

Positions come from FK on the clip's rest offsets when the batch carries them (``offsets [B, J, 3]``,
several performers in one corpus), else on the skeleton's. With the clips' labels
(``DatasetInfo.labels``: per-clip dicts such as ``{"content": "walk", "style": "happy"}``) and the
batches' ``clip [B]`` indices, :func:`evaluate` also breaks MPJPE down per label value.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from motionjax import losses
from motionjax.core import dynamics, halo
from motionjax.core.features import destandardize, unpack
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import Skeleton

METRICS = ("mpjpe", "mpjpe_global", "root_error", "pa_mpjpe", "accel", "jitter", "foot_skate", "bone_error")
INPUT_METRICS = METRICS  # also measured on the (noisy) input itself, ``input_`` prefix
LABEL_METRICS = ("mpjpe", "pa_mpjpe", "accel")  # broken down per label value (``by_label``)
# Kept per window (``per_window``) for the bootstrap intervals over clips (motionjax.evaluation.intervals).
INTERVAL_METRICS = ("mpjpe", "mpjpe_global", "pa_mpjpe")


def procrustes_align(pred, true):
    """Similarity-align each frame of ``pred [..., J, 3]`` onto ``true`` (Umeyama 1991)."""
    mu_p, mu_t = pred.mean(-2, keepdims=True), true.mean(-2, keepdims=True)
    x, y = pred - mu_p, true - mu_t
    u, s, vt = jnp.linalg.svd(jnp.swapaxes(x, -1, -2) @ y)  # H = Xᵀ Y = U S Vᵀ
    # Reflection guard: flip the last singular direction when det(V Uᵀ) < 0.
    d = jnp.sign(jnp.linalg.det(jnp.swapaxes(vt, -1, -2) @ jnp.swapaxes(u, -1, -2)))
    s = s.at[..., -1].multiply(d)
    u = u.at[..., :, -1].multiply(d[..., None])
    rot = u @ vt  # row-vector form: x @ (U Vᵀ) rotates x onto y
    scale = s.sum(-1) / jnp.sum(x * x, axis=(-2, -1))
    return scale[..., None, None] * (x @ rot) + mu_t


@functools.partial(jax.jit, static_argnames=("skeleton", "fps", "contact_speed"))
def metric_sums(skeleton: Skeleton, fps: float, pred, true, valid, contact_speed: float):
    """``pred, true [B, T, J, 3]`` (m), ``valid [B, T]`` (0 = padding frame) -> ``{metric: (sums [B],
    counts [B])}`` per window for the :data:`METRICS`, so windows and batches combine exactly (and
    group by label); a time-difference metric only counts frames whose whole stencil is valid."""
    valid = valid.astype(bool)
    inner = jnp.pad(valid[:, 2:] & valid[:, 1:-1] & valid[:, :-2], ((0, 0), (1, 1)))  # [B, T]
    # Third differences at t-1/2 use frames t-2..t+1: [B, T-3] (the stencils wholly valid).
    inner3 = valid[:, 3:] & valid[:, 2:-1] & valid[:, 1:-2] & valid[:, :-3]
    axes = lambda x: tuple(range(1, x.ndim))
    total = lambda x, where: (jnp.sum(jnp.where(where, x, 0.0), axis=axes(x)),
                              jnp.sum(jnp.broadcast_to(where, x.shape), axis=axes(x)))
    dist = lambda a, b: jnp.linalg.norm(a - b, axis=-1)
    accel = lambda p: (p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]) * fps**2
    jerk = (pred[:, 3:] - 3 * pred[:, 2:-1] + 3 * pred[:, 1:-2] - pred[:, :-3]) * fps**3
    p_feet, _ = losses.velocity(pred[..., skeleton.foot_joints, :], fps)
    _, planted = losses.foot_contacts(true, skeleton, fps, contact_speed)
    skate = jnp.linalg.norm(jnp.delete(p_feet, skeleton.up_axis, axis=-1), axis=-1)  # horizontal speed
    parents = np.asarray(skeleton.parents)[1:]
    bone = lambda p: jnp.linalg.norm(p[..., 1:, :] - p[..., parents, :], axis=-1)  # [B, T, J-1]
    cm = lambda sc: (100 * sc[0], sc[1])
    rel = lambda p: p - p[..., :1, :]  # root-relative (joint 0 is the root)
    return {
        "mpjpe": cm(total(dist(rel(pred), rel(true)), valid[..., None])),
        "mpjpe_global": cm(total(dist(pred, true), valid[..., None])),
        "root_error": cm(total(dist(pred[..., 0, :], true[..., 0, :]), valid)),
        "pa_mpjpe": cm(total(dist(procrustes_align(pred, true), true), valid[..., None])),
        "accel": total(dist(accel(pred), accel(true)), inner[:, 1:-1, None]),
        "jitter": total(jnp.linalg.norm(jerk, axis=-1), inner3[..., None]),
        "foot_skate": cm(total(skate, planted & inner[..., None])),
        "bone_error": cm(total(jnp.abs(bone(pred) - bone(true)), valid[..., None])),
    }


PHYSICS_METRICS = ("penetration", "force", "force_error")


@functools.partial(jax.jit, static_argnames=("skeleton", "fps"))
def physics_sums(skeleton: Skeleton, fps: float, pred_root, pred_rot, true_root, true_rot, valid, scored,
                 offsets=None):
    """Plausibility of a motion against the truth, per window ``{metric: (sums [B], counts [B])}``
    (root ``[B, T, 3]``, local rotations ``[B, T, J, 4]``; ``valid [B, T]`` the real frames, ``scored``
    the frames counted; ``offsets [B, J, 3]`` or None):

    * ``penetration`` (cm): how far the lowest predicted joint is below the floor, 0 above it, per
      scored frame; the floor is the truth's lowest joint over the window's real frames;
    * ``force`` (N/kg): mean norm of the generalized forces ``Jᵀ m (a − g)`` per joint (the dynamics
      loss's own :func:`motionjax.core.dynamics.generalized_forces`), on scored frames whose stencil is
      real; ``force_error``: the norm of their difference from the truth's.
    """
    valid, scored = valid.astype(bool), scored.astype(bool) & valid.astype(bool)
    bones = None if offsets is None else jnp.asarray(offsets, jnp.float32)[:, None]
    up = skeleton.up_axis
    p_pos = forward_kinematics(skeleton, pred_rot, pred_root, bones)[0][..., up]  # [B, T, J]
    t_pos = forward_kinematics(skeleton, true_rot, true_root, bones)[0][..., up]
    floor = jnp.min(jnp.where(valid[..., None], t_pos, jnp.inf), axis=(1, 2))  # [B]
    below = jnp.maximum(floor[:, None] - p_pos.min(-1), 0.0)  # [B, T]
    forces = [dynamics.generalized_forces(skeleton, r, q, fps, offsets)
              for r, q in ((pred_root, pred_rot), (true_root, true_rot))]  # [B, T, J + 1, 3]
    inner = halo.stencil_valid(valid, 1) & scored
    count = lambda mask, n=1: jnp.sum(mask, axis=1).astype(jnp.float32) * n
    per_joint = lambda x: jnp.sum(jnp.where(inner[..., None], jnp.linalg.norm(x, axis=-1), 0.0), axis=(1, 2))
    joints = forces[0].shape[-2]
    return {"penetration": (100 * jnp.sum(jnp.where(scored, below, 0.0), axis=1), count(scored)),
            "force": (per_joint(forces[0]), count(inner, joints)),
            "force_error": (per_joint(forces[0] - forces[1]), count(inner, joints))}


@jax.jit
def mpjpe_per_frame(pred, true):
    """Root-relative MPJPE (cm) of each frame, ``pred, true [B, T, J, 3]`` (m) -> ``[B, T]``."""
    rel = lambda p: p - p[..., :1, :]
    return 100 * jnp.linalg.norm(rel(pred) - rel(true), axis=-1).mean(-1)


def motion_metrics(skeleton: Skeleton, fps: float, pred, true, valid=None, contact_speed: float = 0.3):
    """The :data:`METRICS` of one batch ``pred, true [B, T, J, 3]`` (m) as floats."""
    valid = jnp.ones(pred.shape[:2]) if valid is None else valid
    sums = metric_sums(skeleton, float(fps), pred, true, valid, contact_speed)
    return {k: float(jnp.sum(s)) / max(float(jnp.sum(c)), 1.0) for k, (s, c) in sums.items()}


@functools.partial(jax.jit, static_argnames=("skeleton",))  # op by op, FK dominated evaluation time
def feature_positions(skeleton: Skeleton, features, mean, std, offsets=None):
    """Standardized features ``[..., T, F]`` -> joint positions ``[..., T, J, 3]`` (m), by FK on
    ``offsets`` (``[..., J, 3]``, one set per window: a clip's rest offsets) or the skeleton's."""
    root, rotations = unpack(skeleton, destandardize(jnp.asarray(features, jnp.float32), mean, std))
    if offsets is not None:
        offsets = jnp.asarray(offsets, jnp.float32)[..., None, :, :]  # broadcast over time
    return forward_kinematics(skeleton, rotations, root, offsets)[0]


def evaluate(predict, batches, skeleton: Skeleton, fps: float, mean, std, contact_speed: float,
             labels=None, per_window: bool = False):
    """Metrics of ``predict`` (``[B, N, C, F] -> [B, N, C, F]``) over eval ``batches`` (dicts with
    ``noisy``, ``clean`` and ``valid`` ``[B, N, C, 1]``; optional ``offsets [B, J, 3]`` and ``clip
    [B]``), over all valid frames. ``input_<metric>`` are the (noisy) input's own errors.

    ``labels``: per-clip dicts (``DatasetInfo.labels``); when given (and the batches carry ``clip``),
    the result also holds ``by_label = {key: {value: {metric: v, "frames": n}}}`` for the
    :data:`LABEL_METRICS` of the model and its input.

    ``per_window`` (and the batches carry ``clip``): the result also holds ``windows = {"clip": [N],
    METRIC: (sums [N], counts [N]), "input_" METRIC: ...}`` for the :data:`INTERVAL_METRICS`, one entry
    per window (fill windows: clip -1, count 0), from which the intervals over clips are drawn.
    """
    sums, groups = {}, {}
    windows = {"clip": []}
    for batch in batches:
        b = batch["clean"].shape[0]
        flat = lambda x, b=b: np.asarray(x).reshape(b, -1, x.shape[-1])  # [B, N, C, F] -> [B, T, F]
        offsets = batch.get("offsets")
        true = feature_positions(skeleton, flat(batch["clean"]), mean, std, offsets)
        valid = flat(batch["valid"])[..., 0]
        rows = []
        if labels is not None and "clip" in batch:
            rows = [labels[int(c)] for c in np.asarray(batch["clip"]).reshape(-1)]
        keep = per_window and "clip" in batch
        if keep:
            windows["clip"].append(np.asarray(batch["clip"]).reshape(-1))
        for name, x in (("", predict(batch["noisy"])), ("input_", batch["noisy"])):
            pos = feature_positions(skeleton, flat(x), mean, std, offsets)
            m = {k: (np.asarray(s, np.float64), np.asarray(c, np.float64))
                 for k, (s, c) in metric_sums(skeleton, float(fps), pos, true, valid, contact_speed).items()}
            for k in INTERVAL_METRICS if keep else ():
                windows.setdefault(name + k, ([], []))
                windows[name + k][0].append(m[k][0])
                windows[name + k][1].append(m[k][1])
            for k in METRICS if not name else INPUT_METRICS:
                s, c = sums.get(name + k, (0.0, 0.0))
                sums[name + k] = (s + m[k][0].sum(), c + m[k][1].sum())
            for i, row in enumerate(rows):
                for key, value in row.items():
                    group = groups.setdefault(key, {}).setdefault(str(value), {})
                    for k in LABEL_METRICS:
                        s, c = group.get(name + k, (0.0, 0.0))
                        group[name + k] = (s + m[k][0][i], c + m[k][1][i])
                    if not name:
                        group["frames"] = group.get("frames", 0.0) + float(valid[i].sum())
    if not sums or sums["mpjpe"][1] == 0:
        raise ValueError("evaluate: no valid frames in the eval batches (is the held-out split empty?)")
    out = {k: s / max(c, 1.0) for k, (s, c) in sums.items()}
    if windows["clip"]:
        join = lambda v: np.concatenate(v) if isinstance(v[0], np.ndarray) else tuple(map(np.concatenate, v))
        out["windows"] = {k: join(v) for k, v in windows.items()}
    if labels is not None:
        mean_of = lambda v: v if isinstance(v, float) else v[0] / max(v[1], 1.0)
        out["by_label"] = {key: {value: {k: mean_of(v) for k, v in sorted(g.items())}
                                 for value, g in sorted(values.items()) if g.get("frames", 0) > 0}
                           for key, values in sorted(groups.items())}
    return out


class PCA:
    """Per-frame linear reference: project standardized feature frames on the top-``k`` principal
    directions of the training frames and back (the best linear ``k``-dim per-frame code)."""

    def __init__(self, frames, k: int):
        """``frames [N, F]`` standardized training frames; ``k`` the latent size."""
        frames = np.asarray(frames, np.float64)
        if not 0 < k <= frames.shape[-1]:
            raise ValueError(f"PCA latent size {k} must be in [1, {frames.shape[-1]}]")
        self.mean = frames.mean(0)
        _, self.singular_values, vt = np.linalg.svd(frames - self.mean, full_matrices=False)
        self.basis = vt[:k].T  # [F, k]

    def __call__(self, x):
        """Reconstruct ``x [..., F]`` through the ``k``-dim code."""
        x = np.asarray(x, np.float64)
        return ((x - self.mean) @ self.basis @ self.basis.T + self.mean).astype(np.float32)
