"""What a prepared dataset is: ``index.json``'s schema, read into :class:`DatasetInfo`.

:mod:`motionjax.data.prepare` writes a prepared directory (ArrayRecord shards + ``index.json``);
this module is what readers need of it (the trainer, the pipeline, evaluation): the index's name
and format version, the skeleton's JSON form, and :func:`load_info`. The synthetic corpus
(:mod:`motionjax.data.synthetic`) describes itself with the same :class:`DatasetInfo`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
from pathlib import Path

import numpy as np

from motionjax.core import features
from motionjax.core.skeleton import Skeleton

INDEX = "index.json"
# 4: pops are measured against a cubic over each span (data.clean); older directories rebuild.
FORMAT_VERSION = 4


class DamagedIndexError(ValueError):
    """An ``index.json`` whose contents differ from the digest written with it (an edited or damaged
    file: its statistics or splits are no longer the ones prepared)."""


def index_digest(doc: dict) -> str:
    """sha256 of ``doc`` (an index without its ``"digest"``), canonical JSON: written as its
    ``"digest"`` and checked on every read."""
    body = {k: v for k, v in doc.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True).encode()).hexdigest()


def read_index(data_dir) -> dict:
    """``index.json`` of a prepared directory, checked against its digest (:class:`DamagedIndexError`;
    an index of older code has none)."""
    path = Path(data_dir) / INDEX
    doc = json.loads(path.read_text())
    if "digest" in doc and doc["digest"] != index_digest(doc):
        raise DamagedIndexError(f"{path}: its contents differ from the digest written with it (edited or "
                                f"damaged); rebuild it: motionjax prepare --out {data_dir} "
                                "--force, with the settings it was prepared with")
    return doc


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
      skeleton: the tree of every clip, with the median bone offsets over clips.
      fps: frame rate of every record.
      mean, std: ``[F]`` float32 feature stats (std floored at :data:`motionjax.data.stats.MIN_STD` -> 1).
      names, frames: per record (clip id = record index); dropped clips are in no split.
      splits: split name -> list of ``(clip, begin, end)`` segments.
      window: window length the stats were computed with (must equal ``config.data.window``).
      shards: ArrayRecord file names, relative to ``data_dir``.
      train_windows: per segment of the ``train`` split, ``(number of windows, sum of their mean
        dynamics scores)`` for ``window``: the normalizers of dynamics-weighted sampling.
      skipped: ``[{"path", "reason"}]`` files or clips that were not kept.
      synthetic: ``{"num_clips", "frames", "seed"}`` for the generated corpus, else None.
      labels: per record, a dict of label names (``{"content": "walk", "style": "happy"}``).
      train_split: the split the model trains on (the ``rest`` rule).
      cleaning: what :mod:`motionjax.data.clean` found and did (counts; the per-clip report is
        ``cleaning.json`` beside the index), or None when prepared without cleaning.
      dedup: what :mod:`motionjax.data.dedup` dropped and grouped (counts; pairs and groups are in
        the index), or None without dedup.
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
    labels: tuple = ()
    train_split: str = "train"
    cleaning: dict | None = None
    dedup: dict | None = None

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
                                f"motionjax prepare --out {data_dir}")
    doc = read_index(data_dir)
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {doc.get('version')}, expected {FORMAT_VERSION}; "
                         f"prepare it again into a new directory (or delete {data_dir})")
    clips = doc["clips"]
    return DatasetInfo(
        data_dir=str(data_dir), skeleton=skeleton_from_dict(doc["skeleton"]), fps=doc["fps"],
        mean=np.array(doc["stats"]["mean"], np.float32), std=np.array(doc["stats"]["std"], np.float32),
        names=tuple(c["name"] for c in clips), frames=tuple(c["frames"] for c in clips),
        splits={k: [tuple(s) for s in v] for k, v in doc["splits"].items()}, window=doc["stats"]["window"],
        train_windows=tuple(tuple(w) for w in doc["train_windows"]),
        shards=tuple(s["file"] for s in doc["shards"]), skipped=tuple(doc["skipped"]),
        labels=tuple(c.get("labels", {}) for c in clips), train_split=doc["train_split"],
        cleaning=doc.get("cleaning"), dedup=doc.get("dedup"))


def stand_in(skeleton: Skeleton, fps: float = 30.0) -> types.SimpleNamespace:
    """What a model and the losses need of a dataset (skeleton, fps, feature statistics), for a
    skeleton without data (benchmarks, tests): zero mean, unit std, so features pass unscaled."""
    f = features.feature_dim(skeleton)
    return types.SimpleNamespace(skeleton=skeleton, fps=fps, mean=np.zeros(f, np.float32),
                                 std=np.ones(f, np.float32), feature_dim=f)
