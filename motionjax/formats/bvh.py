"""Biovision Hierarchy (BVH) motion files: read and write.

A BVH file is a HIERARCHY of joints (``OFFSET`` from the parent, ``CHANNELS`` read per frame)
followed by a MOTION table, one line of channel values per frame. Mapping onto :class:`Motion`:

* Joints keep the file's depth-first order; an ``End Site`` becomes a fixed leaf joint named
  ``<parent>_end`` (written back as an End Site).
* Joint kind follows the rotation channels: 2-3 → ball, exactly one → hinge about that principal
  axis (so a DeepMimic knee writes as ``Zrotation`` and reads back as a hinge), none → fixed.
* Rotation channels are intrinsic Euler angles in degrees, applied in the order they are listed,
  any order per joint (``Zrotation Xrotation Yrotation`` → R = R_z·R_x·R_y).
* Position channels *replace* the OFFSET components they name rather than adding to them, as in
  ``bvhio`` and most exporters: the root's become ``Motion.root_position``, a non-root joint's
  become per-frame ``Motion.offsets [T, J, 3]``.
* Lengths are multiplied by ``scale`` on reading and divided by it on writing, so
  ``read_bvh(p, scale=0.01)`` turns a centimetre file into metres and ``write_bvh(p, m, scale=0.01)``
  writes centimetres again.

Any whitespace (spaces, tabs, CRLF) separates tokens. Malformed files raise
:class:`MotionFormatError` with the file, the line and what was expected.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.skeleton import BALL, FIXED, HINGE, Skeleton
from motionjax.formats.motion import Motion, MotionFormatError

_POSITION = {"Xposition": 0, "Yposition": 1, "Zposition": 2}
_ROTATION = {"Xrotation": "X", "Yrotation": "Y", "Zrotation": "Z"}


@dataclasses.dataclass
class _Joint:
    name: str
    parent: int
    offset: np.ndarray
    channels: list[str]
    line: int

    @property
    def rotation_order(self) -> str:
        return "".join(_ROTATION[c] for c in self.channels if c in _ROTATION)


class _Tokens:
    """Whitespace tokens of the HIERARCHY section with their 1-based line numbers."""

    def __init__(self, path, lines: list[str]):
        self.path = path
        self.items = [(tok, n) for n, text in enumerate(lines, 1) for tok in text.split()]
        self.pos = 0

    @property
    def line(self) -> int:
        return self.items[min(self.pos, len(self.items) - 1)][1] if self.items else 1

    def error(self, message: str, line: int | None = None):
        return MotionFormatError(self.path, message, line=self.line if line is None else line)

    def peek(self) -> str | None:
        return self.items[self.pos][0] if self.pos < len(self.items) else None

    def next(self, expected: str) -> str:
        if self.pos >= len(self.items):
            raise self.error(f"file ends inside the HIERARCHY; expected {expected}")
        tok = self.items[self.pos][0]
        self.pos += 1
        return tok

    def expect(self, keyword: str, context: str = ""):
        tok = self.next(repr(keyword) + context)
        if tok != keyword:
            self.pos -= 1
            raise self.error(f"expected {keyword!r}{context}, found {tok!r}")

    def rest_of_line(self) -> list[str]:
        """The remaining tokens on the line of the token just consumed (a keyword's arguments)."""
        line, out = self.items[self.pos - 1][1], []
        while self.pos < len(self.items) and self.items[self.pos][1] == line:
            out.append(self.items[self.pos][0])
            self.pos += 1
        return out

    def numbers(self, count: int, what: str) -> np.ndarray:
        line = self.line
        values = [self.next(f"{count} numbers for {what}") for _ in range(count)]
        try:
            out = np.array([float(v) for v in values])  # float() per token: ~10x np.array(strings)
        except ValueError:
            raise self.error(f"{what} must be {count} numbers, got {' '.join(values)!r}", line) from None
        if not np.isfinite(out).all():
            raise self.error(f"{what} must be finite, got {' '.join(values)!r}", line)
        return out


def _parse_joint(tokens: _Tokens, joints: list[_Joint], parent: int, keyword_line: int, name_tokens):
    name = " ".join(t for t in name_tokens if t != "{")
    if not name:
        raise tokens.error("expected a joint name after ROOT/JOINT", keyword_line)
    if "{" not in name_tokens:
        tokens.expect("{", f" opening joint {name!r}")
    tokens.expect("OFFSET", f" in joint {name!r}")
    offset = tokens.numbers(3, f"OFFSET of {name!r}")
    channels = []
    if tokens.peek() == "CHANNELS":
        tokens.next("CHANNELS")
        line = tokens.line
        words = tokens.rest_of_line()
        if not words or not words[0].isdigit():
            raise tokens.error(f"CHANNELS of {name!r} must start with a channel count", line)
        count, channels = int(words[0]), words[1:]
        if count != len(channels):
            raise tokens.error(f"CHANNELS of {name!r} declares {count} channels but lists {len(channels)}: "
                               f"{' '.join(channels)!r}", line)
        unknown = [c for c in channels if c not in _POSITION and c not in _ROTATION]
        if unknown:
            raise tokens.error(f"unknown channel {unknown[0]!r} in joint {name!r}; expected one of "
                               f"{', '.join([*_POSITION, *_ROTATION])}", line)
        if len(set(channels)) != len(channels):
            raise tokens.error(f"repeated channel in joint {name!r}: {' '.join(channels)!r}", line)
    index = len(joints)
    joints.append(_Joint(name, parent, offset, channels, keyword_line))
    end_sites = 0
    while True:
        line = tokens.line
        tok = tokens.next(f"'}}' closing joint {name!r} (opened at line {keyword_line})")
        if tok == "}":
            return
        if tok in ("JOINT", "ROOT"):
            _parse_joint(tokens, joints, index, line, tokens.rest_of_line())
        elif tok == "End":
            tokens.expect("Site", " after 'End'")
            tokens.expect("{", " opening End Site")
            tokens.expect("OFFSET", " in End Site")
            end = tokens.numbers(3, f"End Site OFFSET of {name!r}")
            tokens.expect("}", " closing End Site")
            end_sites += 1
            suffix = "_end" if end_sites == 1 else f"_end{end_sites}"
            joints.append(_Joint(name + suffix, index, end, [], line))
        else:
            raise tokens.error(f"expected JOINT, End Site or '}}' in joint {name!r}, found {tok!r}", line)


def _parse_hierarchy(path, lines: list[str]) -> list[_Joint]:
    tokens = _Tokens(path, lines)
    tokens.expect("HIERARCHY", " at the start of a BVH file")
    line = tokens.line
    tokens.expect("ROOT", " after HIERARCHY")
    joints: list[_Joint] = []
    _parse_joint(tokens, joints, -1, line, tokens.rest_of_line())
    if tokens.peek() is not None:
        raise tokens.error(f"expected MOTION after the root joint's closing '}}', found {tokens.peek()!r}")
    seen = set()
    for joint in joints:
        if joint.name in seen:
            raise MotionFormatError(path, f"joint name {joint.name!r} appears twice", line=joint.line)
        seen.add(joint.name)
    return joints


def _skeleton(joints: list[_Joint], scale: float) -> Skeleton:
    kinds, axes = [], np.zeros((len(joints), 3))
    for i, j in enumerate(joints):
        order = j.rotation_order
        if len(order) == 1:
            kinds.append(HINGE)
            axes[i, "XYZ".index(order)] = 1.0
        else:
            kinds.append(BALL if order else FIXED)
    return Skeleton([j.name for j in joints], [j.parent for j in joints],
                    np.stack([j.offset for j in joints]) * scale, kinds, axes, None)


def _motion_line(lines: list[str]) -> int:
    """0-based index of the ``MOTION`` line (``len(lines)`` when there is none)."""
    return next((n for n, line in enumerate(lines) if line.split()[:1] == ["MOTION"]), len(lines))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # tolerates a byte-order mark
    except (OSError, UnicodeDecodeError) as e:
        raise MotionFormatError(path, f"cannot read file: {e}") from e


def read_bvh_skeleton(path, scale: float = 1.0) -> Skeleton:
    """The skeleton of a BVH file's HIERARCHY; offsets times ``scale`` (e.g. 0.01 for cm → m)."""
    path = Path(path)
    lines = _read_text(path).splitlines()
    return _skeleton(_parse_hierarchy(path, lines[:_motion_line(lines)]), scale)


def _header_value(path, lines, n: int, label: str, kind):
    """Parse line ``n`` (0-based) as ``label value``, e.g. ``Frames: 120``."""
    words = lines[n].split() if n < len(lines) else []
    if words[:len(label.split())] != label.split() or len(words) != len(label.split()) + 1:
        raise MotionFormatError(path, f"expected '{label} <{kind.__name__}>', found {' '.join(words)!r}",
                                line=n + 1)
    try:
        return kind(words[-1])
    except ValueError:
        raise MotionFormatError(path, f"{label} must be a{'n' if kind is int else ''} {kind.__name__}, "
                                f"got {words[-1]!r}", line=n + 1) from None


def _read_frames(path, lines, first: int, num_frames: int, num_channels: int) -> np.ndarray:
    """``[T, C]`` channel values from the ``num_frames`` non-blank lines from 0-based ``first``."""
    try:  # fast path: numpy's C parser (skips blank lines); any irregularity takes the checked path
        data = np.loadtxt(lines[first:], np.float64, comments=None, ndmin=2)
    except ValueError:
        data = None
    if data is not None and data.shape == (num_frames, num_channels) and np.isfinite(data).all():
        return data
    rows, numbers = [], []
    for n in range(first, len(lines)):
        words = lines[n].split()
        if not words:
            continue
        if len(rows) == num_frames:
            raise MotionFormatError(path, f"more frame lines than 'Frames: {num_frames}' declares",
                                    line=n + 1)
        if len(words) != num_channels:
            raise MotionFormatError(path, f"frame {len(rows)} has {len(words)} values, expected "
                                    f"{num_channels} (one per channel in the HIERARCHY)", line=n + 1)
        rows.append(n + 1)
        numbers.append(words)
    if len(rows) < num_frames:
        raise MotionFormatError(path, f"file is truncated: 'Frames: {num_frames}' declared but only "
                                f"{len(rows)} frame lines follow", line=len(lines))
    try:
        data = np.array(numbers, np.float64).reshape(num_frames, num_channels)
    except ValueError:
        for t, words in enumerate(numbers):  # find the culprit only on the slow path
            for w in words:
                try:
                    float(w)
                except ValueError:
                    raise MotionFormatError(path, f"frame {t} holds non-numeric value {w!r}",
                                            line=rows[t]) from None
        raise
    bad = ~np.isfinite(data)
    if bad.any():
        t, c = np.argwhere(bad)[0]
        raise MotionFormatError(path, f"frame {t} channel {c} is {data[t, c]}; expected a finite number",
                                line=rows[t])
    return data


# Values no capture produces: finite, yet a sine of 1e30 degrees is noise, and a position that far
# away is a corrupt file, not a motion. Rotations in degrees (unwrapped angles of a long spinning clip
# stay far below), positions in the file's unit (1e9 mm is 1,000 km).
MAX_ROTATION_DEG, MAX_POSITION = 1e6, 1e9


def _check_magnitudes(path, lines, first: int, data: np.ndarray, channels: list) -> None:
    """:class:`MotionFormatError` naming the frame, joint and channel of the first absurd value."""
    bound = np.array([MAX_POSITION if c in _POSITION else MAX_ROTATION_DEG for _, c in channels])
    bad = np.abs(data) > bound
    if not bad.any():
        return
    t, c = np.argwhere(bad)[0]
    (joint, channel), kind = channels[c], "position" if channels[c][1] in _POSITION else "rotation"
    unit = "" if kind == "position" else " degrees"
    line = [n + 1 for n in range(first, len(lines)) if lines[n].split()][t]
    raise MotionFormatError(path, f"frame {t} {joint} {channel} is {data[t, c]:g}{unit}; expected a {kind} "
                            f"of magnitude <= {bound[c]:g}{unit} (no capture produces this: a corrupt file)",
                            line=line)


def _euler_to_quat(angles_deg: np.ndarray, order: str) -> np.ndarray:
    """``[..., k]`` angles (degrees) for the first ``k <= 3`` axes of ``order`` -> ``[..., 4]``."""
    full = order + "".join(a for a in "XYZ" if a not in order)  # missing axes rotate by 0
    pad = np.zeros(angles_deg.shape[:-1] + (3 - angles_deg.shape[-1],))
    return rot.euler_to_quat(np.radians(np.concatenate([angles_deg, pad], -1)), full)  # numpy float64


def read_bvh(path, scale: float = 1.0) -> Motion:
    """Read a BVH file into a :class:`Motion`; lengths are multiplied by ``scale``."""
    path = Path(path)
    lines = _read_text(path).splitlines()
    motion_line = _motion_line(lines)
    joints = _parse_hierarchy(path, lines[:motion_line])  # a truncated HIERARCHY is reported first
    if motion_line == len(lines):
        raise MotionFormatError(path, "no MOTION section: expected a line 'MOTION' after the HIERARCHY",
                                line=len(lines))
    skeleton = _skeleton(joints, scale)
    num_frames = _header_value(path, lines, motion_line + 1, "Frames:", int)
    if num_frames < 1:
        raise MotionFormatError(path, f"'Frames: {num_frames}': expected at least one frame", motion_line + 2)
    frame_time = _header_value(path, lines, motion_line + 2, "Frame Time:", float)
    if not np.isfinite(frame_time) or frame_time <= 0:
        raise MotionFormatError(path, f"'Frame Time: {frame_time}': expected a positive number of seconds",
                                motion_line + 3)
    num_channels = sum(len(j.channels) for j in joints)
    data = _read_frames(path, lines, motion_line + 3, num_frames, num_channels)
    _check_magnitudes(path, lines, motion_line + 3, data, [(j.name, c) for j in joints for c in j.channels])

    # Every joint's per-frame translation starts at its OFFSET; position channels replace components.
    offsets = np.broadcast_to(skeleton.offsets, (num_frames, *skeleton.offsets.shape)).copy()
    rotations = np.zeros((num_frames, len(joints), 4))
    rotations[..., 0] = 1.0
    col = 0
    by_order: dict[str, tuple[list[int], list[list[int]]]] = {}
    for i, joint in enumerate(joints):
        rot_cols = []
        for c in joint.channels:
            if c in _POSITION:
                offsets[:, i, _POSITION[c]] = data[:, col] * scale
            else:
                rot_cols.append(col)
            col += 1
        if rot_cols:
            ids, cols = by_order.setdefault(joint.rotation_order, ([], []))
            ids.append(i)
            cols.append(rot_cols)
    for order, (ids, cols) in by_order.items():  # one conversion per distinct channel order
        rotations[:, ids] = _euler_to_quat(data[:, np.array(cols)], order)
    moving = any(c in _POSITION for j in joints[1:] for c in j.channels)
    return Motion(skeleton, 1.0 / frame_time, offsets[:, 0].copy(), rotations,
                  offsets=offsets if moving else None, name=path.stem)


# --------------------------------------------------------------------------------------------
# Writing


def _channels(skeleton: Skeleton, motion: Motion, j: int, order: str) -> tuple[list[str], str]:
    """(position channel names, rotation order) that joint ``j`` is written with."""
    moving = j == 0 or (motion.offsets is not None and np.any(motion.offsets[:, j] != skeleton.offsets[j]))
    positions = list(_POSITION) if moving else []
    kind, axis = skeleton.kinds[j], skeleton.axes[j]
    if j == 0:
        return positions, order  # the root always carries its full world rotation
    if kind == FIXED:
        return positions, ""
    if kind == HINGE and np.count_nonzero(axis) == 1:
        return positions, "XYZ"[int(np.flatnonzero(axis)[0])]
    return positions, order  # ball joints, and hinges about a non-principal axis


def _is_end_site(skeleton: Skeleton, j: int, positions: list[str]) -> bool:
    parent = skeleton.parents[j]
    return (j > 0 and skeleton.kinds[j] == FIXED and not skeleton.children[j] and not positions
            and skeleton.names[j] == skeleton.names[parent] + "_end")


def write_bvh(path, motion: Motion, order: str = "ZXY", scale: float = 1.0) -> None:
    """Write ``motion`` as BVH with ball-joint rotation channels in Euler ``order`` (e.g. "ZXY").

    Lengths are divided by ``scale``. Hinges about a principal axis get one rotation channel,
    fixed joints none; a fixed leaf named ``<parent>_end`` becomes an End Site. Non-root joints get
    position channels when ``motion.offsets`` moves them off their rest offset.
    """
    order = order.upper()
    if sorted(order) != ["X", "Y", "Z"]:
        raise ValueError(f"order must be a permutation of XYZ, got {order!r}")
    sk = motion.skeleton
    plan = [_channels(sk, motion, j, order) for j in range(sk.num_joints)]
    offsets = motion.offsets if motion.offsets is not None else np.broadcast_to(
        sk.offsets, (motion.num_frames, *sk.offsets.shape))
    out, columns = ["HIERARCHY"], []

    def emit(j: int, depth: int):
        pad = "\t" * depth
        positions, rot_order = plan[j]
        off = " ".join(f"{v:.9g}" for v in sk.offsets[j] / scale)
        if _is_end_site(sk, j, positions):
            out.extend([f"{pad}End Site", f"{pad}{{", f"{pad}\tOFFSET {off}", f"{pad}}}"])
            return
        channels = positions + [f"{a}rotation" for a in rot_order]
        out.extend([f"{pad}{'ROOT' if j == 0 else 'JOINT'} {sk.names[j]}", f"{pad}{{", f"{pad}\tOFFSET {off}",
                    f"{pad}\tCHANNELS {len(channels)} {' '.join(channels)}".rstrip()])
        if positions:
            columns.append((motion.root_position if j == 0 else offsets[:, j]) / scale)
        if rot_order:
            columns.append(_quat_to_euler_deg(motion.rotations[:, j], rot_order, sk.axes[j]))
        for child in sk.children[j]:
            emit(child, depth + 1)
        out.append(f"{pad}}}")

    emit(0, 0)
    out.extend(["MOTION", f"Frames: {motion.num_frames}", f"Frame Time: {1.0 / motion.fps:.9g}"])
    data = np.concatenate(columns, axis=1)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
        np.savetxt(f, data, fmt="%.9g")


def write_bvh_like(path, template, motion: Motion, scale: float = 1.0) -> None:
    """Write ``motion`` (on ``template``'s skeleton, e.g. :func:`read_bvh` of it with the same
    ``scale``) with the HIERARCHY of BVH file ``template`` kept verbatim: its joints, OFFSETs and
    every joint's channels in their order and rotation order, and its frame time. Each frame's
    values come from ``motion``: the root's position, ``motion.offsets`` (or the rest offsets) for
    other position channels, the rotations as Euler angles in each joint's own order."""
    template = Path(template)
    lines = _read_text(template).splitlines()
    motion_line = _motion_line(lines)
    joints = _parse_hierarchy(template, lines[:motion_line])
    if [j.name for j in joints] != list(motion.skeleton.names):
        raise ValueError(f"{template}: its joints are not the motion's skeleton's")
    frame_time = _header_value(template, lines, motion_line + 2, "Frame Time:", float)
    if abs(frame_time * motion.fps - 1) > 1e-4:
        raise ValueError(f"{template}: frame time {frame_time} s vs the motion's {1 / motion.fps:.9g} s")
    sk = motion.skeleton
    offsets = motion.offsets if motion.offsets is not None else np.broadcast_to(
        sk.offsets, (motion.num_frames, *sk.offsets.shape))
    columns = []
    for i, joint in enumerate(joints):
        order = joint.rotation_order
        if order:
            q = np.asarray(motion.rotations[:, i], np.float64)
            if len(order) == 1:  # a hinge: the signed angle about its axis
                angles = _quat_to_euler_deg(q, order, sk.axes[i])
            else:  # two channels: the third angle of the full order is ~0 for such a joint
                full = order + "".join(a for a in "XYZ" if a not in order)
                angles = np.degrees(rot.quat_to_euler(q, full))[:, :len(order)]
        position = motion.root_position if i == 0 else offsets[:, i]
        k = 0
        for c in joint.channels:
            if c in _POSITION:
                columns.append(position[:, _POSITION[c]] / scale)
            else:
                columns.append(angles[:, k])
                k += 1
    with open(path, "w") as f:
        f.write("\n".join([*lines[:motion_line], "MOTION", f"Frames: {motion.num_frames}",
                           f"Frame Time: {lines[motion_line + 2].split()[-1]}"]) + "\n")
        np.savetxt(f, np.stack(columns, axis=1), fmt="%.9g")


def _quat_to_euler_deg(q: np.ndarray, order: str, axis: np.ndarray) -> np.ndarray:
    """``[T, 4]`` -> ``[T, len(order)]`` degrees; one letter means a hinge about ``axis``."""
    q = np.asarray(q, np.float64)  # numpy in → the float64 numpy path of the rotation functions
    if len(order) == 1:  # signed angle about the hinge axis
        return np.degrees(rot.quat_to_axis_angle(q) @ axis)[:, None]
    return np.degrees(rot.quat_to_euler(q, order))
