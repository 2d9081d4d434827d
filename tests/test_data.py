"""Data preparation, synthetic corpus and window transforms, checked against independent references:
forward kinematics (rigid motions, mirror images), direct numpy statistics, exact interpolation."""
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import deepmimic_humanoid, smpl_like
from motionjax.data import prepare, records, stats, synthetic, transforms
from motionjax.data.info import INDEX
from motionjax.formats import deepmimic_clip_paths, read_deepmimic

WINDOW = 32


@pytest.fixture(scope="module")
def clip():
    """The cartwheel at 30 fps (root flips through every orientation: a hard case)."""
    m = read_deepmimic(deepmimic_clip_paths()[1])
    root, rots = transforms.resample(m.root_position, m.rotations, m.fps, 30.0)
    return m.skeleton, root, rots


def _windows(root, rots, starts, t=WINDOW):
    idx = np.asarray(starts)[:, None] + np.arange(t)
    return root[idx], rots[idx]


def _same_rotation(a, b):
    return np.abs(np.abs(np.sum(a * b, axis=-1)) - 1)  # 0 iff a = ±b


def test_resample_keeps_samples_and_interpolates_exactly():
    m = read_deepmimic(deepmimic_clip_paths()[1])  # ~60 fps (frame time 0.0166667 s): call it 60
    root, rots = transforms.resample(m.root_position, m.rotations, 60.0, 30.0)
    assert root.shape[0] == (m.num_frames - 1) // 2 + 1
    np.testing.assert_allclose(root, m.root_position[::2], atol=1e-12)  # every other frame, exactly
    assert _same_rotation(rots, m.rotations[::2]).max() < 1e-9
    # Halfway between two frames, the root is their mean and the rotation their slerp midpoint.
    up, _ = transforms.resample(m.root_position[:2], m.rotations[:2], 1.0, 2.0)
    np.testing.assert_allclose(up[1], m.root_position[:2].mean(0))


def test_denormalize_inverts_normalize(clip):
    skel, root, rots = clip
    r, q = _windows(root, rots, [0, 17, 40])
    f = features.feature_dim(skel)
    mean, std = np.linspace(-1, 1, f), np.linspace(0.5, 2, f)
    x, yaw, origin = transforms.normalize(skel, r, q, mean, std)
    chunked = transforms.chunk(x, 8)
    assert chunked.shape == (3, 4, 8, features.feature_dim(skel))
    cr, cq = transforms.denormalize(skel, transforms.unchunk(chunked), mean, std)
    wr, wq = transforms.uncanonicalize(cr, cq, yaw, origin)
    np.testing.assert_allclose(wr, r, atol=1e-5)
    assert _same_rotation(wq, q).max() < 1e-5


def test_heading_canonicalization_moves_fk_by_a_rigid_yaw(clip):
    skel, root, rots = clip
    up = skel.up_axis
    r, q = _windows(root, rots, [5, 30])
    cr, cq, _, _ = transforms.canonicalize(skel, r, q)
    fk_before, fk_after = forward_kinematics(skel, q, r)[0], forward_kinematics(skel, cq, cr)[0]
    for before, after, crot in zip(fk_before, fk_after, cq, strict=True):
        # Vertical: one constant shift. Horizontal: one proper 2D rotation + translation (Kabsch).
        dy = after[..., up] - before[..., up]
        np.testing.assert_allclose(dy, dy.flat[0], atol=1e-5)
        h = [a for a in range(3) if a != up]
        p, p2 = before[..., h].reshape(-1, 2), after[..., h].reshape(-1, 2)
        p, p2 = p - p.mean(0), p2 - p2.mean(0)
        u, _, vt = np.linalg.svd(p.T @ p2)
        rmat = (u @ vt).T
        assert np.linalg.det(rmat) > 0
        np.testing.assert_allclose(p @ rmat.T, p2, atol=1e-5)
        # The window starts at the ground origin, facing the reference heading, on the floor.
        np.testing.assert_allclose(np.delete(after[0, 0], up), 0, atol=1e-6)
        assert _same_rotation(transforms.heading(skel, crot[0, 0]), np.array([1.0, 0, 0, 0])) < 1e-6
        assert abs(after[..., up].min()) < 1e-6


