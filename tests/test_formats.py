"""Motion file formats against independent references: bvhio (another BVH parser) and round trips."""
import json
import warnings

import numpy as np
import pytest

from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import BALL, FIXED, HINGE
from motionjax.formats import (
    Motion,
    MotionFormatError,
    deepmimic_clip_paths,
    load,
    read_bvh,
    read_bvh_skeleton,
    read_deepmimic,
    write_bvh,
)

with warnings.catch_warnings():  # bvhio imports PyGLM the deprecated way
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    import bvhio

ORDERS = ("XYZ", "XZY", "YXZ", "YZX", "ZXY", "ZYX")

# Tabs, CRLF, blank lines, a different Euler order per joint, position channels on a non-root
# joint, a one-channel (hinge) joint, a zero-channel joint and End Sites. Lengths in cm.
HAND_BVH = """HIERARCHY
ROOT Hips
{
\tOFFSET 1.0 2.0 3.0
\tCHANNELS 6 Xposition Yposition Zposition Yrotation Xrotation Zrotation
\tJOINT Spine
\t{
\t\tOFFSET 0.0 10.0 1.0
\t\tCHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation
\t\tJOINT Head
\t\t{
\t\t\tOFFSET 0 8 0
\t\t\tCHANNELS 3 Xrotation Zrotation Yrotation
\t\t\tEnd Site
\t\t\t{
\t\t\t\tOFFSET 0 4 1
\t\t\t}
\t\t}
\t}
  JOINT LeftLeg
  {
    OFFSET 5 -2 0
    CHANNELS 3 Zrotation Yrotation Xrotation
    JOINT LeftKnee
    {
      OFFSET 0 -20 1
      CHANNELS 1 Xrotation
      JOINT LeftToe
      {
        OFFSET 0 -18 6
        CHANNELS 0
      }
    }
  }
}

MOTION
Frames: 3
Frame Time: 0.04
1 90 -3  10 20 30   0.5 10 1.5  5 -7 12   40 50 -60   70 -80 15   45
2 91 -2  -170 89.5 5   0 11 1  -5 7 -12   -40 -50 60   10 20 30   -30
3 92 -1  0 0 0   0 10 1  0 0 0   0 0 0   0 0 0   0
"""


def _write(tmp_path, text, name="clip.bvh", newline="\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode())
    return path


def _bvhio_positions(path) -> dict[str, np.ndarray]:
    """World positions ``{joint: [T, 3]}`` from bvhio, an independent BVH implementation."""
    root = bvhio.readAsHierarchy(str(path))
    frames = bvhio.readAsBvh(str(path)).FrameCount
    out = {j.Name: np.zeros((frames, 3)) for j, *_ in root.layout()}
    for t in range(frames):
        root.loadPose(t)
        for j, *_ in root.layout():
            out[j.Name][t] = np.array(j.PositionWorld)
    return out


def _positions_by_name(motion: Motion) -> dict[str, np.ndarray]:
    pos = motion.positions()
    return {n: pos[:, i] for i, n in enumerate(motion.skeleton.names)}


@pytest.fixture(scope="module")
def clip():
    return read_deepmimic(deepmimic_clip_paths()[0])


def test_deepmimic_clips_load():
    paths = deepmimic_clip_paths()
    assert len(paths) == 15
    for path in paths:
        m = load(path)
        assert m.rotations.shape == (m.num_frames, 15, 4) and m.root_position.shape == (m.num_frames, 3)
        np.testing.assert_allclose(np.linalg.norm(m.rotations, axis=-1), 1.0, atol=1e-12)
        assert 10 <= m.fps <= 120
        # Hinges rotate about their own axis only: the quaternion's vector part is along it.
        for j in np.flatnonzero(np.array(m.skeleton.kinds) == HINGE):
            vec = m.rotations[:, j, 1:]
            np.testing.assert_allclose(np.cross(vec, m.skeleton.axes[j]), 0, atol=1e-12)


def test_bvh_matches_bvhio_on_a_deepmimic_clip(tmp_path, clip):
    path = tmp_path / "clip.bvh"
    write_bvh(path, clip)
    ours, ref = _positions_by_name(read_bvh(path)), _bvhio_positions(path)
    assert set(ref) == set(ours)  # wrists are CHANNELS 0 joints, not End Sites: bvhio sees them
    err = max(np.abs(ours[n] - ref[n]).max() for n in ref)
    assert err < 1e-5  # bvhio computes in float32 (glm)


def test_bvh_matches_bvhio_on_a_hand_written_file(tmp_path):
    path = _write(tmp_path, HAND_BVH, newline="\r\n")
    motion = read_bvh(path)
    ours, ref = _positions_by_name(motion), _bvhio_positions(path)
    assert set(ref) == set(motion.skeleton.names) - {"Head_end"}  # bvhio keeps End Sites apart
    for name in ref:
        np.testing.assert_allclose(ours[name], ref[name], atol=1e-4, err_msg=name)
    # And the End Site sits at its offset from Head, rotated by Head's world rotation.
    pos, world = forward_kinematics(motion.skeleton, motion.rotations, motion.root_position, motion.offsets)
    head, end = motion.skeleton.index("Head"), motion.skeleton.index("Head_end")
    np.testing.assert_allclose(
        pos[:, end] - pos[:, head], rot.quat_rotate(world[:, head], np.array([0, 4.0, 1])))


def test_bvh_hand_written_structure(tmp_path):
    motion = read_bvh(_write(tmp_path, HAND_BVH, newline="\r\n"), scale=0.01)
    sk = motion.skeleton
    assert sk.names == ("Hips", "Spine", "Head", "Head_end", "LeftLeg", "LeftKnee", "LeftToe")
    assert sk.parents == (-1, 0, 1, 2, 0, 4, 5)
    assert sk.kinds == (BALL, BALL, BALL, FIXED, BALL, HINGE, FIXED)
    np.testing.assert_array_equal(sk.axes[5], [1, 0, 0])
    assert motion.fps == pytest.approx(25.0)
    np.testing.assert_allclose(sk.offsets[3], [0, 0.04, 0.01])
    np.testing.assert_allclose(motion.root_position[0], [0.01, 0.9, -0.03])  # channels replace OFFSET
    np.testing.assert_allclose(motion.offsets[:, 1], [[0.005, 0.1, 0.015], [0, 0.11, 0.01], [0, 0.1, 0.01]])
    np.testing.assert_allclose(motion.offsets[:, 4], np.broadcast_to(sk.offsets[4], (3, 3)))
    # Frame 2 is all zero angles: the rest pose.
    np.testing.assert_allclose(motion.rotations[2], rot.identity_quat((7,), xp=np))
    # Root rotation "Yrotation Xrotation Zrotation" is intrinsic Y then X then Z.
    want = rot.euler_to_quat(np.radians([10.0, 20.0, 30.0]), "YXZ")
    np.testing.assert_allclose(motion.rotations[0, 0], want, atol=1e-12)
    # Scale multiplies every length.
    np.testing.assert_allclose(motion.positions(), read_bvh(tmp_path / "clip.bvh").positions() * 0.01,
                               atol=1e-12)
    assert read_bvh_skeleton(tmp_path / "clip.bvh", scale=0.01) == sk
    with_bom = tmp_path / "bom.bvh"
    with_bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "clip.bvh").read_bytes())
    np.testing.assert_array_equal(read_bvh(with_bom, scale=0.01).positions(), motion.positions())


