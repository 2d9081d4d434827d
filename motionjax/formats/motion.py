"""The in-memory motion clip shared by every file format."""
from __future__ import annotations

import dataclasses

import numpy as np

from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import Skeleton


class MotionFormatError(ValueError):
    """A motion file that cannot be read; the message names the file, line and expectation."""

    def __init__(self, path, message: str, line: int | None = None):
        self.path, self.line = str(path), line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")


@dataclasses.dataclass
class Motion:
    """A clip of ``T`` frames on a skeleton.

    Attributes:
      skeleton: the kinematic tree (``J`` joints).
      fps: frames per second.
      root_position: ``[T, 3]`` world position of joint 0 (metres).
      rotations: ``[T, J, 4]`` local joint rotations, unit quaternions (w, x, y, z); identity
        for fixed joints.
      offsets: optional ``[T, J, 3]`` per-frame joint translations (BVH position channels on
        non-root joints); ``None`` means the skeleton's rest offsets.
      name: a label, usually the file stem.
    """

    skeleton: Skeleton
    fps: float
    root_position: np.ndarray
    rotations: np.ndarray
    offsets: np.ndarray | None = None
    name: str = ""

    @property
    def num_frames(self) -> int:
        return int(self.root_position.shape[0])

    def positions(self) -> np.ndarray:
        """``[T, J, 3]`` world joint positions via :func:`motionjax.core.kinematics.forward_kinematics`."""
        pos, _ = forward_kinematics(self.skeleton, self.rotations, self.root_position, self.offsets)
        return np.asarray(pos)