def test_retargeting_scales_the_body_uniformly(clip):
    skel, root, rots = clip
    r, q = _windows(root, rots, [12])
    r1, q1, _, _ = transforms.canonicalize(skel, r, q, floor=False)
    r2, q2, _, _ = transforms.canonicalize(skel, r, q, floor=False, scale=1.5)
    np.testing.assert_allclose(r2, 1.5 * r1, atol=1e-6)
    np.testing.assert_array_equal(q2, q1)
    r3, q3, _, _ = transforms.canonicalize(skel, r, q, scale=1.5)  # the scaled body stands on the floor
    pos = forward_kinematics(skel, q3, r3, skel.offsets * 1.5)[0]
    assert abs(pos[..., skel.up_axis].min()) < 1e-6
    assert transforms.rest_height(skel) > 0.5  # standing root height of the DeepMimic body (m)


def test_mirror_is_a_reflection_of_fk_and_an_involution(clip):
    skel, root, rots = clip
    r, q = _windows(root, rots, [3])
    mr, mq = transforms.mirror(skel, r, q)
    flip = np.ones(3)
    flip[skel.lateral_axis] = -1
    pos = forward_kinematics(skel, q, r)[0]
    expected = (pos * flip)[..., skel.symmetry, :]
    np.testing.assert_allclose(forward_kinematics(skel, mq, mr)[0], expected, atol=1e-6)
    r2, q2 = transforms.mirror(skel, mr, mq)
    np.testing.assert_array_equal(r2, r)
    np.testing.assert_array_equal(q2, q)
    # SMPL-like body: the same identities on a 24-joint tree with another lateral axis.
    smpl = smpl_like()
    sq = rot.axis_angle_to_quat(np.random.default_rng(0).normal(0, 0.4, (6, 24, 3)))
    sr = np.random.default_rng(1).normal(size=(6, 3))
    flip = np.ones(3)
    flip[smpl.lateral_axis] = -1
    mr, mq = transforms.mirror(smpl, sr, sq)
    np.testing.assert_allclose(forward_kinematics(smpl, mq, mr)[0],
                               (forward_kinematics(smpl, sq, sr)[0] * flip)[..., smpl.symmetry, :], atol=1e-6)


def test_mirror_as_a_signed_permutation_is_the_two_hamilton_products():
    """transforms.mirror permutes and signs quaternion components (docs/input.md, seventh pass); the
    definition it replaces, p_parent ⊗ q_j ⊗ p_j with the half turns of the frames then the twins'
    swap, written here with rot.quat_mul, gives the same numbers for random frames (any reflection
    per joint) and the plain ones, on a 24-joint tree."""
    smpl = smpl_like()
    rng = np.random.default_rng(3)
    q = rot.quat_normalize(rng.normal(size=(5, 7, 24, 4)))
    r = rng.normal(size=(5, 7, 3))
    reflections = transforms._REFLECTIONS
    for frames in (transforms._plain_frames(smpl),
                   transforms.MirrorFrames(reflections[rng.integers(0, 2)] * 1.0,
                                           reflections[rng.integers(0, 4, 24)])):
        half = transforms._sign_quat(-frames.joints)
        parent = transforms._sign_quat(-transforms._parent_frames(smpl, frames))
        want = rot.quat_mul(parent, rot.quat_mul(q, half))[..., smpl.symmetry, :]
        mr, mq = transforms.mirror(smpl, r, q, frames)
        np.testing.assert_array_equal(mq, want)
        np.testing.assert_array_equal(mr, r * frames.world)


def _reframed(skel, quats, frames):
    """The same body and motion with joint ``j``'s local frame turned by ``frames[j]`` (a rig whose
    left and right joint frames differ, like Bandai Namco's): ``q~_j = B_p^-1 q_j B_j``,
    ``o~_j = B_p^-1 o_j``; FK is unchanged."""
    parent = np.stack([rot.identity_quat((), np.float64, np) if p < 0 else frames[p] for p in skel.parents])
    q = rot.quat_mul(rot.quat_conj(parent), rot.quat_mul(quats, frames))
    return skel.replace(offsets=rot.quat_rotate(rot.quat_conj(parent), skel.offsets)), q


