"""Corrupted-frame cleaning (motionjax.data.clean) and anomaly injection (motionjax.data.anomalies):
detectors on hand-made arrays, injected defects found in synthetic clips, repairs against the clean
clip, prepare's report and spans; one check on Bandai-1."""
import dataclasses
import json

import numpy as np
import pytest

from motionjax.configs import base
from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import deepmimic_humanoid
from motionjax.data import anomalies, clean, prepare, records, synthetic
from motionjax.formats import Motion

TH = clean.Thresholds()
WINDOW = 16


def _about_y(angles):
    return rot.axis_angle_to_quat(np.asarray(angles, np.float64)[:, None] * np.array([0.0, 1.0, 0.0]))


# --------------------------------------------------------------------------------------------
# Detectors on hand-made arrays


def test_runs_and_defaults_match_the_config():
    assert clean.runs([0, 1, 1, 0, 1]) == [(1, 3), (4, 5)]
    assert clean.runs([1, 1]) == [(0, 2)] and clean.runs([0, 0]) == []
    assert dict(base.get_config().data.clean_limits) == dataclasses.asdict(TH)


def test_hemisphere_continuity_keeps_rotations_and_marks_flips():
    q = np.repeat(_about_y(np.linspace(0, 1, 6))[:, None], 2, axis=1)  # [6, 2, 4]
    bad = q.copy()
    bad[2:4, 1] *= -1  # joint 1 on the other hemisphere for frames 2, 3
    fixed, flips = clean.hemisphere_continuity(bad)
    np.testing.assert_allclose(fixed, q)
    assert np.argwhere(flips).tolist() == [[2, 1], [4, 1]]


def test_step_angles_are_the_rotation_between_frames():
    angles = np.array([0.0, 0.1, 0.3, 0.3 + np.pi])  # the last step is a 180° twist
    q = _about_y(angles)[:, None]
    q[2] *= -1  # the sign does not matter
    np.testing.assert_allclose(clean.step_angles(q)[:, 0], [0, 0.1, 0.2, np.pi], atol=1e-6)


def test_pop_measure_is_the_spike_on_a_curve_and_a_jump_is_not_a_pop():
    t = np.arange(30, dtype=np.float64) / 30
    pos = np.zeros((30, 1, 3))
    pos[:, 0, 0] = 1.5 * t + 2.0 * t**2 - 3.0 * t**3  # fast and accelerating: a cubic is exact on it
    pos[14:16, 0, 1] += 0.4  # a two-frame pop of 40 cm
    r = clean.pop_measure(pos)[:, 0]
    np.testing.assert_allclose(r[[14, 15]], 0.4, atol=1e-5)
    assert np.delete(r, [14, 15]).max() < 0.25  # the neighbours' cubics lean on the popped frames
    (d,) = clean._pops(pos, 0.25)
    assert (d.start, d.end, d.joint) == (14, 16, 0) and abs(d.measure - 0.4) < 1e-5
    assert all(type(v) is int for v in (d.start, d.end, d.joint))  # the report is JSON
    jump = pos.copy()
    jump[14:16, 0, 1] -= 0.4
    jump[15:, 0, 1] += 0.8  # a splice: far from the cubic across it, but near the motion after it
    assert clean.pop_measure(jump).max() < 0.02 and clean._pops(jump, 0.25) == []
    assert r[:2].max() == r[-2:].max() == 0  # spans need two frames either side
    assert clean._pops(pos[:5], 0.25) == [] and clean.pop_measure(pos[:3]).shape == (3, 1)


def test_teleport_measure_is_the_jump_over_a_walk():
    root = np.zeros((30, 3))
    root[:, 0] = 0.04 * np.arange(30)
    root[15:, 2] += 0.3  # a splice: the root jumps 30 cm sideways and stays
    m = clean.teleport_measure(root)
    assert abs(m[15] - 0.3) < 1e-9 and np.delete(m, 15).max() < 1e-9


def test_frozen_frames_ignore_joints_that_never_move():
    q = np.repeat(_about_y(0.01 * np.arange(20))[:, None], 3, axis=1)
    q[:, 2] = [1, 0, 0, 0]  # an end site: never rotates
    q[8:14] = q[7]  # frames 8..13 repeat frame 7
    root = np.zeros((20, 3))
    root[:, 0] = 0.01 * np.arange(20)
    root[8:14] = root[7]
    assert np.flatnonzero(clean.frozen_frames(root, q)).tolist() == list(range(8, 14))


