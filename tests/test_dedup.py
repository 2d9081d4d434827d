"""Dedup at prepare time: exact and near-duplicate clips, leakage across splits."""
import functools
import os
from pathlib import Path

import numpy as np
import pytest

from motionjax.core import rotations as rot
from motionjax.data import dedup, records
from motionjax.formats import deepmimic_clip_paths, load, read_bvh

BANDAI = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bandai-namco-1" / "data"


@functools.cache
def _deepmimic():
    """name -> positions [T, J, 3] of the DeepMimic clips pybullet ships, and the body frame."""
    clips = {p.stem.removeprefix("humanoid3d_"): load(p) for p in deepmimic_clip_paths()}
    body = dedup.body_frame(next(iter(clips.values())).skeleton)
    return {k: m.positions() for k, m in clips.items()}, body


def _report(positions: dict, body, **kwargs):
    descs = {k: dedup.clip_descriptor(p, body) for k, p in positions.items()}
    hashes = {k: dedup.exact_hash(d, body) for k, d in descs.items()}
    return dedup.find_duplicates(descs, hashes, body=body, **kwargs)


def _yaw(angle: float):
    return rot.axis_angle_to_quat(np.array([0.0, angle, 0.0]))  # y is up in DeepMimic and BVH


def test_body_frame_finds_the_hips():
    pos, body = _deepmimic()
    skeleton = load(deepmimic_clip_paths()[0]).skeleton
    assert {skeleton.names[body.joints[body.left]], skeleton.names[body.joints[body.right]]} == {
        "left_hip", "right_hip"}
    assert body.joints == tuple(range(skeleton.num_joints))


def test_window_distance_is_rms_joint_distance():
    """Moving one non-hip joint by 10 cm vertically moves every window by 10 cm / sqrt(J)."""
    pos, body = _deepmimic()
    p = pos["dance_b"]
    moved = p.copy()
    moved[:, 4, 1] += 0.1  # the neck; hips, hence origin and heading, unchanged
    starts = dedup.window_starts(len(p))
    a = dedup.windows(dedup.clip_descriptor(p, body), body, starts)
    b = dedup.windows(dedup.clip_descriptor(moved, body), body, starts)
    np.testing.assert_allclose(np.linalg.norm(a - b, axis=1), 0.1 / np.sqrt(p.shape[1]), rtol=1e-4)


def test_canonical_windows_ignore_heading_and_position():
    pos, body = _deepmimic()
    p = pos["cartwheel"]
    moved = rot.quat_rotate(_yaw(2.3), p) + np.array([3.0, 0.2, -5.0])
    starts = dedup.window_starts(len(p))
    a = dedup.windows(dedup.clip_descriptor(p, body), body, starts)
    b = dedup.windows(dedup.clip_descriptor(moved, body), body, starts)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_different_motions_are_kept():
    pos, body = _deepmimic()
    report = _report(pos, body)  # all 15 clips: walk, run, jump, kick, flips, ...
    assert report.drop == {} and report.groups == [] and report.pairs == []


def test_exact_copy_is_caught_even_after_float_noise():
    pos, body = _deepmimic()
    rng = np.random.default_rng(0)
    copy = pos["jump"].copy()
    noisy = pos["jump"] + rng.normal(0, 1e-6, pos["jump"].shape)
    assert dedup.exact_hash(copy, body) == dedup.exact_hash(pos["jump"], body)
    assert dedup.exact_hash(copy, body) != dedup.exact_hash(pos["walk"], body)
    report = _report({"jump": pos["jump"], "walk": pos["walk"], "copy": copy, "reencoded": noisy}, body)
    assert report.drop == {"copy": "exact duplicate of jump", "reencoded": "exact duplicate of jump"}
    assert report.groups == [["jump", "copy", "reencoded"]]


def test_rotated_translated_copy_is_caught():
    pos, body = _deepmimic()
    moved = rot.quat_rotate(_yaw(-1.2), pos["spinkick"]) + np.array([-2.0, 0.05, 7.0])
    report = _report({"spinkick": pos["spinkick"], "walk": pos["walk"], "moved": moved}, body)
    assert report.drop == {"moved": "exact duplicate of spinkick"}


@pytest.mark.parametrize("kind", ["noise", "trim"])
def test_near_copy_is_caught(kind):
    pos, body = _deepmimic()
    src = pos["dance_b"]
    rng = np.random.default_rng(1)
    # 3 mm of Gaussian noise per coordinate (more than optical mocap's), or 5 frames cut off.
    copy = src + rng.normal(0, 3e-3, src.shape) if kind == "noise" else src[5:]
    clips = {"dance_a": pos["dance_a"], "dance_b": src, "copy": copy, "kick": pos["kick"]}
    report = _report(clips, body)
    assert list(report.drop) == ["copy"]
    assert report.drop["copy"].startswith("copy of dance_b (RMS ")
    assert report.groups == [["dance_b", "copy"]]
    (pair,) = report.pairs
    assert pair["kind"] == "copy" and pair["fraction"] >= dedup.COPY_FRACTION and pair["rms_cm"] < 1.2
    assert "copy" in pair["alike"]


