"""One clip as one ArrayRecord record, the checks every record passes before it is used, and the
scratch file preparation spills per-clip arrays to while it streams (:class:`ArrayFile`).

A record is ``[u32 header length][JSON header][root_position f32 T·3][rotations f32 T·J·4]
[dynamics score f32 T]``: raw little-endian buffers behind a tiny header, so decoding is one
``json.loads`` and three ``np.frombuffer`` views (no pickle, nothing to trust but shapes).
"""
from __future__ import annotations

import collections.abc
import json
import logging
import os

import numpy as np

from motionjax.core.skeleton import Skeleton


class BadRecordError(ValueError):
    """A clip record that cannot be trained on; the message names the clip and the problem."""


class DamagedShardError(RuntimeError):
    """An ArrayRecord shard that cannot be read (truncated, bit-flipped): names the file and the fix."""

    def __init__(self, path, reason):
        data_dir = os.path.dirname(os.fspath(path)) or "."
        super().__init__(f"damaged shard {os.fspath(path)}: {reason}. Rebuild the prepared data: "
                         f"motionjax prepare --out {data_dir} --force, with the settings it was "
                         "prepared with (--config experiments/X.py, or the same --source/--fps/--window/...)")
        self.path = os.fspath(path)


def encode_record(name: str, root_position: np.ndarray, rotations: np.ndarray, score: np.ndarray,
                  offsets: np.ndarray | None = None) -> bytes:
    """``root_position [T, 3]``, ``rotations [T, J, 4]``, ``score [T]`` and the clip's own rest
    ``offsets [J, 3]`` (its performer's bone lengths; ``None``: the dataset skeleton's) -> bytes."""
    t, j = rotations.shape[:2]
    header = json.dumps({"name": name, "frames": t, "joints": j, "offsets": offsets is not None}).encode()
    parts = [len(header).to_bytes(4, "little"), header, np.ascontiguousarray(root_position, "<f4").tobytes(),
             np.ascontiguousarray(rotations, "<f4").tobytes(), np.ascontiguousarray(score, "<f4").tobytes()]
    if offsets is not None:
        parts.append(np.ascontiguousarray(offsets, "<f4").reshape(j, 3).tobytes())
    return b"".join(parts)


def decode_record(data: bytes) -> dict:
    """Record bytes -> ``{"name", "root_position" [T,3], "rotations" [T,J,4], "score" [T]}`` plus
    ``"offsets" [J,3]`` when the record carries the clip's own bone offsets."""
    n = int.from_bytes(data[:4], "little")
    head = json.loads(data[4:4 + n])
    t, j, has_offsets = head["frames"], head["joints"], head.get("offsets", False)
    body = np.frombuffer(data, "<f4", offset=4 + n)
    expected = t * (3 + 4 * j + 1) + (3 * j if has_offsets else 0)
    if body.size != expected:
        raise BadRecordError(f"clip {head['name']!r}: record holds {body.size} floats, "
                             f"expected {expected} for {t} frames x {j} joints")
    out = {"name": head["name"], "root_position": body[:3 * t].reshape(t, 3),
           "rotations": body[3 * t:3 * t + 4 * t * j].reshape(t, j, 4),
           "score": body[3 * t + 4 * t * j:t * (3 + 4 * j + 1)]}
    if has_offsets:
        out["offsets"] = body[t * (3 + 4 * j + 1):].reshape(j, 3)
    return out


def check_clip(clip: dict, skeleton: Skeleton) -> None:
    """Raise :class:`BadRecordError` for zero length, a wrong joint count, or NaN/inf values."""
    name, rotations = clip["name"], clip["rotations"]
    if rotations.shape[0] == 0:
        raise BadRecordError(f"clip {name!r}: zero frames")
    if rotations.shape[1:] != (skeleton.num_joints, 4):
        raise BadRecordError(f"clip {name!r}: rotations {rotations.shape[1:]}, expected "
                             f"({skeleton.num_joints}, 4) for the {skeleton.num_joints}-joint skeleton")
    for key in ("root_position", "rotations", "score"):
        if not np.isfinite(clip[key]).all():
            t = int(np.argwhere(~np.isfinite(clip[key]))[0, 0])
            raise BadRecordError(f"clip {name!r}: NaN or inf in {key} at frame {t}")


class BadRecordCounter:
    """Counts skipped records per clip; warns once per clip. ``strict`` raises instead."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.counts: dict[str, int] = {}

    def skip(self, error: BadRecordError, name: str) -> None:
        if self.strict:
            raise error
        if name not in self.counts:
            logging.warning("skipping bad record: %s", error)
        self.counts[name] = self.counts.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class ArrayFile(collections.abc.Mapping):
    """Per-clip arrays spilled to one scratch file as clips arrive, read back one clip at a time: a
    ``{name: array}`` mapping whose values live on disk (each keeps its shape and dtype). Prepare
    holds nothing of the corpus's size in memory: each clip's dedup descriptor (~40 KB a Bandai
    clip) and training-statistics moments (~4 KB) wait here until dedup and the split assignment
    need them. Reads go through the page cache (``np.fromfile``), not a memory map, so they add
    nothing to RSS."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._where: dict[str, tuple[int, tuple, np.dtype]] = {}  # name -> (byte offset, shape, dtype)

    def append(self, name: str, array) -> None:
        a = np.ascontiguousarray(array)
        if name in self._where:
            raise ValueError(f"{self.path}: clip {name!r} appended twice")
        self._where[name] = (self._file.tell(), a.shape, a.dtype)
        self._file.write(a.tobytes())

    def shape(self, name: str) -> tuple:
        return self._where[name][1]

    def __getitem__(self, name: str) -> np.ndarray:
        offset, shape, dtype = self._where[name]
        if not self._file.closed:
            self._file.flush()
        return np.fromfile(self.path, dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def subset(self, names) -> ArrayFile:
        """A view of the clips ``names`` (in that order), on the same file."""
        view = object.__new__(ArrayFile)
        view.path, view._file = self.path, self._file
        view._where = {n: self._where[n] for n in names}
        return view

    def close(self) -> None:
        self._file.close()
