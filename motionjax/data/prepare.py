"""Motion files -> ArrayRecord shards + ``index.json`` (clips, splits, skeleton, feature stats).

Layout of a prepared directory::

    clips-00000-of-0000N.array_record   one record per clip (:mod:`motionjax.data.records`),
                                        resampled to the dataset fps, with per-frame dynamics scores
    index.json                          written last: its presence means the directory is complete

Splits (fixed; :data:`HELDOUT_CLIPS`, :data:`TRAIN_FRACTION`, repeated in index.json):
  ``train``         the first 80% of the frames of every clip not held out,
  ``heldout_tail``  the last 20% of those clips (same motions, unseen frames),
  ``heldout_clips`` the held-out clips entirely (each has a sibling motion in training).
Segments are ``(clip index, begin frame, end frame)``. Windows never cross a segment end (no
wrapping: a loop would leak tail frames into training). A segment shorter than a window (at 30
fps and window 32: the training parts of walk and run, most tails) is edge-padded, the padding
marked ``valid = 0``; training skips segments under half a window
(:data:`motionjax.data.transforms.SHORT_SEGMENT`).

Feature statistics are a streaming Welford/Chan pass over the canonicalized training windows
(stride window/4), so no pass ever holds the corpus in memory.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from motionjax import features
from motionjax.data import records, transforms
from motionjax.formats import Motion, MotionFormatError, deepmimic_clip_paths, load
from motionjax.skeleton import Skeleton

HELDOUT_CLIPS = ("humanoid3d_dance_b", "humanoid3d_getup_faceup", "humanoid3d_spinkick")
TRAIN_FRACTION = 0.8
SPLITS = ("train", "heldout_tail", "heldout_clips")
INDEX = "index.json"
FORMAT_VERSION = 2
MIN_STD = 1e-3  # features constant in the data (e.g. hinge 6D components) standardize with std 1


# --------------------------------------------------------------------------------------------
# Metadata


def skeleton_to_dict(skeleton: Skeleton) -> dict:
    return {"names": list(skeleton.names), "parents": list(skeleton.parents), "kinds": list(skeleton.kinds),
            "offsets": skeleton.offsets.tolist(), "axes": skeleton.axes.tolist(),
            "masses": skeleton.masses.tolist(), "up_axis": skeleton.up_axis}


def skeleton_from_dict(d: dict) -> Skeleton:
    return Skeleton(d["names"], d["parents"], np.array(d["offsets"]), d["kinds"], np.array(d["axes"]),
                    np.array(d["masses"]), d["up_axis"])


@dataclasses.dataclass(frozen=True, eq=False)
class DatasetInfo:
    """What the trainer needs to know about a prepared (or synthetic) dataset.

    Attributes:
      data_dir: the prepared directory ("" for the synthetic corpus).
      skeleton: the one skeleton of every clip.
      fps: frame rate of every record.
      mean, std: ``[F]`` float32 feature stats (std floored at :data:`MIN_STD` -> 1).
      names, frames: per clip.
      splits: split name -> list of ``(clip, begin, end)`` segments.
      window: window length the stats were computed with (must equal ``config.data.window``).
      shards: ArrayRecord file names, relative to ``data_dir``.
      train_windows: per ``splits["train"]`` segment, ``(number of windows, sum of their mean
        dynamics scores)`` for ``window``: the normalizers of dynamics-weighted sampling.
      skipped: ``[{"path", "reason"}]`` files that did not convert.
      synthetic: ``{"num_clips", "frames", "seed"}`` for the generated corpus, else None.
    """

    data_dir: str
    skeleton: Skeleton
    fps: float
    mean: np.ndarray
    std: np.ndarray
    names: tuple[str, ...]
    frames: tuple[int, ...]
    splits: dict
    window: int
    train_windows: tuple = ()
    shards: tuple[str, ...] = ()
    skipped: tuple = ()
    synthetic: dict | None = None

    @property
    def feature_dim(self) -> int:
        return features.feature_dim(self.skeleton)

    def split_frames(self, split: str) -> int:
        return sum(e - b for _, b, e in self.splits[split])

    def shard_paths(self) -> list[str]:
        return [os.path.join(self.data_dir, s) for s in self.shards]


def load_info(data_dir) -> DatasetInfo:
    """Read ``index.json`` of a prepared directory."""
    path = Path(data_dir) / INDEX
    if not path.exists():
        raise FileNotFoundError(f"{path}: no prepared dataset here; run "
                                f"scripts/prepare_data.py --out {data_dir}")
    doc = json.loads(path.read_text())
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {doc.get('version')}, expected {FORMAT_VERSION}; "
                         "re-run scripts/prepare_data.py")
    return DatasetInfo(
        data_dir=str(data_dir), skeleton=skeleton_from_dict(doc["skeleton"]), fps=doc["fps"],
        mean=np.array(doc["stats"]["mean"], np.float32), std=np.array(doc["stats"]["std"], np.float32),
        names=tuple(c["name"] for c in doc["clips"]), frames=tuple(c["frames"] for c in doc["clips"]),
        splits={k: [tuple(s) for s in v] for k, v in doc["splits"].items()}, window=doc["stats"]["window"],
        train_windows=tuple(tuple(w) for w in doc["train_windows"]),
        shards=tuple(doc["shards"]), skipped=tuple(doc["skipped"]))


def split_segments(names, frames, heldout=HELDOUT_CLIPS, train_fraction=TRAIN_FRACTION) -> dict:
    """The fixed split rule: held-out clips whole; every other clip cut at ``train_fraction``."""
    out = {s: [] for s in SPLITS}
    for i, (name, n) in enumerate(zip(names, frames, strict=True)):
        if name in heldout:
            out["heldout_clips"].append((i, 0, n))
        else:
            cut = int(round(n * train_fraction))
            out["train"].append((i, 0, cut))
            if cut < n:
                out["heldout_tail"].append((i, cut, n))
    return out


# --------------------------------------------------------------------------------------------
# Streaming statistics


class Moments:
    """Streaming per-feature mean/variance (Welford, merged chunk-wise after Chan et al. 1979)."""

    def __init__(self, dim: int):
        self.count, self.mean, self.m2 = 0, np.zeros(dim), np.zeros(dim)

    def update(self, x: np.ndarray) -> None:
        """Add rows ``x [n, F]``."""
        x = np.asarray(x, np.float64).reshape(-1, self.mean.size)
        n = x.shape[0]
        if n == 0:
            return
        mean, m2 = x.mean(0), ((x - x.mean(0)) ** 2).sum(0)
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.count = total

    def std(self) -> np.ndarray:
        std = np.sqrt(self.m2 / max(self.count - 1, 1))
        return np.where(std < MIN_STD, 1.0, std)


def window_features(skeleton: Skeleton, root, rotations, window: int, stride: int):
    """Canonicalized (unstandardized) features of the windows of one segment, ``[n·window, F]``."""
    starts = np.arange(0, root.shape[0] - window + 1, stride)
    if starts.size == 0:
        return np.zeros((0, features.feature_dim(skeleton)))
    idx = starts[:, None] + np.arange(window)
    r, q, _, _ = transforms.canonicalize(skeleton, root[idx], rotations[idx])
    return features.encode(skeleton, r, q).reshape(-1, features.feature_dim(skeleton))


# --------------------------------------------------------------------------------------------
# Conversion


def resolve_sources(source=None) -> list[Path]:
    """``None`` -> the DeepMimic clips of pybullet; a directory -> its motion files; else a glob."""
    if source is None or source == "deepmimic":
        return deepmimic_clip_paths()
    p = Path(source)
    if p.is_dir():
        return sorted(q for q in p.rglob("*") if q.suffix.lower() in (".bvh", ".txt", ".json"))
    return sorted(Path(q) for q in glob.glob(str(source), recursive=True))


def _fingerprint(paths, fps, window, heldout) -> str:
    h = hashlib.sha256(json.dumps([FORMAT_VERSION, fps, window, list(heldout), TRAIN_FRACTION]).encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _load_files(paths, strict: bool, skipped: list) -> Iterator[Motion]:
    for path in paths:
        try:
            yield load(path)
        except (MotionFormatError, OSError, ValueError) as e:
            if strict:
                raise
            logging.warning("skipping %s: %s", path, e)
            skipped.append({"path": str(path), "reason": str(e)})


def write_dataset(motions: Iterable[Motion], out_dir, *, fps: float, window: int, strict: bool = False,
                  heldout=HELDOUT_CLIPS, records_per_shard: int = 4096, skipped: list | None = None,
                  fingerprint: str = "", progress: bool = True, total: int | None = None) -> DatasetInfo:
    """Resample, check and write clips to shards; stream the training-split stats; write the index.

    A clip that fails the checks (:func:`motionjax.data.records.check_clip`, another skeleton) is
    skipped and listed in ``index.json["skipped"]``; ``strict`` raises instead.
    """
    from array_record.python.array_record_module import ArrayRecordWriter
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / INDEX).unlink(missing_ok=True)  # the directory is incomplete until the index is back
    for old in out.glob("clips-*.array_record"):
        old.unlink()
    skipped = [] if skipped is None else skipped
    skeleton, moments, clips, names, train_windows = None, None, [], set(), []
    shard_files, writer = [], None
    for motion in tqdm(motions, total=total, desc="clips", unit="clip", disable=not progress):
        try:
            if skeleton is None:
                skeleton, moments = motion.skeleton, Moments(features.feature_dim(motion.skeleton))
            if motion.skeleton != skeleton:
                raise records.BadRecordError(f"clip {motion.name!r}: skeleton {motion.skeleton} differs "
                                             f"from the dataset's {skeleton}")
            if motion.name in names:
                raise records.BadRecordError(f"clip {motion.name!r}: duplicate clip name")
            if motion.num_frames == 0:
                raise records.BadRecordError(f"clip {motion.name!r}: zero frames")
            root, rots = transforms.resample(motion.root_position, motion.rotations, motion.fps, fps)
            root, rots = root.astype(np.float32), rots.astype(np.float32)
            clip = {"name": motion.name, "root_position": root, "rotations": rots,
                    "score": transforms.dynamics_score(skeleton, root, rots, fps)}
            records.check_clip(clip, skeleton)
        except records.BadRecordError as e:
            if strict:
                raise
            logging.warning("skipping %s", e)
            skipped.append({"path": motion.name, "reason": str(e)})
            continue
        if writer is None or len(clips) % records_per_shard == 0:
            if writer is not None:
                writer.close()
            shard_files.append(f"clips-{len(shard_files):05d}.array_record")
            writer = ArrayRecordWriter(str(out / shard_files[-1]), "group_size:1")
        writer.write(records.encode_record(motion.name, root, rots, clip["score"]))
        names.add(motion.name)
        clips.append({"name": motion.name, "frames": int(root.shape[0]), "source_fps": float(motion.fps)})
        if motion.name not in heldout:
            cut = int(round(root.shape[0] * TRAIN_FRACTION))
            moments.update(window_features(skeleton, root[:cut], rots[:cut], window, max(window // 4, 1)))
            scores = transforms.segment_windows(clip["score"][:cut], window)
            train_windows.append([int(scores.size), float(scores.sum())])
    if writer is not None:
        writer.close()
    if not clips:
        raise ValueError(f"{out}: no clip converted; skipped: {skipped}")
    if moments.count == 0:
        raise ValueError(f"{out}: no training segment holds a {window}-frame window; use a shorter window")
    # Final names carry the shard count, as ArrayRecord datasets usually do.
    final = [f"clips-{i:05d}-of-{len(shard_files):05d}.array_record" for i in range(len(shard_files))]
    for a, b in zip(shard_files, final, strict=True):
        os.replace(out / a, out / b)
    splits = split_segments([c["name"] for c in clips], [c["frames"] for c in clips], heldout)
    doc = {"version": FORMAT_VERSION, "fingerprint": fingerprint, "fps": fps,
           "skeleton": skeleton_to_dict(skeleton), "clips": clips, "shards": final,
           "heldout_clips": list(heldout), "train_fraction": TRAIN_FRACTION,
           "splits": {k: [list(s) for s in v] for k, v in splits.items()}, "train_windows": train_windows,
           "stats": {"window": window, "frames": moments.count, "mean": moments.mean.tolist(),
                     "std": moments.std().tolist()},
           "skipped": skipped}
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / INDEX)
    return load_info(out)


def prepare(source=None, out_dir="data_cache/deepmimic", *, fps: float = 30.0, window: int = 32,
            strict: bool = False, heldout=HELDOUT_CLIPS, records_per_shard: int = 4096,
            progress: bool = True, force: bool = False) -> DatasetInfo:
    """Convert motion files (see :func:`resolve_sources`) into a prepared directory.

    Idempotent: when ``index.json`` already records the same inputs (paths, sizes, mtimes, fps,
    window, split) nothing is rewritten. Unreadable files are skipped and listed (``strict``
    raises on the first one).
    """
    paths = resolve_sources(source)
    if not paths:
        raise FileNotFoundError(f"no motion files found for source {source!r}")
    fingerprint = _fingerprint(paths, fps, window, heldout)
    index = Path(out_dir) / INDEX
    if not force and index.exists() and json.loads(index.read_text()).get("fingerprint") == fingerprint:
        logging.info("%s is up to date", out_dir)
        return load_info(out_dir)
    skipped: list = []
    return write_dataset(_load_files(paths, strict, skipped), out_dir, fps=fps, window=window, strict=strict,
                         heldout=heldout, records_per_shard=records_per_shard, skipped=skipped,
                         fingerprint=fingerprint, progress=progress, total=len(paths))
