"""The Grain pipeline (the stream tier: training spans) and the held-out batches: determinism, exact
resume (state and orbax), per-process shards, global sharded batches, workers, eval coverage, bad
records in the stream, dynamics-weighted sampling, the host segment cache, and the window reads
(speed, reversal, pose offset) in numpy. The device side of training batches: tests/test_feed.py."""
import logging

import jax
import numpy as np
import pytest
from batches import assert_resumes_exactly, equal, take
from jax.sharding import NamedSharding, PartitionSpec

from motionjax.configs.base import get_config
from motionjax.data import feed, pipeline, prepare, records, transforms
from motionjax.formats import Motion, deepmimic_clip_paths, read_deepmimic


@pytest.fixture(scope="module")
def cfg(deepmimic_dir):
    c = get_config().data
    c.dir = str(deepmimic_dir)
    c.batch_size = 8
    return c


@pytest.fixture(scope="module")
def info(cfg):
    return pipeline.dataset_info(cfg)


def test_spans_have_the_contract_layout_and_depend_only_on_the_seed(cfg, info):
    its = [pipeline.make_train_iterator(cfg, info, seed=s) for s in (0, 0, 1)]
    try:
        a, b, c = (take(it, 3) for it in its)
    finally:
        for it in its:
            it.close()
    j = info.skeleton.num_joints
    assert {k: (v.shape, v.dtype) for k, v in a[0].items()} == {
        "frames": ((8, cfg.window, 3 + 4 * j + 1), np.float32),
        "root_position": ((8, cfg.window, 3), np.float32), "rotations": ((8, cfg.window, j, 4), np.float32),
        "lowest": ((8, cfg.window), np.float32), "length": ((8,), np.int32),
        "offsets": ((8, j, 3), np.float32)}
    # The frame rows (one copy a row, what the wire carries) hold the span's leaves, which view them.
    frames = a[0]["frames"]
    for k, v in transforms.split_frames(frames, j).items():
        assert np.shares_memory(a[0][k], frames)
        np.testing.assert_array_equal(a[0][k], v)
    np.testing.assert_array_equal(frames[..., :3], a[0]["root_position"])
    np.testing.assert_array_equal(frames[..., 3:-1].reshape(8, cfg.window, j, 4), a[0]["rotations"])
    assert all(np.isfinite(v).all() for v in a[0].values()) and (a[0]["length"] > 0).all()
    assert equal(a, b) and not equal(a, c)


def test_resume_is_exact_through_prefetch_and_orbax(cfg, info, tmp_path):
    assert_resumes_exactly(lambda: pipeline.make_train_iterator(cfg, info, seed=3), tmp_path / "ckpt")


