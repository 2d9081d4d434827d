"""Motion file formats: BVH, DeepMimic clips; ``load`` picks the reader by suffix."""
from pathlib import Path

from motionjax.formats.bvh import read_bvh, read_bvh_skeleton, write_bvh
from motionjax.formats.deepmimic import deepmimic_clip_paths, read_deepmimic
from motionjax.formats.motion import Motion, MotionFormatError

__all__ = ["Motion", "MotionFormatError", "deepmimic_clip_paths", "load", "read_bvh", "read_bvh_skeleton",
           "read_deepmimic", "write_bvh"]


def load(path, **kwargs) -> Motion:
    """Read a motion file: ``.bvh`` → :func:`read_bvh`, ``.txt``/``.json`` → :func:`read_deepmimic`.

    Keyword arguments go to the reader (e.g. ``scale=0.01`` for a centimetre BVH).
    """
    suffix = Path(path).suffix.lower()
    if suffix == ".bvh":
        return read_bvh(path, **kwargs)
    if suffix in (".txt", ".json"):
        return read_deepmimic(path, **kwargs)
    raise MotionFormatError(path, f"unknown motion file type {suffix!r}; expected .bvh, .txt or .json")
