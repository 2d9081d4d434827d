"""One clip as one ArrayRecord record, and the checks every record passes before it is used.

A record is ``[u32 header length][JSON header][root_position f32 T·3][rotations f32 T·J·4]
[dynamics score f32 T]``: raw little-endian buffers behind a tiny header, so decoding is one
``json.loads`` and three ``np.frombuffer`` views (no pickle, nothing to trust but shapes).
"""
from __future__ import annotations

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
                         f"python scripts/prepare_data.py --out {data_dir} --force, with the settings it was "
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
