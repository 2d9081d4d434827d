"""The device side of training batches (#53): the augmentation program against the numpy reference
on fixed keys, the draws' distributions, both residency tiers (the corpus on the devices, or
streamed by Grain), exact resume, independence of the device count, and where the corpus lives."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from batches import assert_resumes_exactly, equal, take

from motionjax.configs.base import get_config
from motionjax.data import augment, feed, pipeline, resident, transforms


@pytest.fixture(scope="module")
def cfg(deepmimic_dir):
    c = get_config().data
    c.update(dir=str(deepmimic_dir), batch_size=8, speed_range=1.25, reverse_prob=0.3, pose_offset=0.05,
             clean_prob=0.2)
    return c


@pytest.fixture(scope="module")
def info(cfg):
    return pipeline.dataset_info(cfg)


def _spans(cfg, info, seed=0):
    it = pipeline.make_train_iterator(cfg, info, seed=seed)
    spans = next(it)
    it.close()
    return spans


def test_the_device_program_equals_the_numpy_reference_on_the_same_draws(cfg, info):
    """Every transform (speed read, reversal, pose offset, mirror, canonicalization and floor, time warp,
    rotation and root noise, masks, standardization, chunking), jitted on the device from fixed keys,
    equals the same transforms run in numpy (float64 where the draws allow) on the draws those keys
    give: the device path changes where the work runs, not what it computes."""
    spans = _spans(cfg, info)
    aug = augment.Augment(cfg, info)
    keys = augment.example_keys(7, 11, cfg.batch_size)
    got = jax.jit(aug)(jax.tree.map(jnp.asarray, spans), keys)

    # The draws the keys give, pulled to the host, applied in numpy.
    log = np.log(cfg.speed_range)
    speed = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), minval=-log, maxval=log))(
        augment.purpose(keys, augment._SPEED)), np.float64)
    u = np.asarray(jax.vmap(jax.random.uniform)(augment.purpose(keys, augment._REVERSE)))
    flip = u < cfg.reverse_prob
    eps = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (info.skeleton.num_joints, 3)))(
        augment.purpose(keys, augment._POSE)), np.float64) * cfg.pose_offset
    draws = jax.tree.map(np.asarray, augment.sample_noise(augment.purpose(keys, augment._NOISE), aug.noise,
                                                          cfg.window, info.skeleton))
    assert draws["mirror"].any() and (~draws["mirror"]).any() and flip.any()  # both branches taken
    f64 = lambda x: x.astype(np.float64)  # noqa: E731
    root, rots, valid = transforms.read_window(f64(spans["root_position"]), f64(spans["rotations"]),
                                               spans["length"], cfg.window, np.exp(speed))
    root, rots, valid = transforms.reverse_window(root, rots, valid, flip)
    rots = transforms.offset_pose(info.skeleton, rots, eps)
    make = pipeline.MakeExample(info, cfg, aug.noise)
    want = make.transform({"root_position": root, "rotations": rots, "valid": valid,
                           "offsets": spans["offsets"].astype(np.float64)}, draws)
    assert sorted(got) == ["clean", "noisy", "offsets", "valid"]
    for k in got:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], atol=2e-4, rtol=0, err_msg=k)


def test_the_flat_draws_are_jaxs_draws_of_the_shape_pinned():
    """augment.draw draws flat for speed (docs/input.md) and must give jax.random's numbers for the
    asked shape, per example under vmap; the stream is pinned (jax's partitionable threefry, its
    default): a jax upgrade or a change of scheme that moves it changes every noisy batch and an
    older run's resume, and must be a decision, not a surprise. (augment.draw serves the pose offset;
    the noise draws take two words a hash since docs/input.md's seventh pass: augment.halves.)"""
    key = jax.random.key(3)
    for sample, shape in ((jax.random.normal, (7, 3)), (jax.random.uniform, (5, 4, 3))):
        np.testing.assert_array_equal(np.asarray(augment.draw(sample, key, shape)),
                                      np.asarray(sample(key, shape)))
    np.testing.assert_allclose(np.asarray(augment.draw(jax.random.normal, key, (2, 3))),
                               [[-1.4462570, 1.5393810, 0.38250625], [1.9707018, -0.58766741, 0.20941563]],
                               rtol=0, atol=1e-6)
    keys = jax.random.split(key, 4)
    batched = jax.jit(jax.vmap(lambda k: augment.draw(jax.random.normal, k, (7, 3))))(keys)
    for k, got in zip(keys, np.asarray(batched), strict=True):
        np.testing.assert_array_equal(got, np.asarray(jax.random.normal(k, (7, 3))))