def test_mirror_frames_from_the_data_mirror_a_rig_whose_sides_differ():
    """A rig whose right-side joint frames are turned half-way about the up axis is not mirrored by
    the plain frames; the frames :func:`mirror_frames` picks from the feature means mirror it
    exactly: the result equals the plain mirror done on the original rig, re-expressed."""
    smpl = smpl_like()
    rng = np.random.default_rng(0)
    # A left/right symmetric mean pose (mirroring takes axis-angle v to -M v), so mean rotations
    # tell frames apart.
    flip = -transforms._lateral_flip(smpl, np.float64)
    pose = rng.normal(0, 0.5, (24, 3))
    pose[smpl.symmetry == np.arange(24)] *= flip == 1
    first = np.flatnonzero(smpl.symmetry > np.arange(24))  # one joint of each pair
    pose[smpl.symmetry[first]] = pose[first] * flip
    sq = rot.axis_angle_to_quat(pose + rng.normal(0, 0.2, (200, 24, 3)))
    sr = rng.normal(0, 0.1, (200, 3))
    right = np.array(["right" in n for n in smpl.names])
    up = np.zeros(3)
    up[smpl.up_axis] = np.pi
    turn = np.where(right[:, None], rot.axis_angle_to_quat(up), rot.identity_quat((), np.float64, np))
    rig, q = _reframed(smpl, sq, turn)
    np.testing.assert_allclose(forward_kinematics(rig, q, sr)[0], forward_kinematics(smpl, sq, sr)[0],
                               atol=1e-9)
    assert not transforms.mirrorable(rig)
    assert transforms.mirror_frames(rig) is None  # no statistics: cannot tell the frames
    frames = transforms.mirror_frames(rig, features.pack(rig, sr, q).mean(0))
    assert frames is not None
    mr, mq = transforms.mirror(rig, sr, q, frames)
    want_r, want_q = transforms.mirror(smpl, sr, sq)  # the plain mirror is exact on the original rig
    _, want_q = _reframed(smpl, want_q, turn)
    np.testing.assert_allclose(mr, want_r, atol=1e-12)
    np.testing.assert_allclose(np.abs((mq * want_q).sum(-1)), 1.0, atol=1e-9)  # same rotations (q ~ -q)
    np.testing.assert_allclose(transforms.mirror_offsets(rig, rig.offsets, frames), rig.offsets, atol=1e-9)
    # The plain frames give the right FK only through mirrored offsets, and rotations off the data.
    _, plain_q = transforms.mirror(rig, sr, q)
    assert np.abs(np.abs((plain_q * want_q).sum(-1)) - 1).max() > 0.1


def test_clean_prob_leaves_that_share_of_windows_uncorrupted(clip):
    skel = clip[0]
    noise = transforms.Noise(rot_std=0.1, pos_std=0.03, joint_mask_prob=0.2, time_warp=1.0, clean_prob=0.3)
    rng = np.random.default_rng(0)
    draws = [noise.sample(rng, WINDOW, skel) for _ in range(500)]
    clean = [not any(np.any(d[k]) for k in ("rot", "pos", "joint_mask", "frame_mask", "warp")) for d in draws]
    assert abs(np.mean(clean) - 0.3) < 0.05


def test_noise_statistics_match_the_config(clip):
    skel, root, rots = clip
    noise = transforms.Noise(rot_std=0.1, pos_std=0.03, joint_mask_prob=0.2, frame_mask_prob=0.1)
    starts = np.arange(0, root.shape[0] - WINDOW, 2)
    r, q = _windows(root, rots, starts)
    rng = np.random.default_rng(0)
    draws = [noise.sample(rng, WINDOW, skel) for _ in starts]
    draws = {k: np.stack([d[k] for d in draws]) for k in draws[0]}
    f = features.feature_dim(skel)
    ex = transforms.make_example(skel, r, q, draws, np.zeros(f), np.ones(f), chunk_size=8)
    clean, noisy = transforms.unchunk(ex["clean"]), transforms.unchunk(ex["noisy"])
    frame_mask = ex["mask"].reshape(len(starts), WINDOW) > 0
    assert abs(frame_mask.mean() - 0.1) < 0.02
    np.testing.assert_array_equal(noisy[frame_mask], 0)
    kept = noisy[~frame_mask]
    ids = features.rotating_joints(skel)
    joint_zero = np.all(kept[:, 3:].reshape(len(kept), len(ids), 6) == 0, axis=-1)
    assert abs(joint_zero.mean() - 0.2) < 0.02
    # Root position noise: the difference is N(0, 0.03²) per axis.
    d = (kept[:, :3] - clean[~frame_mask][:, :3])
    np.testing.assert_allclose(d.std(0), 0.03, rtol=0.06)
    # Rotation noise: log(q⁻¹ q_noisy) is N(0, 0.1²) per axis on ball joints, on-axis for hinges.
    _, qc = features.unpack(skel, clean[~frame_mask])
    _, qn = features.unpack(skel, kept)
    eps = rot.quat_to_axis_angle(rot.quat_mul(rot.quat_conj(qc), qn))[:, ids]  # [n, R, 3]
    kinds = np.array([skel.kinds[j] for j in ids])
    ball = eps[~joint_zero & (kinds == "ball") & (ids > 0)]
    np.testing.assert_allclose(ball.std(0), 0.1, rtol=0.05)
    axes = skel.axes[ids][None].repeat(len(eps), 0)
    hinge_sel = ~joint_zero & (kinds == "hinge")
    hinge, axis = eps[hinge_sel], axes[hinge_sel]
    assert np.abs(hinge - np.sum(hinge * axis, -1, keepdims=True) * axis).max() < 1e-4  # on-axis only