def test_floor_heights_use_planted_frames():
    # A run: the lowest joint planted at 0 on half the frames (still), in flight at 0.2 m (moving).
    t = 40
    pos = np.zeros((t, 1, 3))
    flight = (np.arange(t) // 5) % 2 == 1
    pos[flight, 0, 1] = 0.2
    pos[:, 0, 0] = np.where(flight, 0.1 * np.arange(t), 0.0)  # feet move only in flight
    h = clean.floor_heights(pos, 1, 30.0)
    np.testing.assert_allclose(h[~flight], 0.0, atol=1e-9)


def test_fill_frames_interpolates_exactly_on_uniform_motion():
    angles = 0.05 * np.arange(12)
    q = _about_y(angles)[:, None]
    root = np.stack([0.1 * np.arange(12), np.zeros(12), np.zeros(12)], -1)
    bad = np.zeros(12, bool)
    bad[[0, 4, 5, 6]] = True  # one at the start (held), three inside (interpolated)
    broken_root, broken_q = root.copy(), q.copy()
    broken_root[bad], broken_q[bad] = np.nan, np.nan
    r, qq = clean.fill_frames(broken_root, broken_q, bad)
    np.testing.assert_allclose(r[1:], root[1:], atol=1e-9)
    np.testing.assert_allclose(r[0], root[1])
    np.testing.assert_allclose(np.abs((qq[1:] * q[1:]).sum(-1)), 1.0, atol=1e-9)


def test_plan_repairs_short_cuts_long_and_drops_what_is_left():
    frames = 100
    short = clean.Defect("pop", 10, 12, 0.5)
    long_ = clean.Defect("frozen", 40, 60, 20)
    repair, spans, dropped = clean.plan([short, long_], frames, TH, mode="repair", window=WINDOW)
    assert np.flatnonzero(repair).tolist() == [10, 11] and spans == [(0, 40), (60, 100)] and not dropped
    assert (short.action, long_.action) == ("repair", "cut")
    at_edge = clean.Defect("pop", 0, 2, 0.5)  # no good frame before it: cut, not extrapolated
    _, spans, _ = clean.plan([at_edge], frames, TH, mode="repair", window=WINDOW)
    assert spans == [(2, 100)] and at_edge.action == "cut"
    splice = clean.Defect("teleport", 50, 51, 0.3, cut_point=True)  # one frame, but never undone
    repair, spans, _ = clean.plan([splice], frames, TH, mode="repair", window=WINDOW)
    assert not repair.any() and spans == [(0, 50), (51, 100)]
    most = clean.Defect("floor", 10, 90, -0.3)
    _, spans, dropped = clean.plan([most], frames, TH, mode="repair", window=WINDOW)
    assert spans == [] and "kept 0 of 100" in dropped  # the 10-frame ends hold no window
    report = clean.Defect("floor", 10, 90, -0.3)
    repair, spans, dropped = clean.plan([report], frames, TH, mode="report", window=WINDOW)
    assert spans == [(0, frames)] and not dropped and report.action == "report"


# --------------------------------------------------------------------------------------------
# Injected into synthetic clips


def _on_floor(sk, i, frames=180):
    """Procedural clip ``i`` on the DeepMimic body at 30 fps, lowered so that its lowest joint touches
    the floor every frame (the procedural limbs swing freely; a body stands on something)."""
    root, rots = synthetic.synthetic_clip(sk, i, seed=5, frames=frames)
    low = np.asarray(forward_kinematics(sk, rots, root)[0])[..., sk.up_axis].min(-1)
    root = root.copy()
    root[:, sk.up_axis] -= low
    return Motion(sk, 30.0, root, rots, name=f"clip{i}")


@pytest.fixture(scope="module")
def motion():
    """A smooth procedural clip, 6 s at 30 fps, feet on the floor."""
    return _on_floor(deepmimic_humanoid(), 3)


def _settings(mode="repair"):
    return prepare.Settings(window=WINDOW, clean=mode, dedup=False)


def _fk(sk, root, rots):
    return np.asarray(forward_kinematics(sk, rots, root)[0])


def test_a_clean_clip_is_left_alone(motion):
    out = prepare.convert(motion, _settings())
    rep = out["cleaning"]
    assert rep["defects"] == [] and rep["spans"] == [[0, 180]] and out["spans"] == [(0, 180)]
    rec = records.decode_record(out["record"])
    np.testing.assert_allclose(rec["root_position"], motion.root_position, atol=1e-6)


@pytest.mark.parametrize("kind", [k for k in anomalies.KINDS if k != "sign_flip"])
def test_every_injected_kind_is_found_where_it_was_put(motion, kind):
    rng = np.random.default_rng(1)
    # The smallest pop (0.4 m) is within a fast joint's frame-to-frame motion of the 0.35 m bound: its
    # recall is measured (benchmarks/bench_clean.py), not asserted.
    for magnitude in anomalies.MAGNITUDES[kind][kind == "pop":]:
        bad, truth = anomalies.inject(motion, kind, magnitude, rng)
        rep = prepare.convert(bad, _settings())["cleaning"]
        want = anomalies.DETECTOR[kind]
        (s, e), = truth
        hit = [d for d in rep["defects"]
               if d["kind"] == want and d["frames"][0] < e + 2 and s < d["frames"][1] + 2]
        assert hit, (kind, magnitude, truth, rep["defects"])
        # Nothing flagged away from the defect.
        assert all(d["frames"][0] < e + 3 and s < d["frames"][1] + 3 for d in rep["defects"]), rep["defects"]


def test_sign_flips_are_undone_without_changing_the_motion(motion):
    bad, cells = anomalies.inject(motion, "sign_flip", 50, np.random.default_rng(2))
    assert len(cells) == 50
    out = prepare.convert(bad, _settings())
    rec = records.decode_record(out["record"])
    assert out["cleaning"]["defects"] == [] and out["cleaning"]["sign_flips"] >= 50
    np.testing.assert_allclose(_fk(motion.skeleton, rec["root_position"], rec["rotations"]),
                               _fk(motion.skeleton, motion.root_position, motion.rotations), atol=1e-5)
    assert ((rec["rotations"][1:] * rec["rotations"][:-1]).sum(-1) >= 0).all()


@pytest.mark.parametrize("kind, magnitude", [("pop", 0.6), ("nonfinite", 3)])
def test_short_defects_are_repaired_close_to_the_original(motion, kind, magnitude):
    bad, [(s, e)] = anomalies.inject(motion, kind, magnitude, np.random.default_rng(3))
    out = prepare.convert(bad, _settings())
    assert out["cleaning"]["repaired"] >= e - s and out["cleaning"]["cut"] == 0
    rec = records.decode_record(out["record"])
    got = _fk(motion.skeleton, rec["root_position"], rec["rotations"])
    ref = _fk(motion.skeleton, motion.root_position, motion.rotations)
    err = np.linalg.norm(got - ref, axis=-1).mean(-1)  # [T] MPJPE per frame
    assert err[s:e].max() < 0.01  # within 1 cm of the clean clip where it was corrupted
    assert np.delete(err, np.arange(s - 1, e + 1)).max() < 1e-5  # the rest untouched


def test_report_mode_lists_but_changes_nothing(motion):
    bad, _ = anomalies.inject(motion, "frozen", 30, np.random.default_rng(4))
    out = prepare.convert(bad, _settings("report"))
    # The held pose, and the root's jump back to where the take went on without it.
    assert [(d["kind"], d["action"]) for d in out["cleaning"]["defects"]] == [("frozen", "report"),
                                                                              ("teleport", "report")]
    assert out["spans"] == [(0, 180)]
    rec = records.decode_record(out["record"])
    np.testing.assert_allclose(rec["root_position"], bad.root_position)


def test_prepare_cuts_long_defects_out_of_the_splits_and_reports_them(tmp_path, motion):
    sk = motion.skeleton
    good = [_on_floor(sk, i) for i in range(4)]
    frozen, [(s, e)] = anomalies.inject(good[1], "frozen", 40, np.random.default_rng(5))
    nan, _ = anomalies.inject(good[2], "nonfinite", 3, np.random.default_rng(6))
    ruined, _ = anomalies.inject(good[3], "float", 0.5, np.random.default_rng(7))
    ruined.root_position[20:170, 1] += 1.0  # most of the clip floats: too little is left
    clips = [good[0], frozen, nan, ruined]
    splits = {"train": "rest", "validation": "tail:0.2"}
    info = prepare.write_dataset(clips, tmp_path / "out", window=WINDOW, splits=tuple(splits.items()),
                                 dedup=False, progress=False)
    doc = json.loads((tmp_path / "out" / prepare.CLEANING).read_text())
    by_clip = {c["clip"]: c for c in doc["clips"]}
    assert set(by_clip) >= {"clip1", "clip2", "clip3"} and not by_clip.get("clip0", {}).get("defects")
    frozen_report = by_clip["clip1"]["defects"]
    assert [(d["kind"], d["frames"], d["action"]) for d in frozen_report] == [
        ("frozen", [s, e], "cut"), ("teleport", [e, e + 1], "cut")]  # the hold, the jump after it
    assert by_clip["clip2"]["repaired"] == 3 and by_clip["clip2"]["defects"][0]["action"] == "repair"
    assert by_clip["clip3"]["dropped"]
    # The frozen frames are in no split; the dropped clip is skipped with its reason; NaN frames repaired.
    covered = {f for segs in info.splits.values() for c, b, en in segs if c == 1 for f in range(b, en)}
    cut = 144  # the validation tail: the last 20% of 180 frames
    pieces = [(0, s), (e + 1, cut), (max(e + 1, cut), 180)]  # each split's part of each kept span
    assert covered == {f for b, en in pieces if en - b >= WINDOW for f in range(b, en)}
    assert [x["reason"] for x in info.skipped if x["path"] == "clip3"][0].startswith("cleaning kept")
    assert all(c != 3 for segs in info.splits.values() for c, _, _ in segs)
    assert sum(n for n, _ in info.train_windows) == sum(len(range(b, en - WINDOW + 1))
                                                         for _, b, en in info.splits["train"])
    line = prepare.summary_table(info)
    assert "cleaning (repair): 3 clips flagged" in line and "1 clips dropped" in line
    assert info.cleaning["kinds"]["frozen"]["ranges"] == 1
    off = prepare.write_dataset(clips[:2], tmp_path / "off", window=WINDOW, splits=tuple(splits.items()),
                                dedup=False, progress=False, clean="off")
    assert off.cleaning is None and not (tmp_path / "off" / prepare.CLEANING).exists()
    assert "clean" not in json.loads((tmp_path / "off" / "index.json").read_text())["settings"]


def test_injections_are_reproducible_and_leave_the_input_alone(motion):
    before = motion.rotations.copy()
    a, ra = anomalies.inject(motion, "twist", 180.0, np.random.default_rng(8))
    b, rb = anomalies.inject(motion, "twist", 180.0, np.random.default_rng(8))
    assert ra == rb and np.array_equal(a.rotations, b.rotations)
    np.testing.assert_array_equal(motion.rotations, before)
    (s, e), = ra
    steps = clean.step_angles(a.rotations).max(-1)
    assert steps[s] > np.radians(170) and steps[e] > np.radians(170)
    with pytest.raises(ValueError, match="unknown anomaly"):
        anomalies.inject(motion, "wobble", 1.0, np.random.default_rng(0))


# --------------------------------------------------------------------------------------------
# Bandai-1 (skipped in a clone without ../shared)


def test_bandai_clips_are_clean_and_a_pop_in_one_is_found():
    from test_corpus import _bandai_or_skip

    from benchmarks import clean_quality

    root = _bandai_or_skip()
    paths = sorted((root / "data").glob("*.bvh"))[::12]  # 15 clips of every content
    clips = clean_quality.load_clips(paths)
    run = clean_quality.untouched(clips, TH, WINDOW)
    assert run["flagged_frames"] == 0, run["flagged_clips"]
    m = max(clips, key=lambda c: c.num_frames)
    bad, [(s, e)] = anomalies.inject(m, "pop", 0.6, np.random.default_rng(0))
    rep = prepare.convert(bad, _settings())["cleaning"]
    assert any(d["kind"] == "pop" and d["frames"][0] <= s and e <= d["frames"][1] for d in rep["defects"])


def test_settings_from_configs_old_and_bad(tmp_path):
    from motionjax.efficiency import trained

    config = base.get_config()
    cfg = config.data
    assert prepare.Settings.from_config(cfg).clean == "repair"
    old = json.loads(config.to_json_best_effort())  # a run's config.json from before cleaning
    for key in ("clean", "clean_limits", "copy_threshold", "dedup_policy"):
        del old["data"][key]
    (tmp_path / "config.json").write_text(json.dumps(old))
    settings = prepare.Settings.from_config(trained.load_config(tmp_path).data)
    assert settings.clean == "off" and "clean" not in settings.to_json()
    assert "copy_threshold" not in settings.to_json()
    cfg.clean_limits.pop_m = -1.0
    with pytest.raises(ValueError, match=r"clean_limits: pop_m=-1.0"):
        prepare.Settings.from_config(cfg)