def test_the_draws_follow_the_configured_distributions(cfg, info):
    """The device's draws for 4,096 windows: rotation / root noise std, mask and mirror rates, the
    share left clean, the warp range; and the speed draw is log-uniform in [1/r, r]."""
    noise = transforms.Noise(rot_std=0.05, pos_std=0.02, joint_mask_prob=0.1, frame_mask_prob=0.05,
                             time_warp=1.5, mirror_prob=0.5, clean_prob=0.25)
    keys = augment.example_keys(0, 0, 4096)
    d = jax.tree.map(np.asarray, augment.sample_noise(keys, noise, 16, info.skeleton))
    corrupt = np.abs(d["pos"]).sum((1, 2)) > 0
    assert abs(corrupt.mean() - 0.75) < 0.03
    np.testing.assert_allclose(d["pos"][corrupt].std(), 0.02, rtol=0.03)
    # Rotation noise only where transforms.rotation_noise keeps it: a ball joint's three components,
    # a hinge's along its axis, none on a fixed joint; each of std 0.05 there.
    sk, rot_noise = info.skeleton, d["rot"][corrupt]
    np.testing.assert_allclose(rot_noise[..., sk.ball_mask, :].std(), 0.05, rtol=0.03)
    hinge = sk.hinge_axes.any(-1)
    axis = sk.hinge_axes[hinge] / np.linalg.norm(sk.hinge_axes[hinge], axis=-1, keepdims=True)
    along = (rot_noise[..., hinge, :] * axis).sum(-1)
    np.testing.assert_allclose(along.std(), 0.05, rtol=0.03)
    np.testing.assert_allclose(rot_noise[..., hinge, :], along[..., None] * axis, atol=1e-7)
    assert not rot_noise[..., ~sk.ball_mask & ~hinge, :].any()
    assert abs(d["joint_mask"][corrupt].mean() - 0.1) < 0.01
    assert abs(d["frame_mask"][corrupt].mean() - 0.05) < 0.01
    assert not d["joint_mask"][~corrupt].any() and (d["warp"][~corrupt] == 0).all()
    assert abs(d["mirror"].mean() - 0.5) < 0.03  # mirroring augments both targets: never cleared
    assert np.abs(d["warp"]).max() <= 1.5 and abs(np.abs(d["warp"][corrupt]).mean() - 0.75) < 0.05
    log = np.log(1.25)
    s = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), minval=-log, maxval=log))(
        augment.purpose(keys, augment._SPEED)))
    assert np.abs(s).max() <= log and abs(s.mean()) < 0.01 and abs(s.std() - log / np.sqrt(3)) < 0.01