@pytest.mark.parametrize("order", ORDERS)
def test_bvh_write_read_round_trip(tmp_path, clip, order):
    path = tmp_path / f"{order}.bvh"
    write_bvh(path, clip, order=order)
    assert f"CHANNELS 3 {' '.join(a + 'rotation' for a in order)}\n" in path.read_text()
    back = read_bvh(path)
    assert back.fps == pytest.approx(clip.fps)
    assert sorted(back.skeleton.names) == sorted(clip.skeleton.names)
    for name, want in _positions_by_name(clip).items():
        np.testing.assert_allclose(_positions_by_name(back)[name], want, atol=1e-5, err_msg=name)
        assert back.skeleton.kinds[back.skeleton.index(name)] == \
            clip.skeleton.kinds[clip.skeleton.index(name)]


def test_bvh_channel_order_does_not_change_positions(tmp_path, clip):
    """The same motion written in two channel orders reads back to the same positions."""
    write_bvh(tmp_path / "a.bvh", clip, order="ZXY")
    write_bvh(tmp_path / "b.bvh", clip, order="YZX")
    assert "Yrotation Zrotation Xrotation" in (tmp_path / "b.bvh").read_text()
    a, b = read_bvh(tmp_path / "a.bvh"), read_bvh(tmp_path / "b.bvh")
    assert a.skeleton.names == b.skeleton.names
    np.testing.assert_allclose(a.positions(), b.positions(), atol=1e-6)


def test_bvh_round_trip_keeps_end_sites_and_position_channels(tmp_path):
    src = read_bvh(_write(tmp_path, HAND_BVH), scale=0.01)
    write_bvh(tmp_path / "out.bvh", src, order="XZY", scale=0.01)
    text = (tmp_path / "out.bvh").read_text()
    assert text.count("End Site") == 1 and "JOINT Head_end" not in text
    back = read_bvh(tmp_path / "out.bvh", scale=0.01)
    assert back.skeleton == src.skeleton
    np.testing.assert_allclose(back.offsets, src.offsets, atol=1e-9)
    np.testing.assert_allclose(back.positions(), src.positions(), atol=1e-5)


# --------------------------------------------------------------------------------------------
# Bad input: each names the file, the line, and what was expected.

def _break(old: str, new: str) -> str:
    assert old in HAND_BVH
    return HAND_BVH.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


