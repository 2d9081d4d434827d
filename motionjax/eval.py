"""Held-out evaluation: motion metrics, the per-frame PCA reference, plots and BVH export.

Metrics compare joint positions after FK, ``[B, T, J, 3]`` in metres:

* MPJPE (cm): mean joint position error;
* PA-MPJPE (cm): MPJPE after a per-frame similarity Procrustes alignment (rotation, scale,
  translation) of the prediction onto the truth — pose error without global placement;
* acceleration error (m/s²): mean norm of the difference of second finite differences;
* foot skate (cm/s): mean speed of the predicted feet on frames where the true foot is planted
  (the contact rule of :func:`motionjax.losses.foot_contacts`).
"""
from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from motionjax import losses
from motionjax.features import decode, destandardize
from motionjax.kinematics import forward_kinematics
from motionjax.skeleton import Skeleton

METRICS = ("mpjpe", "pa_mpjpe", "accel", "foot_skate")


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
def motion_metrics(skeleton: Skeleton, fps: float, pred, true, contact_speed: float):
    """``pred, true [B, T, J, 3]`` (m) -> dict of the :data:`METRICS` (scalars)."""
    err = lambda a, b: jnp.linalg.norm(a - b, axis=-1).mean()
    accel = lambda p: (p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]) * fps**2
    p_feet, _ = losses.velocity(pred[..., losses.foot_joints(skeleton), :], fps)
    _, planted = losses.foot_contacts(true, skeleton, fps, contact_speed)
    horizontal = jnp.delete(p_feet, skeleton.up_axis, axis=-1)
    return {
        "mpjpe": 100 * err(pred, true),
        "pa_mpjpe": 100 * err(procrustes_align(pred, true), true),
        "accel": err(accel(pred), accel(true)),
        "foot_skate": 100 * losses.masked_mean(jnp.linalg.norm(horizontal, axis=-1), planted),
    }


def feature_positions(skeleton: Skeleton, features, mean, std):
    """Standardized features ``[..., T, F]`` -> joint positions ``[..., T, J, 3]`` (m)."""
    root, rotations = decode(skeleton, destandardize(jnp.asarray(features, jnp.float32), mean, std))
    return forward_kinematics(skeleton, rotations, root)[0]


def evaluate(predict, batches, skeleton: Skeleton, fps: float, mean, std, contact_speed: float):
    """Metrics of ``predict`` (``[B, N, C, F] -> [B, N, C, F]``) over eval ``batches`` (dicts with
    ``noisy`` and ``clean``), averaged over windows; ``input_mpjpe`` is the noisy input's own error.
    """
    totals, count = {}, 0
    for batch in batches:
        b = batch["clean"].shape[0]
        flat = lambda x, b=b: np.asarray(x).reshape(b, -1, x.shape[-1])  # [B, N, C, F] -> [B, T, F]
        true = feature_positions(skeleton, flat(batch["clean"]), mean, std)
        pred = feature_positions(skeleton, flat(predict(batch["noisy"])), mean, std)
        noisy = feature_positions(skeleton, flat(batch["noisy"]), mean, std)
        m = motion_metrics(skeleton, fps, pred, true, contact_speed)
        m["input_mpjpe"] = motion_metrics(skeleton, fps, noisy, true, contact_speed)["mpjpe"]
        for k, v in m.items():
            totals[k] = totals.get(k, 0.0) + float(v) * b
        count += b
    if not count:
        raise ValueError("evaluate: no eval batches (is the held-out split empty?)")
    return {k: v / count for k, v in totals.items()}


class PCA:
    """Per-frame linear reference: project standardized feature frames on the top-``k`` principal
    directions of the training frames and back (the best linear ``k``-dim per-frame code)."""

    def __init__(self, frames, k: int):
        frames = np.asarray(frames, np.float64).reshape(-1, np.shape(frames)[-1])
        if not 0 < k <= frames.shape[-1]:
            raise ValueError(f"PCA latent size {k} must be in [1, {frames.shape[-1]}]")
        self.mean = frames.mean(0)
        _, self.singular_values, vt = np.linalg.svd(frames - self.mean, full_matrices=False)
        self.basis = vt[:k].T  # [F, k]

    def __call__(self, x):
        """Reconstruct ``x [..., F]`` through the ``k``-dim code."""
        x = np.asarray(x, np.float64)
        return ((x - self.mean) @ self.basis @ self.basis.T + self.mean).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Artefacts written into the run directory (process 0 only).


def plot_learning_curves(history: dict, path):
    """``history``: name -> list of ``(step, value)``; train losses left, eval MPJPE right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    for name, points in sorted(history.items()):
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        ax = ax_eval if name.startswith("eval") else ax_loss
        ax.plot(steps, values, label=name, marker="o" if ax is ax_eval else None, markersize=3)
    ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="training")
    ax_eval.set(xlabel="step", ylabel="MPJPE (cm)", title="held-out")
    for ax in (ax_loss, ax_eval):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_skeletons(skeleton: Skeleton, clips: dict, path, num_poses: int = 8, title: str = ""):
    """Side view of ``num_poses`` evenly spaced frames for each ``clips[name] = [T, J, 3]`` (m),
    one row per clip (e.g. noisy / reconstructed / truth), poses spread along the row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    up, lateral = skeleton.up_axis, skeleton.lateral_axis
    forward = 3 - up - lateral
    fig, axes = plt.subplots(len(clips), 1, figsize=(2 + 1.2 * num_poses, 2.2 * len(clips)),
                             squeeze=False, sharex=True, sharey=True)
    for ax, (name, pos) in zip(axes[:, 0], clips.items(), strict=True):
        pos = np.asarray(pos)
        frames = np.linspace(0, len(pos) - 1, num_poses).round().astype(int)
        for i, t in enumerate(frames):
            p = pos[t] - pos[frames[0], 0] * np.eye(3)[forward] + np.eye(3)[forward] * 0.8 * i
            for j, parent in enumerate(skeleton.parents[1:], 1):
                ax.plot(p[[parent, j], forward], p[[parent, j], up], "-", lw=1.5,
                        color="C3" if j in losses.foot_joints(skeleton) else "C0")
        ax.set_ylabel(name)
        ax.set_aspect("equal")
        ax.grid(alpha=0.3)
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def export_bvh(path, skeleton: Skeleton, fps: float, features, mean, std, name: str = ""):
    """Write standardized features ``[T, F]`` as a BVH clip (via :func:`write_bvh`)."""
    from motionjax.formats import Motion
    from motionjax.formats.bvh import write_bvh

    root, rotations = decode(skeleton, destandardize(jnp.asarray(features, jnp.float32), mean, std))
    write_bvh(Path(path), Motion(skeleton, fps, np.asarray(root, np.float64),
                                 np.asarray(rotations, np.float64), name=name))