def test_threshold_and_fraction_control_matching():
    pos, body = _deepmimic()
    src = pos["dance_b"]
    copy = src + np.random.default_rng(2).normal(0, 3e-3, src.shape)
    clips = {"dance_b": src, "copy": copy}
    assert _report(clips, body, copy_m=0.001).drop == {}  # noise RMS (~5 mm) above 1 mm
    half = np.concatenate([src[:70], pos["jump"][:70]])  # shorter; shares its first half with dance_b
    report = _report({"dance_b": src, "half": half}, body, copy_fraction=0.3)
    assert list(report.drop) == ["half"]
    # Half of it is in dance_b: not alike as a whole (kept), but near-identical (one group, one split).
    report = _report({"dance_b": src, "half": half}, body, min_fraction=0.3)
    assert report.drop == {} and report.groups == [["dance_b", "half"]]
    assert report.pairs[0]["kind"] == "overlap"
    assert _report({"dance_b": src, "half": half}, body, min_fraction=0.9).groups == []


def test_cross_split_duplicate_is_reported_and_moved():
    pos, body = _deepmimic()
    copy = pos["crawl"] + np.random.default_rng(3).normal(0, 2e-3, pos["crawl"].shape)
    clips = {"crawl": pos["crawl"], "walk": pos["walk"], "copy": copy, "jump": pos["jump"]}
    report = _report(clips, body)
    split_of = {"crawl": "train", "walk": "train", "copy": "test", "jump": "validation"}
    new, leakage = dedup.resolve_leakage(report.groups, split_of)
    assert new == {**split_of, "copy": "train"}
    assert split_of["copy"] == "test"  # input not modified
    assert leakage == [{"group": ["crawl", "copy"], "splits": {"crawl": "train", "copy": "test"},
                        "moved_to": "train", "moved": ["copy"]}]
    new, leakage = dedup.resolve_leakage(report.groups, split_of, into="test")
    assert new["crawl"] == "test" and leakage[0]["moved"] == ["crawl"]
    # A group inside one split is no leakage.
    assert dedup.resolve_leakage(report.groups, {**split_of, "copy": "train"})[1] == []


def test_mismatched_inputs_are_refused():
    pos, body = _deepmimic()
    desc = dedup.clip_descriptor(pos["walk"], body)
    with pytest.raises(ValueError, match="hashes name different clips"):
        dedup.find_duplicates({"walk": desc, "run": desc}, {"walk": "x"}, body=body)
    with pytest.raises(ValueError, match=r"\[T, 15, 3\]"):
        dedup.find_duplicates({"walk": desc, "cut": desc[:, :10]}, body=body)
    with pytest.raises(ValueError, match="positions must be"):
        dedup.clip_descriptor(pos["walk"][:, :, :2], body)


def _bandai_or_skip():
    if not BANDAI.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the Bandai-1 corpus is missing at {BANDAI}")
        pytest.skip(f"Bandai-1 corpus not found at {BANDAI} (a clone without ../shared)")


def test_bandai_styles_of_one_content_are_not_duplicates():
    """Two styles of one walk (4 cm RMS apart over 69% of windows) stay; a copy moved elsewhere
    and trimmed goes. On Bandai the static ``joint_Root`` is left out of the body."""
    _bandai_or_skip()
    motions = {s: read_bvh(BANDAI / f"dataset-1_walk_{s}_001.bvh", scale=0.01)
               for s in ("active", "masculinity")}
    body = dedup.body_frame(motions["active"].skeleton)
    names = motions["active"].skeleton.names
    assert 0 not in body.joints and {names[body.joints[body.left]], names[body.joints[body.right]]} == {
        "UpperLeg_L", "UpperLeg_R"}
    pos = {s: m.positions() for s, m in motions.items()}
    pos["copy"] = rot.quat_rotate(_yaw(0.7), pos["active"][3:]) + np.array([1.0, 0.0, 2.0])
    report = _report(pos, body)
    assert list(report.drop) == ["copy"] and report.drop["copy"].startswith("copy of active")


@functools.cache
def _takes(copies: int = 0):
    """4 actions x 5 takes (150 frames: 60 standing, the action, 50 standing; every take its own
    variation, every clip the same idle pose) and ``copies`` planted copies of each kind; descriptors
    of each clip as prepare makes them (resampled to 30 fps, FK)."""
    from motionjax.core.kinematics import forward_kinematics
    from motionjax.core.skeleton import deepmimic_humanoid
    from motionjax.data import synthetic, transforms

    sk = deepmimic_humanoid()
    body = dedup.body_frame(sk)
    descs = {}
    for m in synthetic.repeated_takes(4, 5, frames=150, idle=60, idle_end=50, variation=0.05, copies=copies):
        root, rots = transforms.resample(m.root_position, m.rotations, m.fps, 30.0)
        descs[m.name] = dedup.clip_descriptor(np.asarray(forward_kinematics(sk, rots, root)[0]), body)
    return descs, body


def _find(descs, body, **kwargs):
    hashes = {k: dedup.exact_hash(d, body) for k, d in descs.items()}
    return dedup.find_duplicates(descs, hashes, body=body, **kwargs)


