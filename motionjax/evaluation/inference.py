"""A trained model over motion of any length: a clip in, the model's motion out, on the clip's skeleton.

:func:`apply_motion` runs a window model (``predict``: standardized features ``[B, N, C, F]`` in and
out, e.g. a restored run's) over a clip in the model's conventions (metres, the run's frame rate,
joint 0 carrying the translation: :func:`model_view`): overlapping windows
(:func:`motionjax.core.windows.window_starts`), each canonicalized and standardized as the data pipeline
does in training, predicted in batches, returned to the clip's world frame and blended without
seams (:mod:`motionjax.core.windows`). :func:`apply_files` does the rest for motion files: the skeleton
check against the run's, the run's units and frame rate, and back to the file's own skeleton,
channels and frame rate (:func:`motionjax.data.corpus.unconform`,
:func:`motionjax.formats.bvh.write_bvh_like`).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from motionjax.core import features, windows
from motionjax.core.skeleton import Skeleton
from motionjax.data import corpus, prepare, transforms
from motionjax.data.info import INDEX, load_info
from motionjax.formats import Motion, MotionFormatError, load, write_bvh
from motionjax.formats.bvh import write_bvh_like


class SkeletonMismatchError(ValueError):
    """A clip's skeleton is not the run's (joint names, tree, kinds); the message says what differs."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What :func:`apply_motion` needs of a run besides ``predict``: its dataset's skeleton and feature
    statistics, and the window conventions of ``config.data``."""

    skeleton: Skeleton
    mean: np.ndarray         # [F]
    std: np.ndarray          # [F]
    fps: float
    window: int              # T
    chunk: int               # C
    floor: bool = True       # data.floor_align
    scale: float = 1.0       # data.canonical_height / rest height (1: off)
    clip_bones: bool = True  # data.bones == "clip": windows are floored on the clip's own bones
    units: str = "auto"      # data.units

    @classmethod
    def from_run(cls, config, info) -> ModelSpec:
        """From a run's ``config`` and its dataset ``info`` (:class:`~motionjax.data.info.DatasetInfo`)."""
        d = config.data
        scale = d.canonical_height / transforms.rest_height(info.skeleton) if d.canonical_height else 1.0
        return cls(info.skeleton, np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32),
                   float(info.fps), int(d.window), int(d.chunk), bool(d.floor_align), float(scale),
                   d.bones == "clip", d.units)


def model_view(motion: Motion, spec: ModelSpec) -> tuple[Motion, str]:
    """``(clip, units)``: ``motion`` as the run's data saw its clips (:func:`corpus.conform` with the
    run's units, its skeleton's up axis and joint order, resampled to its frame rate). Raises
    :class:`SkeletonMismatchError` when the tree is not the run's (joint names, parents, kinds)."""
    up_axis = "xyz"[spec.skeleton.up_axis]
    conformed, decided = corpus.conform(motion, units=spec.units, up_axis=up_axis)
    try:  # the same tree in another joint order (BVH lists joints depth first) is the same skeleton
        conformed = corpus.reorder(conformed, spec.skeleton.names)
    except ValueError as e:
        raise SkeletonMismatchError(f"skeleton differs from the run's: {e}") from None
    if corpus.topology(conformed.skeleton) != corpus.topology(spec.skeleton):
        raise SkeletonMismatchError(f"skeleton differs from the run's: "
                                    f"{corpus.topology_difference(conformed.skeleton, spec.skeleton)}")
    root, rotations = transforms.resample(conformed.root_position, conformed.rotations, conformed.fps,
                                          spec.fps)
    clip = dataclasses.replace(conformed, fps=spec.fps, root_position=root, rotations=rotations)
    return clip, decided["units"]


def window_count(num_frames: int, spec: ModelSpec, overlap: int) -> int:
    return len(windows.window_starts(num_frames, spec.window, overlap))


