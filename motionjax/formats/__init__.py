"""Motion file formats: BVH, DeepMimic clips; ``load`` picks the reader by suffix."""
from motionjax.formats.deepmimic import deepmimic_clip_paths, read_deepmimic
from motionjax.formats.motion import Motion, MotionFormatError

__all__ = ["Motion", "MotionFormatError", "deepmimic_clip_paths", "load", "read_deepmimic"]


def load(path) -> Motion:
    """Read a motion file: ``.bvh`` → BVH, ``.txt``/``.json`` → DeepMimic clip."""
    from pathlib import Path
    suffix = Path(path).suffix.lower()
    if suffix in (".txt", ".json"):
        return read_deepmimic(path)
    raise MotionFormatError(path, f"unknown motion file type {suffix!r}; expected .bvh, .txt or .json")