def _threefry2x32(k0: int, k1: int, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011) in numpy uint32: the reference the device's
    draw is held to."""
    m = np.uint32(0xFFFFFFFF)
    ks = [np.uint32(k0), np.uint32(k1), np.uint32(k0 ^ k1 ^ 0x1BD11BDA)]
    x0, x1 = (x0 + ks[0]) & m, (x1 + ks[1]) & m
    for i in range(5):
        for r in ((13, 15, 26, 6), (17, 29, 16, 24))[i % 2]:
            x0 = (x0 + x1) & m
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0, x1 = (x0 + ks[(i + 1) % 3]) & m, (x1 + ks[(i + 2) % 3] + np.uint32(i + 1)) & m
    return (int(x0[0]), int(x1[0])) if x0.size == 1 else (x0, x1)


def test_the_16_bit_draws_are_the_threefry_words_halves_and_their_normals_are_normal():
    """augment.halves: the low then the high 16 bits of the Threefry-2x32 hashes of counter pairs
    (a numpy Threefry checked on Random123's known answer); augment.normal_table: symmetric, unit
    variance, its CDF within 1e-4 of the normal's (scipy) at every bin edge, tails at 4.32 sigma;
    200k drawn normals pass a KS test against N(0, 1) and 200k uniforms against U(0, 1) (numpy's
    moments and scipy's KS)."""
    import scipy.stats
    assert _threefry2x32(0x13198A2E, 0x03707344, np.uint32([0x243F6A88]), np.uint32([0x85A308D3])) == (
        0xC4923A9C, 0x483DF7A0)  # Random123's known-answer vector for threefry2x32_20
    key = jax.random.key(5)
    k0, k1 = (int(k) for k in np.asarray(jax.random.key_data(key)))
    y0, y1 = _threefry2x32(k0, k1, np.arange(4, dtype=np.uint32), np.arange(4, 8, dtype=np.uint32))
    words = np.concatenate([y0, y1])  # 8 words: the hashes of the counter pairs (i, i + 4)
    np.testing.assert_array_equal(np.asarray(augment.halves(key, 13)),
                                  np.concatenate([words & 0xFFFF, words >> 16]))
    table = augment.normal_table().astype(np.float64)
    np.testing.assert_allclose(table, -table[::-1], atol=1e-6)
    assert abs(np.mean(table**2) - 1) < 1e-6 and 4.3 < table.max() < 4.35
    edges = np.arange(1, augment.HALF_LEVELS) / augment.HALF_LEVELS  # P(z <= midpoint between bins)
    mid = (table[1:] + table[:-1]) / 2
    assert np.abs(scipy.stats.norm.cdf(mid) - edges).max() < 1e-4
    h = augment.halves(jax.random.key(6), 200_000)
    z, u = np.asarray(augment.half_normal(h)), np.asarray(augment.half_uniform(h))
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-3 and scipy.stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01 and 0 < u.min() and u.max() < 1


def test_the_rotation_noise_dofs_have_the_projected_iid_noises_covariance(info):
    """augment.rotation_dofs' K normals, expanded to [J, 3], have the covariance that
    transforms.rotation_noise's projection gives iid [J, 3] normals (P P^T with P the identity on a
    ball joint, a a^T on a hinge, 0 on a fixed joint, built here from the skeleton), so the noise
    the model sees has the distribution of before."""
    sk = info.skeleton
    source, weight = augment.rotation_dofs(sk)
    k = int(source.max()) + 1
    w = np.zeros((sk.num_joints * 3, k))
    w[np.arange(sk.num_joints * 3), source] = weight
    p = np.zeros((sk.num_joints * 3, sk.num_joints * 3))
    for j in range(sk.num_joints):
        a = sk.hinge_axes[j]
        block = np.eye(3) if sk.ball_mask[j] else np.outer(a, a) if a.any() else np.zeros((3, 3))
        p[3 * j:3 * j + 3, 3 * j:3 * j + 3] = block
    np.testing.assert_allclose(w @ w.T, p @ p.T, atol=1e-6)
    assert k == 3 * sk.ball_mask.sum() + sk.hinge_axes.any(-1).sum() < 3 * sk.num_joints


@pytest.mark.parametrize("speed_range", [1.0, 1.25])
def test_the_span_floor_is_the_floor_the_program_computed(cfg, info, speed_range):
    """The per-frame floor the spans carry ("lowest", transforms.frame_floor: the resident corpus's at
    load time, the host's once a cached segment in the streamed tier) is the FK minimum over the
    frame's joints (numpy, float64) in both tiers; and the program's batch from spans that carry it
    equals the batch from the same spans without it (the floor's FK in the program), with the
    mirror, time warp and noise of config.data: exactly at speed 1; at other speeds
    (transforms.window_floor, lerped between span frames) every feature but the root's height exactly,
    that one within 1 cm (tests/test_data.py holds the floor itself to FK's)."""
    c = cfg.copy_and_resolve_references()
    c.update(speed_range=speed_range, reverse_prob=0.3, pose_offset=0.0)
    source = pipeline.ClipSource(info)
    shares = pipeline.segment_shares(info, c.window, c.dynamics_sampling)
    corpus = resident.load_corpus(info, c, source, shares)
    s = 3
    clip_id, begin, end = info.splits["train"][s]
    clip = source[clip_id]
    pos, _ = transforms.forward_kinematics(info.skeleton, clip["rotations"][begin:end].astype(np.float64),
                                           clip["root_position"][begin:end].astype(np.float64),
                                           clip["offsets"].astype(np.float64))
    floor = pos[..., info.skeleton.up_axis].min(-1)
    first = corpus.first[s]
    np.testing.assert_allclose(corpus.lowest[first:first + end - begin], floor, atol=1e-6)
    streamed = pipeline.SampleWindow(source, info, c)
    slot = (0, clip_id, begin, end)
    segment, _ = streamed.locate(slot, 0.0)
    starts = (0, end - begin - 5)  # the second span runs past the segment's end: its last frame repeats
    spans = streamed.gather([(segment, k) for k in starts], [slot] * 2)
    for row, start in enumerate(starts):
        np.testing.assert_allclose(spans["lowest"][row], floor[np.minimum(start + np.arange(streamed.span),
                                                                          end - begin - 1)], atol=1e-6)
    tables = corpus.arrays(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    keys = augment.example_keys(2, 9, 16)
    aug = augment.Augment(c, info)
    spans = jax.jit(resident.sample_spans, static_argnums=(3, 4))(
        tables, jnp.asarray(resident.segment_cdf(shares)), keys, aug.span, corpus.bisect_steps)
    assert aug.floor_from_span
    names = ("root_position", "rotations", "length", "offsets")
    got = jax.jit(aug)({k: spans[k] for k in (*names, "lowest")}, keys)
    want = jax.jit(aug)({k: spans[k] for k in names}, keys)
    height = info.skeleton.up_axis  # the root height's feature
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        if k in ("noisy", "clean"):
            tol = 2e-5 if speed_range == 1.0 else 0.01 / info.std[height]  # 1 cm, standardized
            np.testing.assert_allclose(g[..., height], w[..., height], atol=tol, err_msg=k)
            g, w = np.delete(g, height, -1), np.delete(w, height, -1)
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=k)


@pytest.mark.parametrize("mode", ["device", "stream"])
def test_batches_have_the_contract_layout_and_depend_only_on_the_seed(cfg, info, mode):
    its = [feed.Feed(cfg, info, seed=s, mode=mode) for s in (0, 0, 1)]
    try:
        a, b, c = (take(it, 3) for it in its)
    finally:
        for it in its:
            it.close()
    n, f = cfg.window // cfg.chunk, info.feature_dim
    assert {k: v.shape for k, v in a[0].items()} == {
        "noisy": (8, n, cfg.chunk, f), "clean": (8, n, cfg.chunk, f), "valid": (8, n, cfg.chunk, 1),
        "offsets": (8, info.skeleton.num_joints, 3)}
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in a[0].values())
    assert equal(a, b) and not equal(a, c)
    # Clean features are standardized with the stored stats: roughly zero mean, unit scale.
    clean = np.concatenate([x["clean"] for x in a]).reshape(-1, f)
    assert abs(clean.mean()) < 0.2 and 0.5 < clean.std() < 1.5


def test_both_tiers_and_the_host_loader_draw_the_same_distribution(cfg, info):
    """Over 60 batches the resident tier, the streamed tier and today's host loader (numpy, one window
    at a time) give clean features with the same per-feature moments (within sampling error): the
    device draws windows like Grain does and augments them like the host did."""
    def moments(batches):
        x = np.concatenate([np.asarray(b["clean"]).reshape(-1, info.feature_dim) for b in batches])
        return x.mean(0), x.std(0)

    got = {}
    for mode in ("device", "stream"):
        it = feed.Feed(cfg, info, seed=3, mode=mode)
        got[mode] = moments(take(it, 60))
        it.close()
    naive = pipeline.make_naive_train_iterator(cfg, info, seed=3)
    got["host"] = moments([next(naive) for _ in range(60)])
    for mode in ("device", "stream"):
        for k, name in enumerate(("mean", "std")):
            gap = np.abs(got[mode][k] - got["host"][k])
            assert np.median(gap) < 0.1 and gap.max() < 0.5, (mode, name, np.median(gap), gap.max())


def test_resident_draws_follow_the_segment_shares_and_the_dynamics_mixture(cfg, info):
    """The device's window draws: segments in proportion to their shares (as Grain's slot table), and
    within them the uniform/dynamics mixture: the mean dynamics score of 8,192 drawn windows is its
    expectation under w = 0 (uniform) and w = 1 (score-weighted)."""
    source = pipeline.ClipSource(info)
    train = info.splits[info.train_split]
    scores = [transforms.segment_windows(source[c]["score"][b:e], cfg.window) for c, b, e in train]
    all_scores = np.concatenate(scores)
    expected = {0.0: all_scores.mean(), 1.0: (all_scores**2).sum() / all_scores.sum()}
    for w in (0.0, 1.0):
        c = cfg.copy_and_resolve_references()
        c.dynamics_sampling = w
        shares = pipeline.segment_shares(info, c.window, w)
        corpus = resident.load_corpus(info, c, source, shares)
        tables = corpus.arrays(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        keys = augment.example_keys(0, 0, 8192)
        spans = jax.jit(resident.sample_spans, static_argnums=(3, 4))(
            tables, jnp.asarray(resident.segment_cdf(shares)), keys, c.window, corpus.bisect_steps)
        seg, length = np.asarray(spans["segment"]), np.asarray(spans["length"])
        counts = np.bincount(seg, minlength=len(train)) / seg.size
        assert np.abs(counts - shares / shares.sum()).max() < 0.02
        start = np.asarray(corpus.length)[seg] - length  # the window's start inside its segment
        drawn = np.array([scores[s][k] for s, k in zip(seg, start, strict=True)])
        np.testing.assert_allclose(drawn.mean(), expected[w], rtol=0.05)
        # The span is the segment's frames from that start.
        s, k = int(seg[0]), int(start[0])
        clip_id, begin, end = train[s]
        np.testing.assert_array_equal(np.asarray(spans["rotations"][0]),
                                      source[clip_id]["rotations"][np.minimum(np.arange(begin + k, begin + k
                                                                                       + c.window), end - 1)])
    assert expected[1.0] > 1.3 * expected[0.0]


@pytest.mark.parametrize("mode, block", [("device", 1), ("stream", 1), ("stream", 2), ("stream", 3)])
def test_resume_is_exact_through_orbax(cfg, info, tmp_path, mode, block):
    """Saved after 3 batches: streamed in blocks of 2, the block held is the one to take again; of 3, the
    next one (Grain's own position); either way the next batches cross into another block."""
    c = cfg.copy_and_resolve_references()
    c.stream_block = block
    assert_resumes_exactly(lambda: feed.Feed(c, info, seed=3, mode=mode), tmp_path / "ckpt")


def test_a_streamed_block_holds_consecutive_steps_and_a_resume_across_block_sizes_warns(cfg, info, caplog):
    """A block's batches are steps of one stream: the streamed feed's first 4 batches in blocks of 2
    train on the slots of the per-batch stream's first 4 (SlotBatches: the same global order), each
    batch its own windows; a state saved in blocks of 1 restored into blocks of 2 says the windows
    differ, and the feed goes on from the saved step."""
    c = cfg.copy_and_resolve_references()
    c.stream_block = 2
    table = pipeline.train_slots(info, cfg.window, cfg.dynamics_sampling)
    per_batch = pipeline.SlotBatches(table, cfg.batch_size, seed=0)
    blocked = pipeline.SlotBatches(table, cfg.batch_size * 2, seed=0)
    for m in range(3):
        np.testing.assert_array_equal(blocked[m], np.concatenate([per_batch[2 * m], per_batch[2 * m + 1]]))
    it = feed.Feed(c, info, seed=0, mode="stream")
    batches = take(it, 4)
    assert not equal(batches[:1], batches[1:2]) and not equal(batches[2:3], batches[3:4])
    c1 = cfg.copy_and_resolve_references()
    c1.stream_block = 1  # as the feed of before blocks saved it
    one = feed.Feed(c1, info, seed=0, mode="stream")
    take(one, 3)
    it.set_state(one.get_state())
    assert it.served == 3 and "blocks of 1 batches and resumes with data.stream_block=2" in caplog.text
    assert next(it)["noisy"].shape == batches[0]["noisy"].shape
    for i in (it, one):
        i.close()


def test_a_mesh_of_eight_devices_gets_the_one_device_batches(cfg, info):
    """data 4 x time 2: each device draws and augments its own windows; the batch is the one-device
    batch (float32 rounding aside) with the step's shardings."""
    mesh = jax.make_mesh((4, 2), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    one = feed.Feed(cfg, info, seed=5, mode="device")
    eight = feed.Feed(cfg, info, mesh, seed=5, mode="device")
    want, got = next(one), next(eight)
    assert got["noisy"].sharding.spec == jax.sharding.PartitionSpec("data", "time", None, None)
    assert len(got["noisy"].addressable_shards) == 8
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), atol=1e-5, err_msg=k)


def test_residency_auto_streams_what_does_not_fit_and_device_refuses_it(cfg, info, caplog):
    mode, why = feed.choose_residency(cfg, info)
    assert mode == "device" and "resident on the devices" in why and "MB" in why
    small = cfg.copy_and_resolve_references()
    small.device_share = 1e-9
    mode, why = feed.choose_residency(small, info)
    assert mode == "stream" and "does not fit" in why and "data.residency='auto'" in why
    small.residency = "device"
    with pytest.raises(feed.ResidencyError, match="does not fit.*data.residency='stream'"):
        feed.choose_residency(small, info)
    small.residency = "disk"
    with pytest.raises(ValueError, match="expected one of"):
        feed.choose_residency(small, info)
    # A stream saved under one tier resumes under the other with a warning, not silently.
    it = feed.Feed(cfg, info, seed=0, mode="device")
    take(it, 2)
    other = feed.Feed(cfg, info, seed=0, mode="stream")
    with caplog.at_level(logging.WARNING):
        other.set_state(it.get_state())
    assert other.served == 2 and "data.residency='device'" in caplog.text
    other.close()


def test_the_corpus_on_the_devices_is_the_training_split(cfg, info):
    """Every training segment's frames, in split order, and nothing of the held-out splits."""
    corpus = resident.load_corpus(info, cfg, pipeline.ClipSource(info), np.ones(len(info.splits["train"])))
    source = pipeline.ClipSource(info)
    want = np.concatenate([source[c]["rotations"][b:e] for c, b, e in info.splits["train"]])
    np.testing.assert_array_equal(corpus.rotations, want)
    assert corpus.rotations.shape[0] == info.split_frames("train") == int(corpus.length.sum())
    assert resident.corpus_nbytes(info) >= corpus.root.nbytes + corpus.rotations.nbytes
    np.testing.assert_allclose(corpus.window_cdf[corpus.window_first + corpus.window_count - 1], 1.0)


def test_loss_aware_draws_on_the_device_follow_the_error_table(cfg, info):
    """With data.loss_sampling, the resident tier draws segments from the table's mixture, renewed
    every data.loss_block steps from the errors the loop recorded."""
    c = cfg.copy_and_resolve_references()
    c.update(loss_sampling=0.9, loss_block=2, batch_size=64)
    it = feed.Feed(c, info, seed=0, mode="device")
    assert "segment" in feed.batch_keys(c)
    first = take(it, 2)
    hot = int(first[0]["segment"][0])
    for step, batch in enumerate(first, start=1):
        errors = np.where(batch["segment"] == hot, 1.0, 0.001)
        it.record(step, batch["segment"], errors)
    block = take(it, 2)  # steps 3-4: drawn from the table of steps 1-2
    q = it.table.probabilities(2)
    draws = np.concatenate([b["segment"] for b in block])
    p = q[hot]
    assert p > 0.5 and abs((draws == hot).mean() - p) < 5 * np.sqrt(p * (1 - p) / draws.size)
    it.close()



def test_loss_aware_streaming_keeps_its_host_cache_across_blocks(cfg, info):
    """Loss-aware sampling opens a new Grain pipeline every data.loss_block steps; in the main process
    they all read through one host cache: over six blocks no training segment is decoded twice."""
    c = cfg.copy_and_resolve_references()
    c.update(loss_sampling=0.5, loss_block=1, batch_size=8, worker_count=0)
    it = feed.Feed(c, info, seed=0, mode="stream")
    for step, batch in enumerate(take(it, 6), start=1):
        it.record(step, batch["segment"], np.ones(8))
    stats = it.stats()
    it.close()
    segments = len(info.splits[info.train_split])
    assert stats["misses"] <= segments < 6 * 8 and stats["hits"] >= 6 * 8 - segments, stats


def test_warming_the_host_cache_stops_once_a_block_reads_every_segment_from_it(cfg, info):
    """:func:`feed.warm_host_cache` (what data.worker_count = -1 and the input benchmark measure after):
    it stops at the first block of draws that reads no segment from the shards (each one decoded once,
    nothing evicted), and its cap stops it short of that."""
    c = cfg.copy_and_resolve_references()
    c.update(worker_count=0, prefetch=0)
    sampler = []
    it = pipeline.make_train_iterator(c, info, seed=0, sampler=sampler)
    stats = sampler[0].cache.stats
    try:
        assert feed.warm_host_cache(lambda: next(it), stats, block=1, most=1) == 1  # capped
        misses = [stats()["misses"]]
        drawn = feed.warm_host_cache(lambda: (next(it), misses.append(stats()["misses"])), stats, block=4)
    finally:
        it.close()
    assert drawn % 4 == 0 and misses[-1] == misses[-5] and len(set(misses[-9:-4])) > 1  # the last block only
    windows = [n for n, _ in info.train_windows]
    assert stats()["misses"] == stats()["segments"] <= sum(n > 0 for n in windows)
    assert stats()["evictions"] == 0


@pytest.mark.parametrize("speed_range", [1.0, 1.25])
def test_the_resident_program_reads_rows_and_the_mirror_image_as_the_spans_would_give(cfg, info, speed_range):
    """The resident feed's program gathers each window's frames from the corpus's rows
    (resident.sample_rows, transforms.read_window_rows) and a mirrored window's from the mirror image
    kept after them (augment.mirrored_rows, Corpus.arrays): its batch equals Augment's on the spans
    gathered first (resident.sample_spans, the mirror a pass in make_example), the same keys: bit for
    bit without the mirror; with it, to float32 rounding (the mirror's signed permutation sums each
    quaternion's products in another order), in metres and radians before standardization."""
    c = cfg.copy_and_resolve_references()
    c.update(speed_range=speed_range, reverse_prob=0.3, pose_offset=0.0, mirror_prob=0.5, residency="device")
    keys_ = ("noisy", "clean", "valid", "offsets")
    names = ("root_position", "rotations", "lowest", "length", "offsets")
    for mirror in (0.0, 0.5):
        c.mirror_prob = mirror
        it = feed.Feed(c, info, seed=4, mode="device", keys=keys_)
        aug, tables = it._augment, it._tables
        n = int(np.sum(np.asarray(tables["length"])))
        assert tables["frames"].shape[0] == (2 * n if mirror else n)
        assert (aug.mirror_rows is not None) == bool(mirror)
        steps = resident.bisect_steps(np.asarray(tables["window_count"]))

        def spans_first(step, tables, seg_cdf, aug=aug, steps=steps):
            keys = augment.example_keys(4, step, c.batch_size)
            starts = augment.purpose(keys, augment._START)
            spans = resident.sample_spans(tables, seg_cdf, starts, aug.span, steps)
            return aug({k: spans[k] for k in names}, keys)

        for step in (0, 5):
            got = jax.device_get(it._jitted(np.int32(step), tables, it._seg_cdf))
            want = jax.device_get(jax.jit(spans_first)(np.int32(step), tables, it._seg_cdf))
            for k in keys_:
                if not mirror or k in ("valid",):
                    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
                else:  # standardized features: back to metres / 6D components, where float32 rounds
                    scale = info.std if k != "offsets" else 1.0
                    np.testing.assert_allclose(got[k] * scale, want[k] * scale, atol=2e-6, rtol=0, err_msg=k)
        noise_keys = augment.purpose(augment.example_keys(4, 5, c.batch_size), augment._NOISE)
        drawn = augment.sample_noise(noise_keys, aug.noise, c.window, info.skeleton)
        assert not mirror or (np.asarray(drawn["mirror"]).any() and not np.asarray(drawn["mirror"]).all())
        it.close()
