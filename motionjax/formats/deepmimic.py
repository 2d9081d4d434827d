"""DeepMimic clip files (the ``humanoid3d_*.txt`` motions shipped with pybullet).

A clip is JSON ``{"Loop": ..., "Frames": [[...], ...]}``; each frame holds 44 numbers: the frame
duration (s), root position (3), root quaternion (w, x, y, z), then per joint in
:data:`JOINT_ORDER` a quaternion (w, x, y, z) for ball joints or one angle (rad) for hinges.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.skeleton import HINGE, Skeleton, deepmimic_humanoid
from motionjax.formats.motion import Motion, MotionFormatError

JOINT_ORDER = ("chest", "neck", "right_hip", "right_knee", "right_ankle", "right_shoulder",
               "right_elbow", "left_hip", "left_knee", "left_ankle", "left_shoulder", "left_elbow")


def _frame_layout(skeleton: Skeleton):
    """``[(joint index, first column, width)]`` for the joints after the root."""
    layout, col = [], 8
    for name in JOINT_ORDER:
        j = skeleton.index(name)
        width = 1 if skeleton.kinds[j] == HINGE else 4
        layout.append((j, col, width))
        col += width
    return layout, col


def read_deepmimic(path, skeleton: Skeleton | None = None) -> Motion:
    """Read a DeepMimic clip onto ``skeleton`` (default: :func:`deepmimic_humanoid`)."""
    path = Path(path)
    skeleton = skeleton or deepmimic_humanoid()
    layout, width = _frame_layout(skeleton)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise MotionFormatError(path, f"cannot read file: {e}") from e
    except json.JSONDecodeError as e:
        raise MotionFormatError(path, f"not valid JSON: {e.msg}", line=e.lineno) from e
    frames = doc.get("Frames") if isinstance(doc, dict) else None
    if not isinstance(frames, list) or not frames:
        raise MotionFormatError(path, 'expected a JSON object with a non-empty "Frames" list')
    for t, frame in enumerate(frames):
        if not isinstance(frame, list) or len(frame) != width:
            got = len(frame) if isinstance(frame, list) else type(frame).__name__
            raise MotionFormatError(path, f"frame {t} has {got} values, expected {width} "
                                    "(duration, root xyz, root wxyz, then the joint rotations)")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in frame):
            raise MotionFormatError(path, f"frame {t} holds a non-numeric value")
    data = np.asarray(frames, np.float64)
    if not np.isfinite(data).all():
        t = int(np.argwhere(~np.isfinite(data))[0, 0])
        raise MotionFormatError(path, f"frame {t} holds NaN or inf")
    duration = data[0, 0]
    if duration <= 0:
        raise MotionFormatError(path, f"frame duration must be positive, got {duration}")

    rotations = np.zeros((len(data), skeleton.num_joints, 4))
    rotations[..., 0] = 1.0
    rotations[:, 0] = data[:, 4:8]
    for j, col, w in layout:
        if w == 1:
            rotations[:, j] = np.asarray(rot.axis_angle_to_quat(data[:, col:col + 1] * skeleton.axes[j]))
        else:
            rotations[:, j] = data[:, col:col + 4]
    norms = np.linalg.norm(rotations, axis=-1, keepdims=True)
    if (norms < 1e-6).any():
        t = int(np.argwhere(norms[..., 0] < 1e-6)[0, 0])
        raise MotionFormatError(path, f"frame {t} has a zero quaternion")
    # The shipped clips store quaternions up to ~3% off unit length; simulators normalise them.
    return Motion(skeleton, 1.0 / duration, data[:, 1:4].copy(), rotations / norms, name=path.stem)


def deepmimic_clip_paths() -> list[Path]:
    """The ``humanoid3d_*.txt`` clips shipped by pybullet, sorted by name."""
    from motionjax.core.skeleton import deepmimic_urdf_path
    return sorted((deepmimic_urdf_path().parent.parent / "data" / "motions").glob("humanoid3d_*.txt"))