def test_repeated_takes_are_kept_and_idle_is_no_evidence():
    descs, body = _takes()
    report = _find(descs, body)
    assert report.drop == {} and report.groups == [] and report.pairs == []
    # Counting the standing-still windows (as the old rule did) links every clip, across actions.
    counted = _find(descs, body, idle_m=0.0, copy_m=0.02, copy_fraction=0.5)
    assert len(counted.drop) == 19 and len(counted.groups) == 1
    assert {k[:9] for k in counted.drop} == {"action000", "action001", "action002", "action003"}


def test_planted_copies_are_dropped_exactly():
    descs, body = _takes(copies=2)
    report = _find(descs, body)
    planted = {k for k in descs if k.endswith("_copy")}
    assert len(planted) == 10 and set(report.drop) == planted
    for name, reason in report.drop.items():
        original = name.rsplit("_", 2)[0]
        kind = name.rsplit("_", 2)[1]
        assert reason.split(" (")[0] in (f"exact duplicate of {original}", f"copy of {original}",
                                         f"mirrored copy of {original}"), (name, reason)
        assert kind != "mirrored" or reason.startswith("mirrored copy of")
    # Every group is one take and its copies.
    assert all(len({g.rsplit("_", 2)[0] if g.endswith("_copy") else g for g in grp}) == 1
               for grp in report.groups)


def test_mirrored_windows_are_the_mirror_images():
    from motionjax.core.skeleton import deepmimic_humanoid
    from motionjax.data import synthetic, transforms

    sk = deepmimic_humanoid()
    body = dedup.body_frame(sk)
    root, rots = synthetic.synthetic_clip(sk, 1, frames=64)
    m_root, m_rots = transforms.mirror(sk, root, rots, transforms.mirror_frames(sk))
    from motionjax.core.kinematics import forward_kinematics
    a = dedup.clip_descriptor(np.asarray(forward_kinematics(sk, rots, root)[0]), body)
    b = dedup.clip_descriptor(np.asarray(forward_kinematics(sk, m_rots, m_root)[0]), body)
    starts = dedup.window_starts(64)
    wa, wb = dedup.windows(a, body, starts), dedup.windows(b, body, starts)
    np.testing.assert_allclose(dedup.mirror_windows(wa, body), wb, atol=1e-5)
    assert np.linalg.norm(wa - wb, axis=1).min() > 0.02  # the mirror image itself is another motion


def test_pruning_similar_takes_is_an_opt_in():
    descs, body = _takes()
    pruned = _find(descs, body, policy="prune", threshold_m=0.2)  # a radius above take-to-take variation
    assert pruned.drop and all(r.startswith("similar take to") for r in pruned.drop.values())
    with pytest.raises(ValueError, match="dedup policy"):
        _find(descs, body, policy="all")


def test_descriptors_spilled_to_disk_give_the_same_report(tmp_path):
    """Prepare spills each clip's descriptor to a :class:`~motionjax.data.records.ArrayFile` as it
    arrives: read back it is the same array (any dtype), and dedup over the file (a subset view, in
    another order; its window index in a scratch file beside it, gone afterwards) reports exactly
    what it reports over the in-memory arrays."""
    pos, body = _deepmimic()
    src = pos["dance_b"]
    clips = {"dance_a": pos["dance_a"], "walk": pos["walk"], "dance_b": src, "trim": src[5:],
             "kick": pos["kick"]}
    descs = {k: dedup.clip_descriptor(p, body) for k, p in clips.items()}
    spill = records.ArrayFile(tmp_path / "d.f32")
    for k in reversed(list(descs)):
        spill.append(k, descs[k])
    with pytest.raises(ValueError, match="twice"):
        spill.append("walk", descs["walk"])
    moments = np.random.default_rng(0).normal(size=(2, 7))  # float64, as prepare spills moments
    mixed = records.ArrayFile(tmp_path / "m.bin")
    mixed.append("m", moments)
    mixed.append("d", descs["walk"])
    assert mixed["m"].dtype == np.float64 and np.array_equal(mixed["m"], moments)
    assert mixed["d"].dtype == np.float32 and np.array_equal(mixed["d"], descs["walk"])
    mixed.close()
    spill.close()
    for k, d in descs.items():
        np.testing.assert_array_equal(spill[k], d)
    hashes = {k: dedup.exact_hash(d, body) for k, d in descs.items()}
    names = [k for k in descs if k != "walk"]
    want = dedup.find_duplicates({k: descs[k] for k in names}, {k: hashes[k] for k in names}, body=body)
    got = dedup.find_duplicates(spill.subset(names), {k: hashes[k] for k in names}, body=body)
    assert got.to_dict() == want.to_dict()
    assert list(got.drop) == ["trim"]
    # Without the PCA (more components than dimensions) the KD-tree holds the index rows themselves.
    unprojected = dedup.find_duplicates(spill.subset(names), {k: hashes[k] for k in names}, body=body,
                                        pca_dim=10_000)
    assert unprojected.drop == want.drop and unprojected.stats["pca_dim"] > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.f32", "m.bin"]
