"""What a run writes besides numbers (process 0 only): learning curves, MPJPE per label, a held-out
clip's skeletons, and that clip as BVH. The metrics themselves: :mod:`motionjax.evaluation.metrics`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from motionjax.core.features import destandardize, unpack
from motionjax.core.skeleton import Skeleton


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


def plot_label_breakdown(by_label: dict, path, title: str = ""):
    """Bar chart of MPJPE per label value (one panel per label key: content, style), the model's
    bars next to its input's when the input has an error (a denoiser), from :func:`evaluate`'s
    ``by_label``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, v in by_label.items() if v]
    if not keys:
        return
    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 3.2 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        values = by_label[key]
        names = list(values)
        x = np.arange(len(names))
        model = [values[n]["mpjpe"] for n in names]
        source = [values[n].get("input_mpjpe", 0.0) for n in names]
        if max(source) > 0:
            ax.bar(x - 0.2, source, 0.4, label="input", color="C7")
            ax.bar(x + 0.2, model, 0.4, label="model", color="C0")
            ax.legend(fontsize=8)
        else:
            ax.bar(x, model, 0.6, color="C0")
        ax.set_xticks(x, names, rotation=40, ha="right", fontsize=8)
        ax.set(ylabel="MPJPE (cm)", title=f"{title} by {key}".strip())
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_skeletons(skeleton: Skeleton, clips: dict, path, num_poses: int = 8, title: str = ""):
    """Side view of ``num_poses`` evenly spaced frames for each ``clips[name] = [T, J, 3]`` (m),
    one row per clip (e.g. noisy / reconstructed / truth), poses spread along the row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    up, lateral = skeleton.up_axis, skeleton.lateral_axis
    forward = 3 - up - lateral
    bones = np.arange(1, skeleton.num_joints)
    parents = np.asarray(skeleton.parents)[bones]
    colors = ["C3" if j in skeleton.foot_joints else "C0" for j in bones] * num_poses
    fig, axes = plt.subplots(len(clips), 1, figsize=(2 + 1.2 * num_poses, 2.2 * len(clips)),
                             squeeze=False, sharex=True, sharey=True)
    for ax, (name, pos) in zip(axes[:, 0], clips.items(), strict=True):
        pos = np.asarray(pos)
        frames = np.linspace(0, len(pos) - 1, num_poses).round().astype(int)
        # Pose i is shifted 0.8 m forward of pose i-1 (from where the first one starts).
        shift = (0.8 * np.arange(num_poses) - pos[frames[0], 0, forward])[:, None]
        x, y = pos[frames][..., forward] + shift, pos[frames][..., up]    # [P, J]
        segments = np.stack([np.stack([x[:, parents], y[:, parents]], -1),
                             np.stack([x[:, bones], y[:, bones]], -1)], -2)  # [P, J-1, 2, 2]
        ax.add_collection(LineCollection(segments.reshape(-1, 2, 2), colors=colors, linewidths=1.5))
        ax.autoscale_view()
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

    root, rotations = unpack(skeleton, destandardize(np.asarray(features, np.float32), mean, std))
    write_bvh(Path(path), Motion(skeleton, fps, np.asarray(root, np.float64),
                                 np.asarray(rotations, np.float64), name=name))