BAD_BVH = {
    "truncated_hierarchy": (HAND_BVH[:HAND_BVH.index("  JOINT LeftLeg")], "file ends inside the HIERARCHY",
                            None),
    "truncated_frames": (HAND_BVH[:HAND_BVH.index("3 92 -1")], "truncated: 'Frames: 3' declared but only 2",
                         None),
    "channel_count": (_break("CHANNELS 3 Xrotation Zrotation", "CHANNELS 4 Xrotation Zrotation"),
                      "declares 4 channels but lists 3", "CHANNELS 4"),
    "frame_values": (_break("\n3 92 -1  0 0 0", "\n3 92 -1  0 0"), "frame 2 has 18 values, expected 19",
                     "3 92 -1"),
    "non_numeric": (_break("2 91 -2", "2 9x1 -2"), "non-numeric value '9x1'", "2 9x1"),
    "nan": (_break("2 91 -2", "2 nan -2"), "expected a finite number", "2 nan"),
    "inf": (_break("1 90 -3", "1 90 -inf"), "expected a finite number", "1 90 -inf"),
    "offset": (_break("OFFSET 0 8 0", "OFFSET 0 8 zero"), "must be 3 numbers", "OFFSET 0 8 zero"),
    "missing_motion": (HAND_BVH[:HAND_BVH.index("MOTION")], "no MOTION section", None),
    "unknown_channel": (_break("Zrotation Yrotation Xrotation", "Zrotation Yrotation Wrotation"),
                        "unknown channel 'Wrotation'", "Wrotation"),
    "zero_frames": (HAND_BVH[:HAND_BVH.index("Frames: 3")] + "Frames: 0\nFrame Time: 0.04\n",
                    "expected at least one frame", "Frames: 0"),
    "frame_time": (_break("Frame Time: 0.04", "Frame Time: -1"), "positive number of seconds", "Frame Time"),
    "duplicate_name": (_break("JOINT LeftKnee", "JOINT Head"), "joint name 'Head' appears twice",
                       "JOINT Head\n    {"),
    "no_root": (_break("ROOT Hips", "JOINT Hips"), "expected 'ROOT'", "JOINT Hips"),
    "extra_frames": (HAND_BVH + "4 92 -1  0 0 0   0 10 1  0 0 0   0 0 0   0 0 0   0\n",
                     "more frame lines", "4 92 -1"),
}


@pytest.mark.parametrize("case", sorted(BAD_BVH))
def test_bvh_bad_input(tmp_path, case):
    text, message, needle = BAD_BVH[case]
    path = _write(tmp_path, text, name=f"{case}.bvh")
    with pytest.raises(MotionFormatError, match=message) as info:
        read_bvh(path)
    assert str(path) in str(info.value) and info.value.path == str(path)
    if needle is not None:
        assert info.value.line == _line_of(text, needle)
    else:  # file-level problems point at the last line
        assert info.value.line == len(text.splitlines())


def _deepmimic_text(clip_path, edit):
    doc = json.loads(clip_path.read_text())
    edit(doc)
    return json.dumps(doc)


BAD_DEEPMIMIC = {
    "short_frame": (lambda d: d["Frames"][3].pop(), "frame 3 has 43 values, expected 44"),
    "long_frame": (lambda d: d["Frames"][0].append(0.0), "frame 0 has 45 values, expected 44"),
    "non_numeric": (lambda d: d["Frames"][1].__setitem__(5, "x"), "frame 1 holds a non-numeric value"),
    "nan": (lambda d: d["Frames"][2].__setitem__(9, float("nan")), "frame 2 holds NaN or inf"),
    "no_frames": (lambda d: d.__setitem__("Frames", []), 'non-empty "Frames" list'),
    "zero_quaternion": (lambda d: d["Frames"][4].__setitem__(slice(4, 8), [0, 0, 0, 0]),
                        "frame 4 has a zero quaternion"),
    "duration": (lambda d: d["Frames"][0].__setitem__(0, 0.0), "duration must be positive"),
}


@pytest.mark.parametrize("case", sorted(BAD_DEEPMIMIC))
def test_deepmimic_bad_input(tmp_path, case):
    edit, message = BAD_DEEPMIMIC[case]
    path = tmp_path / f"{case}.txt"
    path.write_text(_deepmimic_text(deepmimic_clip_paths()[0], edit))
    with pytest.raises(MotionFormatError, match=message) as info:
        read_deepmimic(path)
    assert str(path) in str(info.value)


def test_deepmimic_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "broken.txt"
    path.write_text('{\n"Frames": [\n[0.1, 1, 2,\n')
    with pytest.raises(MotionFormatError, match="not valid JSON") as info:
        read_deepmimic(path)
    assert info.value.line == 4


def test_load_rejects_unknown_suffix(tmp_path):
    with pytest.raises(MotionFormatError, match="unknown motion file type '.fbx'"):
        load(tmp_path / "x.fbx")