def test_slot_batches_visit_every_slot_once_an_epoch_in_a_new_order():
    table = np.repeat(np.arange(50)[:, None], 4, axis=1)
    ds = pipeline.SlotBatches(table, 8, seed=3)
    epochs = np.concatenate([ds[m][:, 0] for m in range(25)]).reshape(4, 50)  # batches cross epochs
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4
    np.testing.assert_array_equal(pipeline.SlotBatches(table, 8, seed=3)[11], ds[11])  # random access
    assert not np.array_equal(pipeline.SlotBatches(table, 8, seed=4)[0], ds[0])
    in_order = pipeline.SlotBatches(table, 8, seed=3, shuffle=False)[6]
    np.testing.assert_array_equal(in_order[:, 0], [48, 49, 0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize("count, block", [(2, 1), (4, 1), (2, 3)])
def test_process_blocks_are_the_one_process_batches(info, cfg, count, block):
    """Each process's rows of every global batch, concatenated in process order, are the one-process
    run's batch: the same slots and the same start draws (per-batch noise is drawn on the device from
    global example indices); with ``block`` batches an element, batch by batch."""
    with pytest.raises(ValueError, match="does not split over 3 processes"):
        pipeline.train_dataset(cfg, info, seed=0, process_index=0, process_count=3)
    one = pipeline.train_dataset(cfg, info, seed=0, block=block)
    shares = [pipeline.train_dataset(cfg, info, seed=0, process_index=i, process_count=count, block=block)
              for i in range(count)]
    b = cfg.batch_size // count
    for want, *parts in zip(take(iter(one), 3), *(take(iter(s), 3) for s in shares), strict=True):
        assert all(p["rotations"].shape[0] == block * b for p in parts)
        for key in want:
            got = np.concatenate([p[key][k * b:(k + 1) * b] for k in range(block) for p in parts])
            np.testing.assert_array_equal(got, want[key], err_msg=key)


def test_device_prefetch_builds_global_sharded_batches(cfg, info):
    mesh = jax.make_mesh((4, 2), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    shardings = feed.span_shardings(mesh, ("root_position", "rotations", "length"))
    host = pipeline.make_train_iterator(cfg, info, seed=5)
    dev = pipeline.make_train_iterator(cfg, info, seed=5, shardings=shardings)
    try:
        expected = take(host, 3)
        for want in expected:
            got = next(dev)
            assert sorted(got) == ["length", "root_position", "rotations"]  # only keys with shardings travel
            assert isinstance(got["rotations"], jax.Array) and got["rotations"].sharding == sharding
            assert len(got["rotations"].addressable_shards) == 8
            assert equal([jax.tree.map(np.asarray, got)], [want])
        state = dev.get_state()
        after = take(dev, 1)
    finally:
        host.close()
        dev.close()
    again = pipeline.make_train_iterator(cfg, info, seed=5, shardings=shardings)
    again.set_state(state)
    assert equal(take(again, 1), after)
    again.close()


def test_a_packed_batch_is_one_transfer_and_unpacks_bit_for_bit(cfg, info):
    """The stream tier's spans travel as one [B, K] array a batch (pipeline.Packed) and come back on
    the device, sharded over data, with every leaf's bits (NaN payloads and extreme ints included)."""
    mesh = jax.make_mesh((4, 2), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    shapes = {"root_position": ((5, 3), np.float32), "length": ((), np.int32), "segment": ((), np.int32)}
    packed = pipeline.Packed(shapes, NamedSharding(mesh, PartitionSpec("data")))
    rng = np.random.default_rng(0)
    batch = {"root_position": rng.normal(size=(8, 5, 3)).astype(np.float32),
             "length": rng.integers(-2**31, 2**31 - 1, 8).astype(np.int32),
             "segment": np.arange(8, dtype=np.int32)}
    batch["root_position"].view(np.uint32)[0, 0, 0] = 0x7FC00123  # a NaN with a payload
    batch["length"][0] = 3  # a float32 denormal when its bits are read as a float
    got = pipeline.to_global(packed, batch)
    assert list(got) == ["packed"] and got["packed"].shape == (8, 15 + 2)
    assert len(got["packed"].addressable_shards) == 8
    out = jax.tree.map(np.asarray, jax.jit(packed.unpack)(got["packed"]))
    for k in shapes:
        assert out[k].dtype == batch[k].dtype
        assert np.array_equal(out[k].view(np.uint32), batch[k].view(np.uint32)), k
    stream = pipeline.make_train_iterator(cfg, info, seed=5)
    spans = next(stream)
    stream.close()
    keys = {"root_position": ((spans["root_position"].shape[1], 3), np.float32), "length": ((), np.int32)}
    one = pipeline.Packed(keys, NamedSharding(mesh, PartitionSpec("data")))
    back = jax.tree.map(np.asarray, jax.jit(one.unpack)(pipeline.to_global(one, spans)["packed"]))
    assert equal([back], [{k: spans[k] for k in keys}])


def test_a_packed_batch_reaches_a_cpu_device_without_a_copy():
    """Packed.pack's array starts at a 64-byte boundary, which XLA:CPU's device_put takes as the device
    buffer itself (numpy's own arrays, 16-byte aligned, are copied): the streamed batch is not copied
    a second time on its way to a CPU device. Fails if jax stops aliasing such arrays (the copy back)."""
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    packed = pipeline.Packed({"root_position": ((81, 3), np.float32), "length": ((), np.int32)}, one)
    batch = {"root_position": np.ones((32, 81, 3), np.float32), "length": np.arange(32, dtype=np.int32)}
    host = packed.pack(batch)
    assert host.ctypes.data % pipeline.HOST_ALIGN == 0 and host.shape == (32, 244)
    on_device = pipeline.to_global(packed, batch)["packed"]
    assert on_device.addressable_data(0).unsafe_buffer_pointer() % pipeline.HOST_ALIGN == 0
    assert jax.device_put(host, one).addressable_data(0).unsafe_buffer_pointer() == host.ctypes.data
    np.testing.assert_array_equal(np.asarray(on_device), host)


def test_one_worker_process_yields_the_in_process_stream(cfg, info):
    c = cfg.copy_and_resolve_references()
    c.prefetch = 0
    local = pipeline.make_train_iterator(c, info, seed=2)
    c.worker_count = 1
    worker = pipeline.make_train_iterator(c, info, seed=2)
    try:
        assert equal(take(worker, 2), take(local, 2))
    finally:
        local.close()
        worker.close()


def test_eval_batches_cover_the_split_deterministically(cfg, info):
    for split in info.splits:
        wins = pipeline.eval_windows(info, split, cfg.window, cfg.eval_stride)
        covered = {(c, s + k) for c, s, e in wins for k in range(cfg.window) if s + k < e}
        assert covered == {(c, t) for c, b, e in info.splits[split] for t in range(b, e)}
        batches = pipeline.make_eval_batches(cfg, info, split)
        assert len(batches) == -(-len(wins) // cfg.batch_size)
        valid = sum(float(b["valid"].sum()) for b in batches)
        assert valid == sum(min(cfg.window, e - s) for _, s, e in wins)
        for b in batches:
            np.testing.assert_array_equal(b["noisy"], b["clean"])  # noise level 0: clean input
            assert b["mask"].sum() == 0
    noisy = pipeline.make_eval_batches(cfg, info, "test", noise_level=1.0)
    assert equal(noisy, pipeline.make_eval_batches(cfg, info, "test", noise_level=1.0))
    assert not np.array_equal(noisy[0]["noisy"], noisy[0]["clean"])


def test_naive_loader_has_the_same_batch_layout(cfg, info):
    naive = next(pipeline.make_naive_train_iterator(cfg, info, seed=0))
    it = feed.Feed(cfg, info, seed=0, mode="stream")
    fed = next(it)
    it.close()
    assert {k: v.shape for k, v in naive.items() if k != "mask"} == {k: v.shape for k, v in fed.items()}


def test_window_sampling_follows_the_dynamics_mixture(cfg, info):
    """Sampled windows' mean dynamics score matches its expectation under (1-w)/N + w·score/S."""
    source = pipeline.ClipSource(info)
    train = info.splits["train"]
    scores = [transforms.segment_windows(source[c]["score"][b:e], cfg.window) for c, b, e in train]
    all_scores = np.concatenate(scores)
    got = {}
    for w in (0.0, 1.0):
        c = cfg.copy_and_resolve_references()
        c.dynamics_sampling = w
        sample = pipeline.SampleWindow(source, info, c)
        rng = np.random.default_rng(0)
        drawn = []
        for _, clip, begin, end in pipeline.train_slots(info, c.window, w):  # one epoch
            win = sample((0, clip, begin, end), rng)
            start = int(np.flatnonzero((source[clip]["root_position"] == win["root_position"][0]).all(1))[0])
            drawn.append(scores[[seg[0] for seg in train].index(clip)][start - begin])
        got[w] = np.mean(drawn)
    expected = {0.0: all_scores.mean(), 1.0: (all_scores**2).sum() / all_scores.sum()}
    np.testing.assert_allclose(got[0.0], expected[0.0], rtol=0.05)
    np.testing.assert_allclose(got[1.0], expected[1.0], rtol=0.05)
    assert expected[1.0] > 1.3 * expected[0.0]  # abrupt windows are drawn markedly more often


def test_short_segments_train_as_edge_padded_windows(cfg, info):
    walk = info.names.index("humanoid3d_walk")
    (seg,) = [s for s in info.splits["train"] if s[0] == walk]
    length = seg[2] - seg[1]
    assert cfg.window / 2 <= length < cfg.window  # 30 frames at 30 fps
    assert any(tuple(s[1:]) == seg for s in pipeline.train_slots(info, cfg.window, cfg.dynamics_sampling))
    span = pipeline.SampleWindow(pipeline.ClipSource(info), info, cfg)((0, *seg), np.random.default_rng(0))
    assert span["length"] == length
    read = transforms.read_window(span["root_position"], span["rotations"], span["length"], cfg.window)
    win = dict(zip(("root_position", "rotations", "valid"), read, strict=True))
    np.testing.assert_array_equal(win["valid"], np.arange(cfg.window) < length)
    clip = pipeline.ClipSource(info)[walk]
    np.testing.assert_array_equal(win["rotations"][:length], clip["rotations"][:length])
    pad = clip["rotations"][[length - 1] * (cfg.window - length)]
    np.testing.assert_array_equal(win["rotations"][length:], pad)
    # Every training clip (run has 19 frames: over half a window) gets slots.
    slots = pipeline.train_slots(info, cfg.window, cfg.dynamics_sampling)
    assert set(slots[:, 1]) == {c for c, _, _ in info.splits["train"]}


def test_speed_augmentation_plays_windows_faster_or_slower(cfg, info):
    """``data.speed_range``: a window at speed 2 is every other frame of the clip, at speed 1/2 every
    other frame is the slerp midpoint of its neighbours; frames past the segment are edge padding
    and marked invalid; off by default (the span is the window itself)."""
    clip_id, begin, end = info.splits["train"][0]
    clip = pipeline.ClipSource(info)[clip_id]
    root, rots = clip["root_position"], clip["rotations"]
    same = lambda a, b: np.abs(np.abs((a * b).sum(-1)) - 1).max() < 1e-6  # noqa: E731 (q ~ -q)
    fast = pipeline._window(clip, begin, end, 8, speed=2.0)
    np.testing.assert_allclose(fast["root_position"], root[begin:begin + 16:2], atol=1e-6)
    assert same(fast["rotations"], rots[begin:begin + 16:2])
    slow = pipeline._window(clip, begin, end, 8, speed=0.5)
    a, b = slice(begin, begin + 4), slice(begin + 1, begin + 5)
    np.testing.assert_allclose(slow["root_position"][1::2], (root[a] + root[b]) / 2, atol=1e-6)
    midpoints = transforms.rot.quat_slerp(rots[a], rots[b], np.full((4, rots.shape[1]), 0.5))
    assert same(slow["rotations"][1::2], midpoints)
    tail = pipeline._window(clip, end - 3, end, 8, speed=1.5)  # frames end-3, -1.5, end, ...: 2 valid
    np.testing.assert_array_equal(tail["valid"], np.arange(8) < 2)
    np.testing.assert_allclose(tail["root_position"][2:], root[[end - 1] * 6], atol=1e-6)
    assert cfg.speed_range == 1.0
    sample = pipeline.SampleWindow(pipeline.ClipSource(info), info, cfg)
    span = sample((0, clip_id, begin, end), np.random.default_rng(3))
    cdf = sample._segment(clip_id, begin, end)["cdf"]
    start = begin + int(np.searchsorted(cdf, np.random.default_rng(3).random() * cdf[-1], side="right"))
    np.testing.assert_array_equal(span["rotations"], rots[start:start + cfg.window])
    faster = cfg.copy_and_resolve_references()
    faster.speed_range = 1.25
    longer = pipeline.SampleWindow(pipeline.ClipSource(info), info, faster)((0, clip_id, begin, end),
                                                                            np.random.default_rng(3))
    assert longer["rotations"].shape[0] == transforms.span_frames(cfg.window, 1.25) > cfg.window
    np.testing.assert_array_equal(longer["rotations"][:cfg.window], span["rotations"])  # the same start


def _plain_and_augmented(cfg, info, slot, seed: int, **augmentation) -> tuple[dict, dict]:
    """The window of ``slot`` read (:func:`pipeline.host_window`, the device path's transforms in numpy)
    with the config as is (each augmentation off) and with ``augmentation`` set, from the same draws."""
    assert all(cfg[k] == 0.0 for k in augmentation)
    augmented_cfg = cfg.copy_and_resolve_references()
    augmented_cfg.update(augmentation)
    span = pipeline.SampleWindow(pipeline.ClipSource(info), info, cfg)(slot, np.random.default_rng(seed))
    return tuple(pipeline.host_window(span, c, info.skeleton, np.random.default_rng(seed))
                 for c in (cfg, augmented_cfg))


def test_reverse_augmentation_plays_windows_backwards(cfg, info):
    """``data.reverse_prob``: a reversed window is the forward window (same start draw) with its
    frames, root and validity flipped in time (off by default)."""
    clip_id, begin, end = info.splits["train"][0]
    slot = (0, clip_id, begin, begin + cfg.window // 2)  # shorter than a window: padded, flipped too
    fwd, bwd = _plain_and_augmented(cfg, info, slot, 5, reverse_prob=1.0)
    assert fwd.keys() == bwd.keys() and "valid" in fwd
    assert not fwd["valid"].all()  # the window runs past the segment: its padding moves to the front
    for key in fwd:
        expected = fwd[key] if key == "offsets" else fwd[key][::-1]  # bones are per clip, not per frame
        np.testing.assert_array_equal(bwd[key], expected, err_msg=key)


def test_pose_offset_turns_each_joint_by_one_rotation_for_the_whole_window(cfg, info):
    """``data.pose_offset``: the window is the plain one (same start draw) with each non-root joint
    turned by one rotation in every frame; the root, its trajectory and the validity are untouched.
    The angle between the two rotations, 2·acos|⟨q, q'⟩|, is the relative rotation's whatever the
    quaternion convention: the same in every frame, zero at the root."""
    clip_id, begin, end = info.splits["train"][0]
    slot = (0, clip_id, begin, end)
    a, b = _plain_and_augmented(cfg, info, slot, 7, pose_offset=0.2)
    np.testing.assert_array_equal(a["root_position"], b["root_position"])
    np.testing.assert_array_equal(a["valid"], b["valid"])
    dot = np.abs(np.sum(a["rotations"].astype(np.float64) * b["rotations"], axis=-1))  # [T, J]
    angle = 2 * np.arccos(np.clip(dot, 0.0, 1.0))
    assert np.all(angle[:, 0] < 1e-3)
    np.testing.assert_allclose(angle, np.broadcast_to(angle[:1], angle.shape), atol=2e-3)
    moved = angle[0, info.skeleton.ball_mask.astype(bool)][1:]
    assert 0.05 < np.median(moved) < 1.0, moved  # ~ 0.2·√3 for a ball joint


def test_bad_records_in_shards_are_skipped_with_a_warning(cfg, tmp_path, caplog):
    from array_record.python.array_record_module import ArrayRecordWriter
    motions = [read_deepmimic(p) for p in deepmimic_clip_paths()[:2]]
    motions.append(Motion(motions[0].skeleton, 30.0, motions[0].root_position, motions[0].rotations,
                          name="humanoid3d_spinkick"))  # a test clip: out of the stats
    info = prepare.write_dataset(motions, tmp_path, fps=cfg.fps, window=cfg.window, progress=False)
    # Corrupt clip 1 on disk after preparation (bit rot, a buggy writer): NaNs in its root.
    src = pipeline.ClipSource(info)
    clips = [src[i] for i in range(3)]
    writer = ArrayRecordWriter(info.shard_paths()[0], "group_size:1")
    for i, c in enumerate(clips):
        root = np.full_like(c["root_position"], np.nan) if i == 1 else c["root_position"]
        writer.write(records.encode_record(c["name"], root, c["rotations"], c["score"]))
    writer.close()
    it = pipeline.make_train_iterator(cfg, info, seed=0)
    with caplog.at_level(logging.WARNING):
        batches = take(it, 4)
    it.close()
    assert all(np.isfinite(b["root_position"]).all() for b in batches)
    assert "humanoid3d_cartwheel" in caplog.text and "NaN" in caplog.text
    strict = cfg.copy_and_resolve_references()
    strict.strict = True
    it = pipeline.make_train_iterator(strict, info, seed=0)
    with pytest.raises(records.BadRecordError, match="humanoid3d_cartwheel"):
        take(it, 4)
    it.close()


def test_config_mismatch_is_a_clear_error(cfg, info):
    c = cfg.copy_and_resolve_references()
    c.window = 48
    with pytest.raises(ValueError, match="window=32"):
        pipeline.make_train_iterator(c, info, seed=0)


def test_synthetic_corpus_streams_without_storage(cfg):
    c = cfg.copy_and_resolve_references()
    c.source, c.synthetic_clips, c.synthetic_frames = "synthetic", 40, 64
    info = pipeline.dataset_info(c)
    assert info.data_dir == "" and len(info.names) == 40 and info.shards == ()
    it = pipeline.make_train_iterator(c, info, seed=0)
    batch = next(it)
    it.close()
    assert batch["rotations"].shape == (c.batch_size, c.window, info.skeleton.num_joints, 4)
    assert np.isfinite(batch["rotations"]).all() and (batch["length"] >= c.window).all()
    # The held-out tails (13 frames each) evaluate as padded windows.
    batches = pipeline.make_eval_batches(c, info, "validation")
    assert len(batches) == 40 // c.batch_size and sum(float(b["valid"].sum()) for b in batches) == 40 * 13


def test_canonical_height_scales_every_body_to_it(cfg, info):
    """``data.canonical_height``: each window's motion and bones are scaled by the height over the
    skeleton's standing root height (uniform retargeting): root positions and clip offsets of the
    same windows come out multiplied by exactly that ratio, rotations unchanged."""
    scaled = cfg.copy_and_resolve_references()
    scaled.canonical_height = 2.0 * transforms.rest_height(info.skeleton)
    plain_cfg = cfg.copy_and_resolve_references()
    for c in (scaled, plain_cfg):
        c.update(rot_noise=0.0, pos_noise=0.0, joint_mask_prob=0.0, frame_mask_prob=0.0, time_warp=0.0,
                 mirror_prob=0.0)
    windows = [pipeline.make_eval_batches(c, info, "validation")[0] for c in (plain_cfg, scaled)]
    mean, std = info.mean, info.std
    decode = lambda b: features_of(b["clean"], mean, std, info.skeleton)
    (root0, rot0), (root2, rot2) = decode(windows[0]), decode(windows[1])
    np.testing.assert_allclose(root2, 2.0 * root0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rot2, rot0, atol=1e-5)
    np.testing.assert_allclose(windows[1]["offsets"], 2.0 * windows[0]["offsets"], rtol=1e-6)


def features_of(x, mean, std, skeleton):
    """Standardized windows ``[B, N, C, F]`` -> ``(root [B, T, 3], rotation matrices)``."""
    from motionjax.core import features, rotations
    root, quats = features.unpack(skeleton, features.destandardize(x.reshape(x.shape[0], -1, x.shape[-1]),
                                                                   mean, std))
    return np.asarray(root), np.asarray(rotations.quat_to_matrix(quats))


def test_std_floor_raises_only_the_smallest_stds(cfg, info):
    """``data.std_floor``: features that barely move in training standardize with the floor (#34)."""
    floored = cfg.copy_and_resolve_references()
    floored.std_floor = 0.05
    got = pipeline.dataset_info(floored)
    low = info.std < 0.05
    assert low.any() and (~low).any()
    np.testing.assert_array_equal(got.std[~low], info.std[~low])
    np.testing.assert_array_equal(got.std[low], np.float32(0.05))
    np.testing.assert_array_equal(got.mean, info.mean)


def test_the_host_cache_keeps_dynamic_segments_longest_and_counts_hits():
    """:class:`pipeline.SegmentCache`: over capacity the calmest segment goes first (the oldest among
    equals); a segment larger than the cache is not kept and evicts nothing; hits and misses count."""
    cache = pipeline.SegmentCache(capacity=300)
    for key, priority in (("calm", 1.0), ("burst", 9.0), ("mid", 5.0)):
        assert cache.get(key) is None
        cache.put(key, key.upper(), 100, priority)
    cache.put("new", "NEW", 100, 3.0)  # full: "calm" goes, not the oldest-but-dynamic "burst"
    assert cache.get("calm") is None and cache.get("burst") == "BURST" and cache.get("new") == "NEW"
    cache.put("huge", "HUGE", 301, 99.0)
    assert cache.get("huge") is None and cache.get("mid") == "MID"
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"], stats["segments"]) == (3, 5, 1, 3)
    assert stats["hit_rate"] == 3 / 8


def test_a_small_host_cache_still_yields_the_same_spans(cfg, info):
    """The cache changes what is read when, never what is drawn: the span stream with a cache that
    holds one segment equals the stream with one that holds them all, and misses more."""
    tiny = cfg.copy_and_resolve_references()
    tiny.host_cache_mb = 0.01
    samplers = {k: [] for k in ("all", "tiny")}
    its = {k: pipeline.make_train_iterator(c, info, seed=4, sampler=samplers[k])
           for k, c in (("all", cfg), ("tiny", tiny))}
    try:
        got = {k: take(it, 6) for k, it in its.items()}
    finally:
        for it in its.values():
            it.close()
    assert equal(got["all"], got["tiny"])
    full, small = (samplers[k][0].cache.stats() for k in ("all", "tiny"))
    assert small["hit_rate"] < full["hit_rate"] and small["evictions"] > 0 and full["evictions"] == 0


@pytest.mark.parametrize("loss_aware", [False, True])
def test_a_batch_draws_each_row_as_the_per_row_reference_and_gathers_into_the_wire(cfg, info, loss_aware):
    """SampleBatch locates a batch's rows in one loop and gathers them, optionally straight into the
    wire (Packed.empty): every row is the span a per-row reference computes from the raw clip record
    (the start the u-quantile of the segment's window distribution, read_rows of its frame rows, the
    floor by stored_floor), for the same uniforms; the wire is Packed.pack of the unpacked batch, aligned."""
    c = cfg.copy_and_resolve_references()
    c.update(speed_range=1.25, dynamics_sampling=0.5)  # spans past the window, a non-uniform start draw
    source = pipeline.ClipSource(info)
    table = (pipeline.segment_rows(info, np.arange(len(info.splits["train"]) // 3)) if loss_aware
             else pipeline.train_slots(info, c.window, c.dynamics_sampling))
    sample = pipeline.SampleWindow(source, info, c, name_segment=loss_aware)
    j, s = info.skeleton.num_joints, sample.span
    shapes = {"frames": ((s, 3 + 4 * j + 1), np.float32), "length": ((), np.int32),
              "offsets": ((j, 3), np.float32)} | ({"segment": ((), np.int32)} if loss_aware else {})
    packed = pipeline.Packed(shapes, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    plain, wired = pipeline.SampleBatch(sample, table), pipeline.SampleBatch(sample, table, wire=packed)
    num, total = pipeline._window_totals(info)
    past_end = 0
    for m, slots in enumerate(pipeline.SlotBatches(table, c.batch_size, seed=3)[:6]):
        got, into = plain(slots, np.random.default_rng(m)), wired(slots, np.random.default_rng(m))
        u = np.random.default_rng(m).random(len(slots))
        for i, (segment, clip_id, begin, end) in enumerate(slots):
            clip = source[clip_id]
            scores = transforms.segment_windows(clip["score"][begin:end], c.window)
            cdf = np.cumsum(transforms.window_weights(scores, c.dynamics_sampling, num, total))
            start = min(int(np.searchsorted(cdf, u[i] * cdf[-1], side="right")), cdf.size - 1)
            root, rotations = clip["root_position"][begin:end], clip["rotations"][begin:end]
            lowest = transforms.stored_floor(info.skeleton, root, rotations, clip["offsets"])
            rows = np.concatenate([root.reshape(len(root), -1), rotations.reshape(len(root), -1),
                                   lowest[:, None]], axis=1).astype(np.float32)
            np.testing.assert_array_equal(got["frames"][i], transforms.read_rows(rows, start, len(rows), s))
            assert got["length"][i] == end - begin - start
            past_end += got["length"][i] < s
            np.testing.assert_array_equal(got["offsets"][i], clip["offsets"])
            if loss_aware:
                assert got["segment"][i] == segment
        assert into["packed"].ctypes.data % pipeline.HOST_ALIGN == 0
        assert packed.pack(into) is into["packed"]
        np.testing.assert_array_equal(into["packed"], packed.pack({k: got[k] for k in shapes}))
        for k in ("root_position", "rotations", "lowest"):
            assert np.shares_memory(into[k], into["packed"])
    assert past_end  # some spans ran past their segment's end (the repeated last frame checked too)