def apply_motion(predict, spec: ModelSpec, clip: Motion, *, overlap: int | None = None, batch_size: int = 32,
                 progress=None) -> Motion:
    """The model's version of ``clip`` (from :func:`model_view`), the same length and skeleton.

    ``predict``: ``[B, N, C, F] -> [B, N, C, F]`` standardized features. ``overlap``: frames that
    neighbouring windows share (default a quarter window); ``progress(n)`` is called with the number
    of windows done after each batch (a progress bar's ``update``).
    """
    t, sk = spec.window, clip.skeleton
    overlap = t // 4 if overlap is None else overlap
    length = clip.num_frames
    starts = windows.window_starts(length, t, overlap)
    idx = np.minimum(starts[:, None] + np.arange(t), length - 1)     # [K, T]: a short clip edge-padded
    bones = np.broadcast_to(sk.offsets, (len(starts), *sk.offsets.shape)) if spec.clip_bones else None
    root, rotations, yaw, origin = transforms.canonicalize(
        sk, clip.root_position[idx], clip.rotations[idx], floor=spec.floor, scale=spec.scale, offsets=bones)
    x = features.standardize(features.pack(sk, root, rotations), spec.mean, spec.std).astype(np.float32)
    x = transforms.chunk(x, spec.chunk)                              # [K, N, C, F]
    k = len(x)
    x = np.concatenate([x, np.repeat(x[-1:], -k % batch_size, 0)])   # whole batches: one compiled shape
    out = []
    for b in range(0, len(x), batch_size):
        out.append(np.asarray(predict(x[b:b + batch_size])))
        if progress is not None:
            progress(min(batch_size, k - b))
    y = transforms.unchunk(np.concatenate(out)[:k])                 # [K, T, F]
    root, rotations = (np.asarray(a, np.float64) for a in transforms.denormalize(sk, y, spec.mean, spec.std))
    root, rotations = transforms.uncanonicalize(root, rotations, yaw, origin, scale=spec.scale)
    return dataclasses.replace(clip, root_position=windows.blend(root, starts, length),
                               rotations=windows.blend_quaternions(rotations, starts, length))


def back_to_file(output: Motion, original: Motion, units: str) -> Motion:
    """A model output (on :func:`model_view`'s skeleton and frame rate) on ``original``'s skeleton, in
    its units and at its frame rate and frame count."""
    frames = np.arange(original.num_frames) * (output.fps / original.fps)
    root, rotations = transforms.interpolate_frames(output.root_position, output.rotations,
                                                    np.minimum(frames, output.num_frames - 1))
    at_rate = dataclasses.replace(output, fps=original.fps, root_position=root, rotations=rotations)
    return corpus.unconform(at_rate, original, units)


def write_like_source(path, motion: Motion, source, units: str = "auto") -> Path:
    """Write ``motion`` (the model's conventions: metres, the run's skeleton, e.g. a generated window) as
    BVH in the corpus's own units and hierarchy: those of motion file ``source`` (a clip of the corpus;
    its root placeholder, channels, rotation orders and frame time kept, :func:`back_to_file`'s path for
    a clip of another length). A source that is not BVH (DeepMimic) gives :func:`write_bvh`'s layout in
    metres. ``units``: the run's ``data.units``. Returns ``path``."""
    path, source = Path(path), Path(source)
    original = load(source)
    if source.suffix.lower() != ".bvh":
        write_bvh(path, motion)
        return path
    conformed, decided = corpus.conform(original, units=units)
    if abs(original.fps - motion.fps) > 1e-3 * original.fps:
        raise ValueError(f"{source}: {original.fps:g} fps, the motion {motion.fps:g} fps: "
                         "a window is written at its source's frame rate")
    # The source's frames cut or held to the motion's length: what a folded root placeholder takes
    # per frame (joint_Root is static in Bandai), nothing else of it is kept.
    idx = np.minimum(np.arange(motion.num_frames), original.num_frames - 1)
    held = dataclasses.replace(original, root_position=original.root_position[idx],
                               rotations=original.rotations[idx],
                               offsets=None if original.offsets is None else original.offsets[idx])
    write_bvh_like(path, source, corpus.unconform(motion, held, decided["units"]))
    return path