def test_time_warp_fixes_ends_and_interpolates_exactly():
    t = 16
    root = np.stack([np.arange(t), np.zeros(t), 2.0 * np.arange(t)], -1)[None].astype(np.float64)  # linear
    angle = 0.05 * np.arange(t)
    rots = rot.axis_angle_to_quat(angle[None, :, None, None] * np.array([0.0, 1, 0]))  # [1, T, 1, 4]
    wr, wq = transforms.time_warp(root, rots, np.array([2.0]))
    u = np.arange(t) + 2.0 * np.sin(np.pi * np.arange(t) / (t - 1))
    np.testing.assert_allclose(wr[0, :, 0], u, atol=1e-5)  # lerp of a linear path is exact
    np.testing.assert_allclose(wr[0, :, 2], 2 * u, atol=1e-5)
    np.testing.assert_allclose(rot.quat_to_axis_angle(wq)[0, :, 0, 1], 0.05 * u, atol=1e-5)  # nlerp: 1e-6
    same_r, same_q = transforms.time_warp(root, rots, np.array([0.0]))
    np.testing.assert_allclose(same_r, root, atol=1e-6)


def test_the_window_floor_from_frame_floors_is_fk_at_span_frames_and_within_a_cm_between():
    """transforms.window_floor (a training window's floor from its span's per-frame floor, no FK)
    against FK of the window read from the span (float64), on every DeepMimic clip at 30 fps (flips,
    jumps, rolls, crawls): equal at speed 1 (every frame a span frame); at speeds in [0.8, 1.25] an
    approximation (FK of nlerped poses is not the lerp of heights), within 1 cm of the FK floor and
    0.5 mm on average (measured: 4.9 mm at most, 0.40 mm mean; Bandai-2: 3.9 and 0.45); and the jax
    path is the numpy one."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    window, gaps = 32, []
    span = transforms.span_frames(window, 1.25)
    for path in deepmimic_clip_paths():
        m = read_deepmimic(path)
        root, rots = transforms.resample(m.root_position, m.rotations, m.fps, 30.0)
        lowest = transforms.frame_floor(m.skeleton, root, rots)  # [N]
        n = root.shape[0]
        starts = rng.integers(0, n - 8, 24)  # some spans run past the clip's end
        idx, length = np.minimum(starts[:, None] + np.arange(span), n - 1), n - starts
        for speed in (None, np.exp(rng.uniform(-np.log(1.25), np.log(1.25), starts.size))):
            r, q, _ = transforms.read_window(root[idx], rots[idx], length, window, speed)
            exact = transforms.frame_floor(m.skeleton, r, q).min(-1)
            got = transforms.window_floor(lowest[idx], length, window, speed)
            if speed is None:
                np.testing.assert_allclose(got, exact, atol=1e-12, err_msg=path.name)
                continue
            gaps.append(got - exact)
            on_device = transforms.window_floor(jnp.asarray(lowest[idx], jnp.float32), jnp.asarray(length),
                                                window, jnp.asarray(speed, jnp.float32))
            np.testing.assert_allclose(np.asarray(on_device), got, atol=1e-5, err_msg=path.name)
    gaps = np.concatenate(gaps)
    assert np.abs(gaps).max() < 0.01 and np.abs(gaps).mean() < 5e-4, (np.abs(gaps).max(), np.abs(gaps).mean())
    assert np.abs(gaps).max() > 1e-4  # between span frames it is not the FK floor: the bound is held


def test_dynamics_score_and_window_weights():
    skel = deepmimic_humanoid()
    t = 40
    rots = np.tile(rot.identity_quat((1, skel.num_joints), np.float64, np), (t, 1, 1))
    root = np.zeros((t, 3))
    root[:, 0] = 0.5 * (np.arange(t) / 30.0) ** 2  # constant acceleration 1 m/s² of the whole body
    np.testing.assert_allclose(transforms.dynamics_score(skel, root, rots, 30.0), 1.0, atol=1e-9)
    score = np.r_[np.zeros(20), np.ones(10), np.zeros(10)]
    ws = transforms.window_scores(score, 10)
    np.testing.assert_allclose(ws, [np.mean(score[s:s + 10]) for s in range(31)])
    np.testing.assert_allclose(transforms.window_weights(ws, 0.0, 31, ws.sum()), 1 / 31)
    p = transforms.window_weights(ws, 1.0, 31, ws.sum())
    assert p.argmax() == 20 and p[:11].sum() == 0 and abs(p.sum() - 1) < 1e-12
    np.testing.assert_allclose(transforms.window_weights(ws, 0.5, 31, ws.sum()).sum(), 1)


def test_moments_match_numpy():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3, 2, (n, 5)) for n in (1, 7, 100, 3)]
    m = prepare.Moments(5)
    for c in chunks:
        m.update(c)
    x = np.concatenate(chunks)
    np.testing.assert_allclose(m.mean, x.mean(0))
    np.testing.assert_allclose(m.std(), x.std(0, ddof=1))


SPLITS = {"train": "rest", "validation": "tail:0.2"}  # a corpus without DeepMimic's test clips


@pytest.fixture(scope="module")
def prepared(deepmimic_dir):
    return prepare.prepare(out_dir=deepmimic_dir, window=WINDOW, progress=False)  # loads the session's


def test_prepare_deepmimic_splits_and_stats(prepared):
    info = prepared
    assert len(info.names) == 15 and info.fps == 30.0
    held = {info.names[c] for c, _, _ in info.splits["test"]}
    assert held == set(prepare.DEEPMIMIC_SPLITS["test"].removeprefix("clips:").split(","))
    train = {info.names[c] for c, _, _ in info.splits["train"]}
    assert not train & held and len(train) == 12 and info.train_split == "train"
    # The scratch files (every clip's dedup descriptor and moments) are gone once the dataset is written.
    assert not (Path(info.data_dir) / prepare.DESCRIPTORS).exists()
    assert not (Path(info.data_dir) / prepare.MOMENTS).exists()
    assert (Path(info.data_dir) / prepare.INDEX).exists()
    for (c, b, e), (c2, b2, e2) in zip(info.splits["train"], info.splits["validation"], strict=True):
        assert c == c2 and b == 0 and e == b2 == round(0.8 * info.frames[c]) and e2 == info.frames[c]
    # Stats = direct mean/std over every canonicalized training window (stride window/4).
    from motionjax.data.pipeline import ClipSource
    src = ClipSource(info)
    feats = np.concatenate([prepare.window_features(info.skeleton, src[c]["root_position"][b:e],
                                                    src[c]["rotations"][b:e], WINDOW, WINDOW // 4)
                            for c, b, e in info.splits["train"]])
    np.testing.assert_allclose(info.mean, feats.mean(0), atol=1e-5)
    std = feats.std(0, ddof=1)
    np.testing.assert_allclose(info.std, np.where(std < stats.MIN_STD, 1, std), rtol=1e-4, atol=1e-6)
    # Records hold the resampled clip.
    m = read_deepmimic(deepmimic_clip_paths()[0])
    r, q = transforms.resample(m.root_position, m.rotations, m.fps, 30.0)
    np.testing.assert_allclose(src[0]["root_position"], r, atol=1e-6)


def test_a_full_disk_while_dedup_writes_its_index_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    """Dedup's window index goes to a scratch file in the partial folder: a full disk there ends
    prepare with an OSError naming that folder, and the folder is removed."""
    import errno
    import os

    from motionjax.data import dedup

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dedup.tempfile, "TemporaryFile", full)
    src = tmp_path / "src"
    src.mkdir()
    for path in deepmimic_clip_paths()[:3]:
        (src / path.name).write_text(path.read_text())
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left on device") as caught:
        prepare.prepare(src, out, window=WINDOW, progress=False, splits=SPLITS)
    assert caught.value.filename == str(out.with_name("out.partial"))
    assert not out.exists() and not out.with_name("out.partial").exists()


def test_prepare_is_idempotent_and_skips_bad_files(tmp_path, prepared):
    src = tmp_path / "src"
    src.mkdir()
    good = deepmimic_clip_paths()[9]  # punch, 30 fps
    (src / good.name).write_text(good.read_text())
    (src / "broken.txt").write_text('{"Frames": [[0.03, 1, 2]]}')
    doc = json.loads(good.read_text())
    doc["Frames"][3][5] = float("nan")
    (src / "nan_clip.txt").write_text(json.dumps(doc))
    out = tmp_path / "out"
    info = prepare.prepare(src, out, window=WINDOW, progress=False, splits=SPLITS)
    assert info.names == ("humanoid3d_punch",)
    assert sorted(s["path"].rsplit("/", 1)[-1] for s in info.skipped) == ["broken.txt", "nan_clip.txt"]
    assert all(s["reason"] for s in info.skipped)
    stamp = (out / INDEX).stat().st_mtime_ns
    prepare.prepare(src, out, window=WINDOW, progress=False, splits=SPLITS)
    assert (out / INDEX).stat().st_mtime_ns == stamp  # nothing rewritten
    with pytest.raises(Exception, match="broken.txt"):
        prepare.prepare(src, tmp_path / "strict", window=WINDOW, strict=True, progress=False, splits=SPLITS)


def test_bad_records_are_detected_counted_and_strict_raises(caplog):
    skel = deepmimic_humanoid()
    good = {"name": "ok", "root_position": np.zeros((4, 3)), "rotations": np.tile([1.0, 0, 0, 0], (4, 15, 1)),
            "score": np.zeros(4)}
    records.check_clip(good, skel)
    nan = dict(good, name="has_nan", root_position=np.full((4, 3), np.nan))
    joints = dict(good, name="joints", rotations=np.tile([1.0, 0, 0, 0], (4, 14, 1)))
    empty = dict(good, name="empty", rotations=np.zeros((0, 15, 4)))
    counter = records.BadRecordCounter(strict=False)
    with caplog.at_level(logging.WARNING):
        for bad in (nan, joints, empty, nan):
            with pytest.raises(records.BadRecordError, match=bad["name"]) as e:
                records.check_clip(bad, skel)
            counter.skip(e.value, bad["name"])
    assert counter.counts == {"has_nan": 2, "joints": 1, "empty": 1} and counter.total == 4
    assert "has_nan" in caplog.text and caplog.text.count("has_nan") == 1  # warned once per clip
    with pytest.raises(records.BadRecordError):
        records.BadRecordCounter(strict=True).skip(records.BadRecordError("x"), "x")
    # A record whose bytes do not match its header is caught at decode.
    data = records.encode_record("short", np.zeros((4, 3)), np.zeros((4, 15, 4)), np.zeros(4))
    with pytest.raises(records.BadRecordError, match="short"):
        records.decode_record(data[:-8])


def test_synthetic_corpus_is_deterministic_smooth_and_within_limits(tmp_path):
    skel = deepmimic_humanoid()
    a = synthetic.synthetic_clip(skel, 7, seed=3, frames=120)
    b = synthetic.synthetic_clip(skel, 7, seed=3, frames=120)
    c = synthetic.synthetic_clip(skel, 8, seed=3, frames=120)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])
    root, rots = a
    aa = rot.quat_to_axis_angle(rots.astype(np.float64))
    for j, kind in enumerate(skel.kinds):
        if kind == "ball" and j > 0:
            assert np.abs(aa[:, j]).max() <= synthetic.BALL_LIMIT + 1e-4
        if kind == "hinge":
            lo, hi = next(v for k, v in synthetic.HINGE_LIMITS.items() if k in skel.names[j])
            angle = aa[:, j] @ skel.axes[j]
            assert lo - 1e-4 <= angle.min() and angle.max() <= hi + 1e-4
    pos = forward_kinematics(skel, rots, root)[0]
    # Joint accelerations stay below the DeepMimic clips' peaks (110-300 m/s²): smooth, no jumps.
    assert np.linalg.norm(np.diff(pos, 2, axis=0), axis=-1).max() * 30**2 < 110
    # Written to shards, records read back equal to the generator's.
    info = prepare.write_dataset(synthetic.synthetic_motions(5, frames=64), tmp_path, fps=30.0, window=WINDOW,
                                 records_per_shard=2, progress=False)
    assert len(info.shards) == 3
    from motionjax.data.pipeline import ClipSource
    expected = synthetic.SyntheticClips(5, frames=64)[4]["rotations"]
    np.testing.assert_allclose(ClipSource(info)[4]["rotations"], expected, atol=1e-6)
