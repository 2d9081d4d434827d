"""Real-corpus ingestion: units, root folding, per-joint channels, performers, trees, labels, split
rules, dedup and leakage at prepare time, and Bandai-1 itself (when ../shared has it)."""
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import Skeleton, deepmimic_humanoid
from motionjax.data import corpus, prepare
from motionjax.data.info import INDEX, load_info
from motionjax.data.pipeline import ClipSource
from motionjax.formats import Motion, deepmimic_clip_paths, load, read_bvh, write_bvh

BANDAI = Path(__file__).resolve().parents[2] / "shared" / "data" / "bandai-namco-1"
SPLITS = {"train": "rest", "validation": "tail:0.2"}


def _bandai_or_skip():
    if not (BANDAI / "data").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{BANDAI} is missing: CI must have the shared Bandai-1 corpus")
        pytest.skip(f"{BANDAI} not present (a user's clone has no ../shared)")
    return BANDAI


def _clip(i=9):
    return load(deepmimic_clip_paths()[i])  # 9: punch


def _fk(m: Motion):
    return forward_kinematics(m.skeleton, m.rotations, m.root_position, m.offsets)[0]


def test_units_are_detected_from_bone_lengths():
    sk = deepmimic_humanoid()
    for unit, scale in corpus.UNITS.items():
        assert corpus.detect_units(sk.replace(offsets=sk.offsets / scale)) == unit
    # A body 1.6x smaller or larger than the DeepMimic humanoid still reads as metres.
    assert corpus.detect_units(sk.replace(offsets=sk.offsets / 1.6)) == "m"
    assert corpus.detect_units(sk.replace(offsets=sk.offsets * 1.4)) == "m"


def _with_placeholder_root(m: Motion, root_moves: bool) -> Motion:
    """A BVH-style copy: a root joint above the body; the body's translation in the child's
    position channels (split with the root when ``root_moves``)."""
    sk = m.skeleton
    t = m.num_frames
    names = ["world", *sk.names]
    parents = [-1, 0, *[p + 1 for p in sk.parents[1:]]]
    offsets = np.concatenate([np.zeros((1, 3)), sk.offsets])
    axes = np.concatenate([np.zeros((1, 3)), sk.axes])
    skeleton = Skeleton(names, parents, offsets, ["ball", *sk.kinds], axes, None)
    root_pos = np.zeros((t, 3))
    if root_moves:
        root_pos[:, 2] = np.linspace(0, 1, t)
    per_frame = np.broadcast_to(offsets, (t, *offsets.shape)).copy()
    per_frame[:, 1] = m.root_position - root_pos
    rotations = np.concatenate([rot.identity_quat((t, 1), np.float64, np), m.rotations], axis=1)
    return Motion(skeleton, m.fps, root_pos, rotations, offsets=per_frame, name=m.name)


@pytest.mark.parametrize("root_moves", [False, True])
def test_a_placeholder_root_is_folded_and_fk_is_unchanged(root_moves):
    m = _clip()
    raw = _with_placeholder_root(m, root_moves)
    folded, info = corpus.conform(raw)
    assert folded.skeleton.names == m.skeleton.names and info["units"] == "m"
    assert any("folded" in n and "'world'" in n for n in info["notes"])
    np.testing.assert_allclose(_fk(folded), _fk(raw)[:, 1:], atol=1e-9)
    np.testing.assert_allclose(_fk(folded), _fk(m), atol=1e-9)


def test_a_moving_root_with_a_rigid_child_is_not_folded():
    m = _clip()
    sk = m.skeleton
    # The root moves, and its only child has no position channels: the root is a real joint.
    offsets = np.array([[0, 0, 0], [0, 0.3, 0]])
    chain = Skeleton(["hips", "spine"], [-1, 0], offsets, ["ball", "ball"], None, None)
    moving = Motion(chain, 30.0, m.root_position, m.rotations[:, :2], name="chain")
    assert corpus.fold_static_root(moving)[1] is None
    assert sk.num_joints == corpus.conform(m)[0].skeleton.num_joints


def test_per_joint_position_channels_become_bone_offsets():
    m = _clip()
    t, j = m.num_frames, m.skeleton.num_joints
    offsets = np.broadcast_to(m.skeleton.offsets, (t, j, 3)).copy()
    knee = m.skeleton.index("right_knee")
    offsets[:, knee] = [0.0, -0.5, 0.0]                       # constant, unlike the rest OFFSET
    elbow = m.skeleton.index("left_elbow")
    offsets[:, elbow, 1] += 0.01 * np.sin(np.arange(t))        # a stretching bone
    baked, info = corpus.conform(dataclasses.replace(m, offsets=offsets))
    assert baked.offsets is None
    np.testing.assert_allclose(baked.skeleton.offsets[knee], [0.0, -0.5, 0.0])
    assert any("'left_elbow'" in n and "vary" in n for n in info["notes"])
    assert not any("'right_knee'" in n for n in info["notes"])
    # Constant channels are exact: FK equals the per-frame FK away from the stretching bone's subtree.
    moved = [elbow, *[k for k in range(j) if m.skeleton.ancestor_mask[k, elbow]]]
    keep = [k for k in range(j) if k not in moved]
    np.testing.assert_allclose(_fk(baked)[:, keep], _fk(dataclasses.replace(m, offsets=offsets))[:, keep],
                               atol=1e-9)