def source_files(data_cfg, info) -> dict:
    """``{clip name: motion file}`` of a prepared dataset's clips, from its ``data.source`` (the clips
    are named by file stem); clips whose file is gone are left out."""
    stems = {p.stem: p for p in prepare.resolve_sources(data_cfg.get("source"))}
    return {n: stems[n] for n in info.names if n in stems}


def _readable(paths, spec: ModelSpec, errors: list, log):
    """``(path, motion as read, model_view clip, units)`` of each file of ``paths`` the run can take; a
    file that does not read or has another skeleton is appended to ``errors`` (``"PATH: why"``) and
    ``log``-ged as ``error: PATH: why``."""
    for path in map(Path, paths):
        try:
            original = load(path)
            clip, units = model_view(original, spec)
        except (MotionFormatError, SkeletonMismatchError, OSError) as e:
            errors.append(str(e) if str(e).startswith(str(path)) else f"{path}: {e}")
            log(f"error: {errors[-1]}")
            continue
        yield path, original, clip, units


def apply_files(predict, spec: ModelSpec, paths, out_dir, *, overlap: int | None = None, batch_size: int = 32,
                log=print) -> tuple[list[Path], list[str]]:
    """:func:`apply_motion` for each motion file of ``paths``, written to ``out_dir/<stem>.bvh`` with the
    input's hierarchy, channel order and frame rate (:func:`~motionjax.formats.bvh.write_bvh_like`; a
    DeepMimic input gets :func:`~motionjax.formats.write_bvh`'s layout), one progress bar over all
    their windows. A file that does not read (:class:`~motionjax.formats.MotionFormatError`) or whose
    skeleton is not the run's (:class:`SkeletonMismatchError`) is reported by ``log`` naming it and
    skipped; the others are still processed. Returns ``(written paths, error lines)``."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    overlap = spec.window // 4 if overlap is None else overlap
    errors = []
    jobs = list(_readable(paths, spec, errors, log))  # everything read and checked first: the bar's total
    written = []
    total = sum(window_count(clip.num_frames, spec, overlap) for _, _, clip, _ in jobs)
    # disable=None: a bar on a terminal only (in a log file, carriage-return updates)
    with tqdm(total=total, unit="window", desc="apply", dynamic_ncols=True, disable=None) as bar:
        for path, original, clip, units in jobs:
            out = out_dir / f"{path.stem}.bvh"
            result = back_to_file(apply_motion(predict, spec, clip, overlap=overlap, batch_size=batch_size,
                                               progress=bar.update), original, units)
            if path.suffix.lower() == ".bvh":
                write_bvh_like(out, path, result)
            else:
                write_bvh(out, result)
            written.append(out)
    return written, errors


def prepare_corpus(paths, spec: ModelSpec, settings: prepare.Settings, cache_dir, split: str = "test",
                   log=print, dedup: bool = False):
    """Motion files as a prepared directory the run can be evaluated on: each clip in the run's units,
    frame rate and joint order (:func:`model_view`), prepared with the run's ``settings`` (window, fps)
    into one split ``split``. Every file is scored: no deduplication (that is for training data) unless
    ``dedup``; clips are named by file stem (by the path below the files' common folder where stems
    collide). Each file left out (it does not read, its skeleton is not the run's, a copy with
    ``dedup``) is named with its reason by ``log`` (``"skipped PATH: why"``), on every call. Prepared
    once: ``cache_dir/<name>-<digest>`` of the files (paths, sizes, mtimes) and the settings. Returns
    its :class:`~motionjax.data.info.DatasetInfo`."""
    paths = sorted(Path(p) for p in paths)
    if not paths:
        raise FileNotFoundError("no motion files to evaluate on")
    settings = dataclasses.replace(settings, dedup=bool(dedup))
    key = hashlib.sha256(json.dumps([[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
                                    + [settings.to_json(), split, spec.skeleton.names], default=str).encode())
    name = Path(os.path.commonpath([str(p.absolute().parent) for p in paths])).name if len(paths) > 1 \
        else paths[0].stem
    out = Path(cache_dir) / f"{name}-{key.hexdigest()[:12]}"
    if not (out / INDEX).exists():
        names, motions, skipped = clip_names(paths), [], []
        for path in paths:
            errors = []  # named below, from the index
            for _, _, clip, _ in _readable([path], spec, errors, lambda line: None):
                motions.append(dataclasses.replace(clip, name=names[path]))
            skipped += [{"path": str(path), "reason": e[len(str(path)):].lstrip(": ")} for e in errors]
        if not motions:
            why = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:3])
            raise ValueError(f"none of the {len(paths)} motion files can be evaluated by this run: {why}"
                             + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""))
        # The clips are in metres and the run's order already: preparation keeps them as they are.
        settings = dataclasses.replace(settings, units="m", up_axis="xyz"[spec.skeleton.up_axis],
                                       splits=((split, "rest"),))
        prepare.write_dataset(motions, out, settings=settings, progress=False, skipped=skipped)
    info = load_info(out)
    for s in info.skipped:
        log(f"skipped {s['path']}: {s['reason']}")
    return info


def clip_names(paths) -> dict:
    """``{path: clip name}``: each file's stem, or where stems collide its path below the files' common
    folder without the suffix (``a/clip``, ``b/clip``)."""
    paths = [Path(p) for p in paths]
    stems = collections.Counter(p.stem for p in paths)
    if max(stems.values(), default=0) < 2:
        return {p: p.stem for p in paths}
    root = Path(os.path.commonpath([str(p.absolute().parent) for p in paths]))
    return {p: p.stem if stems[p.stem] == 1 else p.absolute().relative_to(root).with_suffix("").as_posix()
            for p in paths}


def prepared_clip(info, index: int, begin: int = 0, end: int | None = None) -> Motion:
    """Frames ``[begin, end)`` of clip ``index`` of a prepared dataset as a :class:`Motion` on the clip's
    own bones (metres, ``info.fps``)."""
    from motionjax.data.pipeline import ClipSource

    record = ClipSource(info)[index]
    bones = np.asarray(record.get("offsets", info.skeleton.offsets), np.float64)
    return Motion(info.skeleton.replace(offsets=bones), float(info.fps),
                  np.asarray(record["root_position"][begin:end], np.float64),
                  np.asarray(record["rotations"][begin:end], np.float64), name=record["name"])


def noised(clip: Motion, noise: transforms.Noise, seed: int = 0) -> Motion:
    """``clip`` with ``noise``'s rotation and root-position noise on every frame (the evaluation's
    corruption, :func:`motionjax.data.pipeline.make_eval_batches`, over a whole clip)."""
    draws = noise.sample(np.random.default_rng(seed), clip.num_frames, clip.skeleton)
    rotations = transforms.rotation_noise(clip.skeleton, clip.rotations, draws["rot"].astype(np.float64))
    return dataclasses.replace(clip, root_position=clip.root_position + draws["pos"], rotations=rotations)


def compare(predict, spec: ModelSpec, clip: Motion, noise: transforms.Noise | None = None, seed: int = 0,
            **kwargs) -> dict[str, Motion]:
    """``{"input", "output", "truth"}``: ``clip`` (noised when ``noise`` is given), the model's motion from
    it (:func:`apply_motion`) and ``clip`` itself, for :func:`motionjax.evaluation.artifacts.render_video`."""
    source = clip if noise is None else noised(clip, noise, seed)
    return {"input": source, "output": apply_motion(predict, spec, source, **kwargs), "truth": clip}
