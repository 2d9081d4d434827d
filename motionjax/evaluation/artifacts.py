"""What a run writes besides numbers (process 0 only): learning curves, MPJPE per label, a held-out
clip's skeletons, and that clip as BVH. The metrics themselves: :mod:`motionjax.evaluation.metrics`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from motionjax.core.features import destandardize, unpack
from motionjax.core.skeleton import Skeleton
from motionjax.evaluation import forecast


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


def plot_forecast_horizons(rows: dict, path, title: str = ""):
    """MPJPE (cm) against the horizon (ms), one line per method, from a forecast evaluation's ``rows``
    (``{method: {"mpjpe_<h>ms": v, ...}}``, :func:`motionjax.evaluation.forecast.evaluate`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method, m in rows.items():
        points = forecast.horizon_errors(m)
        if points and method != "truth":
            ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.set(xlabel="horizon (ms)", ylabel="MPJPE (cm, root-relative)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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


def export_bvh(path, skeleton: Skeleton, fps: float, features, mean, std, name: str = "", source=None,
               units: str = "auto"):
    """Write standardized features ``[T, F]`` as a BVH clip: in the units and hierarchy of the corpus clip
    ``source`` (a motion file; :func:`motionjax.evaluation.inference.write_like_source`), or without one
    in metres on ``skeleton`` (:func:`write_bvh`)."""
    from motionjax.formats import Motion
    from motionjax.formats.bvh import write_bvh

    root, rotations = unpack(skeleton, destandardize(np.asarray(features, np.float32), mean, std))
    motion = Motion(skeleton, fps, np.asarray(root, np.float64), np.asarray(rotations, np.float64), name=name)
    if source is not None:
        from motionjax.evaluation.inference import write_like_source

        write_like_source(Path(path), motion, source, units)
    else:
        write_bvh(Path(path), motion)


# ---------------------------------------------------------------------------------------------
# Video: skeletons side by side, one frame per motion frame


def _camera(skeleton: Skeleton, azimuth: float, elevation: float) -> np.ndarray:
    """``[3, 2]``: world -> screen (x right, y up) of an orthographic camera turned ``azimuth``
    degrees about the up axis from the side view (forward to the right) and tilted ``elevation``
    degrees down."""
    up, lateral = skeleton.up_axis, skeleton.lateral_axis
    forward = 3 - up - lateral
    a, e = np.radians(azimuth), np.radians(elevation)
    m = np.zeros((3, 2))
    m[forward, 0], m[lateral, 0] = np.cos(a), np.sin(a)                  # screen x
    m[forward, 1], m[lateral, 1] = np.sin(a) * np.sin(e), -np.cos(a) * np.sin(e)  # depth, tilted up
    m[up, 1] = np.cos(e)
    return m


def skeleton_frames(skeleton: Skeleton, clips: dict, *, title: str = "", fps: float = 30.0,
                    azimuth: float = 35.0, elevation: float = 15.0, panel_inches: tuple = (3.0, 3.6),
                    dpi: int = 80):
    """Yield one RGB image ``[H, W, 3]`` uint8 per frame of ``clips[name] = [T, J, 3]`` joint positions
    (m, the same ``T``), one panel per clip side by side (e.g. input / output / truth).

    Every panel looks from the same orthographic camera angle, following its clip's root across the
    floor: a 0.5 m grid fixed in the world slides under the feet and shows the travel (and a panel that
    drifts from the others, by its grid). Left limbs are blue, right ones red (by the rest pose's
    lateral side).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    names = list(clips)
    pos = np.stack([np.asarray(clips[n], np.float64) for n in names])  # [K, T, J, 3]
    if pos.ndim != 4 or pos.shape[-1] != 3 or pos.shape[2] != skeleton.num_joints:
        raise ValueError(f"clips must be [T, {skeleton.num_joints}, 3] joint positions, got "
                         f"{[np.shape(clips[n]) for n in names]}")
    up, lateral = skeleton.up_axis, skeleton.lateral_axis
    ground = [a for a in range(3) if a != up]
    cam = _camera(skeleton, azimuth, elevation)
    floor = pos[..., up].min()
    center = pos[:, :, 0].copy()                                    # [K, T, 3]: each camera follows its root
    center[..., up] = floor
    screen = (pos - center[:, :, None]) @ cam                       # [K, T, J, 2]
    half = max(0.7, 1.15 * np.abs(screen[..., 0]).max())
    bottom, top = min(screen[..., 1].min(), 0.0) - 0.1, screen[..., 1].max() + 0.15
    # Equal scale on both screen axes in a panel of panel_inches: widen the tighter range.
    aspect = panel_inches[0] / panel_inches[1]
    if 2 * half < aspect * (top - bottom):
        half = aspect * (top - bottom) / 2
    else:
        top = bottom + 2 * half / aspect

    bones = np.arange(1, skeleton.num_joints)
    parents = np.asarray(skeleton.parents)[bones]
    side = np.sign(np.round(skeleton.rest_positions[:, lateral] - skeleton.rest_positions[0, lateral], 6))
    twin = skeleton.symmetry != np.arange(skeleton.num_joints)
    colors = ["C0" if twin[j] and side[j] > 0 else "C3" if twin[j] else "0.25" for j in bones]
    grid = np.arange(-3.0, 3.01, 0.5)                                # floor lines every 0.5 m

    fig = Figure(figsize=(panel_inches[0] * len(names), panel_inches[1]), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    limbs, floors = [], []
    for ax, name in zip(axes, names, strict=True):
        ax.set(xlim=(-half, half), ylim=(bottom, top), xticks=[], yticks=[], title=name)
        ax.set_aspect("equal")
        floors.append(ax.add_collection(LineCollection([], colors="0.85", linewidths=0.8)))
        limbs.append(ax.add_collection(LineCollection([], colors=colors, linewidths=2.0)))
    label = fig.suptitle(title)
    renderer = canvas.get_renderer()
    slot = fig.bbox.width / len(names)  # pixels a panel has: its title fits there (else it is clipped)
    for ax in axes:
        _fit(ax.title, slot - 4, renderer)
    _fit(label, fig.bbox.width - 4, renderer, reserve=f"  {pos.shape[1] / fps:5.2f} s")  # with the clock
    title = label.get_text()
    label.set_text(f"{title}  0.00 s".strip())
    fig.tight_layout()  # with the titles in place: the panels make room for them
    for t in range(pos.shape[1]):
        for k in range(len(names)):
            # Floor grid lines at fixed world coordinates, seen from this panel's camera position.
            c, lines = center[k, t], []
            for a, b in (ground, ground[::-1]):
                for g in np.floor(c[a] / 0.5) * 0.5 + grid:
                    ends = np.zeros((2, 3))
                    ends[:, a] = g
                    ends[:, b] = c[b] + grid[[0, -1]]
                    ends[:, up] = floor
                    lines.append((ends - c) @ cam)
            floors[k].set_segments(lines)
            s = screen[k, t]
            limbs[k].set_segments(np.stack([s[parents], s[bones]], 1))
        label.set_text(f"{title}  {t / fps:5.2f} s".strip())
        canvas.draw()
        yield np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _fit(text, width: float, renderer, reserve: str = "", smallest: float = 6.0) -> None:
    """Make matplotlib ``text`` at most ``width`` pixels wide: a smaller font, down to ``smallest``
    points, then its start cut (``…/walk.bvh``: the end names the file). ``reserve``: room kept for
    what is appended to it later (a clock)."""
    words = text.get_text()
    text.set_text(words + reserve)
    while text.get_window_extent(renderer).width > width and text.get_fontsize() > smallest:
        text.set_fontsize(text.get_fontsize() - 0.5)
    cut = 0
    while text.get_window_extent(renderer).width > width and cut < len(words) - 1:
        cut += 1
        text.set_text("…" + words[cut:] + reserve)
    text.set_text(text.get_text()[:len(text.get_text()) - len(reserve)])


def panel_names(paths) -> list[str]:
    """A panel title per motion file: its stem, or where stems collide its path below the files'
    common folder (``clip.bvh out/clip.bvh`` -> ``clip``, ``out/clip``); a file given twice gets
    ``(2)``."""
    from motionjax.evaluation.inference import clip_names

    names, out = clip_names(paths), []
    for p in paths:
        name = names[Path(p)]
        out.append(name if name not in out else f"{name} ({sum(n.split(' (')[0] == name for n in out) + 1})")
    return out


def render_files(paths, out, names=None) -> int:
    """Motion files side by side (one panel each, titled ``names``, default :func:`panel_names`) as a
    video ``out``: each in its own units (:func:`motionjax.data.corpus.conform`), resampled to the first
    file's frame rate and cut to the shortest. Returns the frame count. ``ValueError`` when the files'
    skeletons differ or ``names`` does not have one title per file."""
    from motionjax.data import corpus, transforms
    from motionjax.formats import load

    names = list(names) if names else panel_names(paths)
    if len(names) != len(paths):
        raise ValueError(f"{len(names)} panel names for {len(paths)} files: give one per file")
    motions = [corpus.conform(load(p))[0] for p in paths]
    skeletons = {m.skeleton.names for m in motions}
    if len(skeletons) > 1:
        raise ValueError(f"the files have {len(skeletons)} different skeletons; render them one by one")
    fps, clips = motions[0].fps, {}
    for name, m in zip(names, motions, strict=True):
        root, rotations = transforms.resample(m.root_position, m.rotations, m.fps, fps)
        clips[name] = type(m)(m.skeleton, fps, root, rotations, name=m.name).positions()
    frames = min(len(c) for c in clips.values())
    return render_video(motions[0].skeleton, {k: np.asarray(v[:frames]) for k, v in clips.items()}, out, fps)


def write_video(frames, path, fps: float = 30.0) -> int:
    """Encode RGB frames ``[H, W, 3]`` uint8 (any iterable) to ``path``: ``.mp4`` (H.264 by PyAV's
    bundled libx264, yuv420p: plays in browsers and notebooks) or ``.gif`` (Pillow). Returns the
    number of frames written."""
    from fractions import Fraction

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        if not images:
            raise ValueError(f"{path}: no frames to write")
        images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
        return len(images)
    if suffix != ".mp4":
        raise ValueError(f"{path}: unknown video type {suffix!r}; expected .mp4 or .gif")
    import av

    count = 0
    with av.open(str(path), "w") as container:
        stream = None
        for frame in frames:
            h, w = frame.shape[0] // 2 * 2, frame.shape[1] // 2 * 2   # yuv420p needs even sizes
            if stream is None:
                stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
                stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
                stream.options = {"crf": "23"}
            picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame[:h, :w]), format="rgb24")
            container.mux(stream.encode(picture))
            count += 1
        if stream is None:
            raise ValueError(f"{path}: no frames to write")
        container.mux(stream.encode(None))  # flush the encoder's delayed frames
    return count


def render_video(skeleton: Skeleton, clips: dict, path, fps: float, title: str = "", **view) -> int:
    """Skeletons side by side (``clips[name] = [T, J, 3]``, m; e.g. input / output / truth) as an
    MP4 or GIF at ``fps``: :func:`skeleton_frames` encoded by :func:`write_video`. Returns the frame
    count."""
    return write_video(skeleton_frames(skeleton, clips, title=title, fps=fps, **view), path, fps)