def _write(path, m: Motion, scale=1.0, labels=None):
    write_bvh(path, m, scale=scale)
    if labels is not None:
        path.with_suffix(".json").write_text(json.dumps(labels))


def test_performers_share_a_skeleton_and_keep_their_bones(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    base = _clip()
    for i, factor in enumerate((0.9, 1.0, 1.1)):  # three performers of one tree, written in cm
        sk = base.skeleton.replace(offsets=base.skeleton.offsets * factor)
        _write(src / f"take_{i}.bvh", dataclasses.replace(base, skeleton=sk, root_position=base.root_position
                                                           * factor, name=f"take_{i}"), scale=0.01)
    info = prepare.prepare(src, tmp_path / "out", window=32, splits=SPLITS, progress=False, workers=0,
                           dedup=False)
    assert info.names == ("take_0", "take_1", "take_2") and not info.skipped
    doc = json.loads((tmp_path / "out" / INDEX).read_text())
    assert doc["detected"]["units"] == {"cm": 3}
    order = [base.skeleton.index(n) for n in info.skeleton.names]  # BVH writes joints depth-first
    src_clips = ClipSource(info)
    for i, factor in enumerate((0.9, 1.0, 1.1)):
        rec = src_clips[i]
        np.testing.assert_allclose(rec["offsets"][1:], base.skeleton.offsets[order][1:] * factor, atol=1e-5)
    # The dataset skeleton (the training body) has the median bones.
    np.testing.assert_allclose(info.skeleton.offsets[1:], base.skeleton.offsets[order][1:], atol=1e-5)


def test_a_clip_on_another_tree_is_skipped_whatever_the_file_order(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in deepmimic_clip_paths()[8:11]:
        (src / p.name).write_text(p.read_text())
    sk = deepmimic_humanoid()
    keep = [0, 1, 2, 3]  # root, chest, hips: a different tree
    other = Skeleton([sk.names[k] for k in keep], [-1, 0, 0, 0], sk.offsets[keep], ["ball"] * 4, None, None)
    m = _clip()
    first = Motion(other, 30.0, m.root_position, m.rotations[:, keep], name="aaa_first")
    _write(src / "aaa_first.bvh", first)
    info = prepare.prepare(src, tmp_path / "out", window=32, splits=SPLITS, progress=False, workers=0)
    kept = {info.names[c] for segs in info.splits.values() for c, _, _ in segs}
    assert kept == {p.stem for p in deepmimic_clip_paths()[8:11]}
    (reason,) = [s["reason"] for s in info.skipped if "aaa_first" in s["path"]]
    assert "tree differs" in reason and "4 vs 15 joints" in reason
    groups = r"2 different skeleton trees.*3 clips on 15 joints.*1 clips on 4 joints"
    with pytest.raises(ValueError, match=groups):
        prepare.prepare(src, tmp_path / "strict", window=32, splits=SPLITS, progress=False, workers=0,
                        strict=True)


def test_split_rules_partition_clips_and_stratify():
    names = [f"{c}_{s}_{i}" for c in ("walk", "run", "jump") for s in ("happy", "sad") for i in range(5)]
    labels = [{"content": n.split("_")[0], "style": n.split("_")[1]} for n in names]
    rules = corpus.parse_rules({"train": "rest", "validation": "stratified:content:0.2",
                                "test": "stratified:content:0.2:seed=1", "extra": "label:style=sad"})
    splits = corpus.assign_clips(rules, names, labels)
    assert len(splits) == len(names)  # every clip in exactly one split
    for content in ("walk", "run", "jump"):
        of = [s for s, lab in zip(splits, labels, strict=True) if lab["content"] == content]
        assert of.count("validation") == 2 and of.count("test") == 2  # round(0.2 * 10) each
    assert all(lab["style"] == "sad" for s, lab in zip(splits, labels, strict=True) if s == "extra")
    assert splits == corpus.assign_clips(rules, names, labels)  # seeded: deterministic
    tail = corpus.parse_rules({"train": "rest", "val": "tail:0.25", "test": "pattern:jump_*"})
    segs = corpus.segments(tail, corpus.assign_clips(tail, names, labels), [100] * len(names))
    assert {names[c].split("_")[0] for c, _, _ in segs["test"]} == {"jump"}
    assert all((b, e) == (0, 75) for _, b, e in segs["train"])
    assert all((b, e) == (75, 100) for _, b, e in segs["val"])
    for bad, key in (({"train": "rest", "v": "tail:2"}, "splits.v"), ({"a": "clips:x"}, "exactly one"),
                     ({"train": "rest", "v": "stratified:content"}, "splits.v")):
        with pytest.raises(ValueError, match=key):
            corpus.parse_rules(bad)


def test_held_out_contents_never_reach_training():
    """The OOD protocol (motionjax/configs/base.py BANDAI_OOD): whole contents held out before the stratified
    splits draw; a near-identical group that straddles contents goes whole to the held-out split."""
    contents = ("walk", "run", "bow", "guide", "kick", "slash")
    names = [f"{c}_{s}_{i}" for c in contents for s in ("happy", "sad", "old") for i in range(5)]
    labels = [{"content": n.split("_")[0]} for n in names]
    rules = corpus.parse_rules({"train": "rest", "ood_validation": "label:content=guide,kick",
                                "ood_test": "label:content=bow, slash",
                                "validation": "stratified:content:0.2", "test": "stratified:content:0.2"})
    assert rules["ood_test"].args == ("content", ("bow", "slash"))
    group = [names.index("walk_sad_1"), names.index("guide_old_2")]  # alike clips of two contents
    splits = corpus.assign_clips(rules, names, labels, [group])
    of = lambda i: labels[i]["content"]
    assert {of(i) for i, s in enumerate(splits) if s == "ood_validation"} == {"guide", "kick", "walk"}
    assert {of(i) for i, s in enumerate(splits) if s == "ood_test"} == {"bow", "slash"}
    assert splits[group[0]] == splits[group[1]] == "ood_validation"
    for split in ("train", "validation", "test"):  # no held-out content anywhere in distribution
        assert not {of(i) for i, s in enumerate(splits) if s == split} & {"guide", "kick", "bow", "slash"}
    for content in ("walk", "run"):  # the stratified quotas count only contents left to draw from
        of_content = [s for i, s in enumerate(splits) if of(i) == content]
        assert of_content.count("validation") == 3 and of_content.count("test") == 3
    segs = corpus.segments(rules, splits, [100] * len(names))
    clips = [c for v in segs.values() for c, _, _ in v]
    assert sorted(clips) == list(range(len(names)))  # every clip in exactly one split, whole


def test_labels_come_from_sidecars_with_names(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "content_label.txt").write_text("dataset-1_walk\ndataset-1_run\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bvh").write_text("")
    (data / "a.json").write_text('{"content": 1, "take": "x"}')
    assert corpus.read_labels(data / "a.bvh") == {"content": "run", "take": "x"}
    assert corpus.read_labels(data / "b.bvh") == {}
    (data / "a.json").write_text('{"content": 7}')
    with pytest.raises(ValueError, match="content id 7"):
        corpus.read_labels(data / "a.bvh")


def test_duplicates_are_dropped_and_cross_split_ones_reported(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in (8, 9):  # kick, punch (as BVH, like the copies: one joint order)
        _write(src / f"{_clip(i).name}.bvh", _clip(i))
    punch = _clip(9)
    rng = np.random.default_rng(0)
    _write(src / "punch_copy.bvh", dataclasses.replace(punch, name="punch_copy"))
    jitter = rng.normal(0, 0.003, (punch.num_frames, 3))
    noisy = dataclasses.replace(punch, root_position=punch.root_position + jitter, name="zz_punch_noisy")
    _write(src / "zz_punch_noisy.bvh", noisy)
    splits = {"train": "rest", "test": "clips:zz_punch_noisy"}
    info = prepare.prepare(src, tmp_path / "out", window=32, splits=splits, progress=False, workers=0)
    reasons = {Path(s["path"]).stem: s["reason"] for s in info.skipped}
    assert reasons["punch_copy"].startswith("exact duplicate of")
    assert reasons["zz_punch_noisy"].startswith("copy of humanoid3d_punch")
    doc = json.loads((tmp_path / "out" / INDEX).read_text())
    # The rule that names a copy takes its whole group: the kept punch goes to test with it, at
    # assignment time, so nothing leaks and nothing moves afterwards.
    assert doc["leakage"] == [] and doc["dedup"]["moved"] == 0
    (group,) = doc["duplicate_groups"]
    assert set(group) == {"humanoid3d_punch", "punch_copy", "zz_punch_noisy"}
    split_of = {info.names[c]: k for k, segs in info.splits.items() for c, _, _ in segs}
    assert split_of == {"humanoid3d_kick": "train", "humanoid3d_punch": "test"}
    assert doc["dedup"]["dropped"] == {"exact duplicate": 1, "copy": 1}
    assert "dedup (copies" in prepare.summary_table(info)


def test_prepared_data_is_never_destroyed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in deepmimic_clip_paths()[8:10]:
        (src / p.name).write_text(p.read_text())
    out = tmp_path / "out"
    info = prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(prepare.PreparedElsewhere, match="window: 32 there, 512 asked"):
        prepare.prepare(src, out, window=512, splits=SPLITS, progress=False, workers=0)
    with pytest.raises(ValueError, match="512-frame window"):  # a forced rebuild that fails
        prepare.prepare(src, out, window=512, splits=SPLITS, progress=False, workers=0, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert load_info(out).names == info.names
    # A damaged shard is noticed on the next prepare and rebuilt from the sources.
    shard = Path(info.shard_paths()[0])
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "CRC-32" in prepare.verify_shards(out)[0]
    prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0)
    assert prepare.verify_shards(out) == [] and shard.read_bytes() == before[shard.name]


@pytest.fixture(scope="module")
def bandai(tmp_path_factory):
    root = _bandai_or_skip()
    splits = {"train": "rest", "validation": "stratified:content:0.1", "test": "stratified:content:0.1"}
    return prepare.prepare(str(root / "data" / "*.bvh"), tmp_path_factory.mktemp("bandai"), window=32,
                           splits=splits, progress=False, workers=2)


def test_bandai_every_clip_is_kept_in_metres_with_labels(bandai):
    assert len(bandai.names) == 174 and not bandai.skipped
    assert bandai.skeleton.names[0] == "Hips" and bandai.skeleton.num_joints == 26
    kept = [c for segs in bandai.splits.values() for c, _, _ in segs]
    assert sorted(kept) == list(range(174))  # no clip in two splits, none lost
    contents = {lab["content"] for lab in bandai.labels}
    assert {"walk", "bow", "dance-short"} <= contents and all(lab["style"] for lab in bandai.labels)
    test_contents = {bandai.labels[c]["content"] for c, _, _ in bandai.splits["test"]}
    assert len(test_contents) >= 10  # stratified: most contents have a test clip


def test_bandai_prepared_fk_equals_raw_bvh(bandai):
    i = bandai.names.index("dataset-1_dash_normal_001")  # a clip whose joint_Root moves
    raw = read_bvh(BANDAI / "data" / f"{bandai.names[i]}.bvh")
    expected = _fk(raw)[:, 1:] * 0.01  # centimetres; joint_Root folded away
    rec = ClipSource(bandai)[i]
    pos = forward_kinematics(bandai.skeleton, rec["rotations"].astype(np.float64),
                             rec["root_position"].astype(np.float64), rec["offsets"].astype(np.float64))[0]
    np.testing.assert_allclose(pos, expected, atol=1e-5)


@pytest.mark.slow
def test_workers_that_die_at_start_up_raise_instead_of_hanging(tmp_path):
    # Spawned workers re-import __main__: a script preparing data at import time, without a
    # `__main__` guard, kills every worker at start-up. multiprocessing.Pool respawned them forever.
    import subprocess
    import sys
    script = tmp_path / "unguarded.py"
    script.write_text("from motionjax.data import prepare\n"
                      f"prepare.prepare(None, {str(tmp_path / 'out')!r}, workers=2, progress=False)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "if __name__ == '__main__':" in proc.stderr and "RuntimeError" in proc.stderr, proc.stderr[-2000:]


def test_groups_share_a_split_and_splits_keep_their_fractions():
    rng = np.random.default_rng(0)
    n = 300
    names = [f"c{i:03d}" for i in range(n)]
    labels = [{"content": f"a{int(rng.integers(6))}"} for _ in range(n)]
    order = rng.permutation(n)
    groups, at = [], 0
    while at < 0.5 * n:  # half of the clips in groups of 2-8 (mostly of one content, some mixed)
        size = int(rng.integers(2, 9))
        groups.append(sorted(int(i) for i in order[at:at + size]))
        at += size
    rules = corpus.parse_rules({"train": "rest", "validation": "stratified:content:0.1",
                                "test": "stratified:content:0.1"})
    out = corpus.assign_clips(rules, names, labels, groups)
    for g in groups:
        assert len({out[i] for i in g}) == 1, g
    for split, fraction in (("validation", 0.1), ("test", 0.1), ("train", 0.8)):
        assert abs(out.count(split) / n - fraction) <= 0.02, (split, out.count(split))
    assert corpus.assign_clips(rules, names, labels) == corpus.assign_clips(rules, names, labels, [])
