"""Reconstruction losses of the denoising task, in physical units after decoding the features.

The model predicts standardized feature windows ``[B, T, F]`` (layout of
:mod:`motionjax.core.features`). :func:`reconstruction_loss` destandardizes and decodes them, runs
forward kinematics, and sums five terms with weights from ``config.loss``:

* ``rotation``: ``1 − cos θ`` of the geodesic angle between predicted and true local rotations
  (smooth at θ = 0, bounded, one number per joint whatever the representation);
* ``position``: mean joint position error (m) after FK (global: the root trajectory's error too);
* ``pose``: the same root-relative, i.e. a differentiable MPJPE;
* ``foot``: predicted foot speed (m/s)² on the frames where the true foot is planted (skating);
* ``dynamics``: :func:`motionjax.core.dynamics.dynamics_loss` (joint velocities/accelerations through
  the kinematic Jacobian).

The same function runs unsharded and inside ``jax.shard_map`` over a ``(data, time)`` mesh:
time derivatives fetch neighbour frames with :func:`motionjax.core.halo.pad_with_halos`, and every mean
is a ``psum`` of local sums and counts over ``axis_names`` so masked means stay exact.
"""
from __future__ import annotations

import jax.numpy as jnp

from motionjax.core import dynamics, halo
from motionjax.core import rotations as rot
from motionjax.core.features import destandardize, rotating_joints, unpack
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.reduce import masked_mean
from motionjax.core.skeleton import Skeleton


def _norm(v):
    # eps keeps the gradient finite at a perfect prediction; it biases distances by < 1e-4 m.
    return jnp.sqrt(jnp.sum(v * v, axis=-1) + 1e-8)


def velocity(x, fps: float, time_axis_name: str | None = None):
    """Central differences ``[B, T, ...] -> [B, T, ...]`` (per second) and the ``[T]`` mask of
    frames whose stencil stays inside the sequence; neighbours cross time shards via halos."""
    padded = halo.pad_with_halos(x, 1, axis=1, axis_name=time_axis_name)
    vel = (padded[:, 2:] - padded[:, :-2]) * (fps / 2)
    return vel, halo.valid_frames(x.shape[1], 1, time_axis_name)


def foot_contacts(positions, skeleton: Skeleton, fps: float, max_speed: float,
                  time_axis_name: str | None = None):
    """``positions [B, T, J, 3]`` -> feet velocities ``[B, T, K, 3]`` (m/s), planted ``[B, T, K]``
    (speed below ``max_speed`` m/s on a valid frame). Velocity-based, so no floor height needed."""
    vel, valid = velocity(positions[..., skeleton.foot_joints, :], fps, time_axis_name)
    planted = (_norm(vel) < max_speed) & valid[None, :, None]
    return vel, planted


def reconstruction_loss(cfg, skeleton: Skeleton, fps: float, pred, target, mean, std,
                        time_axis_name: str | None = None, batch_axis_name: str | None = None,
                        offsets=None, valid=None, per_window: bool = False):
    """Weighted loss of predicted vs clean standardized windows.

    Args:
      cfg: ``config.loss`` (weights ``rotation``, ``position``, ``pose``, ``foot``, ``dynamics_weight``;
        ``contact_speed``; ``dynamics`` term weights and ``jacobian`` mode for B's loss).
      pred, target: ``[B, T, F]`` standardized features (model output and the clean window).
      mean, std: ``[F]`` feature statistics.
      time_axis_name, batch_axis_name: mesh axes when called inside ``shard_map``.
      offsets: optional ``[B, J, 3]`` rest offsets of each window's clip (m; several performers in
        one corpus), used by FK for both motions; ``None``: the skeleton's.
      valid: optional ``[B, T]`` (1 = a real frame, 0 = edge padding past the end of a short
        segment): every term averages over real frames only, a time difference only where its whole
        stencil is real. ``None``: every frame is real.
      per_window: also return each window's root-relative position error (m, the ``pose`` term of
        that window alone; what loss-aware sampling ranks windows by).

    Returns:
      ``(loss, metrics)``: scalar total and a dict of the unweighted terms; with ``per_window``,
      ``(loss, metrics, window_pose [B])`` (``[B_local]`` inside ``shard_map``, summed over time).
    """
    axes = tuple(a for a in (batch_axis_name, time_axis_name) if a is not None)
    valid = jnp.ones(pred.shape[:2], bool) if valid is None else valid.astype(bool)
    frame = valid[..., None]  # [B, T, 1]: per joint
    pred = destandardize(pred.astype(jnp.float32), mean, std)
    target = destandardize(target.astype(jnp.float32), mean, std)
    r = len(rotating_joints(skeleton))
    mats = [rot.sixd_to_matrix(x[..., 3:].reshape(*x.shape[:-1], r, 6)) for x in (pred, target)]
    # tr(R_pᵀ R_t) = 1 + 2 cos θ.
    cos = (jnp.sum(mats[0] * mats[1], axis=(-2, -1)) - 1.0) / 2.0
    terms = {"rotation": masked_mean(1.0 - cos, frame, axes)}

    (p_root, p_rot), (t_root, t_rot) = unpack(skeleton, pred), unpack(skeleton, target)
    if offsets is not None:
        offsets = jnp.asarray(offsets, jnp.float32)[:, None]  # [B, 1, J, 3]: the same bones every frame
    p_fk = forward_kinematics(skeleton, p_rot, p_root, offsets)
    t_fk = forward_kinematics(skeleton, t_rot, t_root, offsets)
    p_pos, t_pos = p_fk[0], t_fk[0]
    terms["position"] = masked_mean(_norm(p_pos - t_pos), frame, axes)
    # The pose alone (root-relative, what MPJPE scores): the global term also asks for the root
    # trajectory, metres of travel whose errors would otherwise dominate the gradient.
    rel = lambda pos, root: pos - root[..., None, :]
    pose_error = _norm(rel(p_pos, p_root) - rel(t_pos, t_root))  # [B, T, J]
    terms["pose"] = masked_mean(pose_error, frame, axes)

    p_feet, _ = velocity(p_pos[..., skeleton.foot_joints, :], fps, time_axis_name)
    _, planted = foot_contacts(t_pos, skeleton, fps, cfg.contact_speed, time_axis_name)
    planted &= halo.stencil_valid(valid, 1, time_axis_name)[..., None]
    terms["foot"] = masked_mean(jnp.sum(p_feet**2, -1), planted, axes)

    loss = sum(cfg[k] * terms[k] for k in ("rotation", "position", "pose", "foot"))
    if cfg.dynamics_weight > 0:
        dyn, dyn_metrics = dynamics.dynamics_loss(
            skeleton, p_root, p_rot, t_root, t_rot, fps, cfg.dynamics, jacobian=cfg.jacobian,
            time_axis_name=time_axis_name, batch_axis_name=batch_axis_name, pred_fk=p_fk, target_fk=t_fk,
            offsets=None if offsets is None else offsets[:, 0], valid=valid)
        terms["dynamics"] = dyn
        loss = loss + cfg.dynamics_weight * dyn
    if per_window:
        time_axes = (time_axis_name,) if time_axis_name is not None else ()
        return loss, terms, masked_mean(pose_error, frame, time_axes, axis=(1, 2))
    return loss, terms
