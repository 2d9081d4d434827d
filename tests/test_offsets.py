"""Several performers in one corpus (``data.bones``): batches carry each clip's rest offsets, and FK
in the loader (floor, mirroring), the training loss and the metrics runs on them."""
import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from motionjax import losses, parallel, train
from motionjax.configs.base import get_config
from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.data import feed, pipeline, prepare, records, transforms
from motionjax.evaluation import metrics
from motionjax.formats import Motion, deepmimic_clip_paths, read_deepmimic
from runs import runlocal_config

SPLITS = (("train", "rest"), ("validation", "tail:0.25"))


def _performer_b(skeleton):
    """A taller performer (bones x1.1) whose left leg is 3 cm longer than the right: a body whose
    two sides are not mirror images."""
    offsets = skeleton.offsets * 1.1
    left_knee = next(j for j, n in enumerate(skeleton.names) if "knee" in n.lower() and "left" in n.lower())
    offsets[left_knee, skeleton.up_axis] -= 0.03
    return skeleton.replace(offsets=offsets)


@pytest.fixture(scope="module")
def two_performers(tmp_path_factory):
    """Five DeepMimic clips, two of them re-recorded by performer B (clips 1 and 3); the dataset
    skeleton (the per-joint median) is performer A's."""
    motions = [read_deepmimic(p) for p in deepmimic_clip_paths()[:5]]
    b = _performer_b(motions[0].skeleton)
    for i in (1, 3):
        motions[i] = Motion(b, motions[i].fps, motions[i].root_position, motions[i].rotations,
                            name=motions[i].name)
    out = tmp_path_factory.mktemp("two_performers")
    info = prepare.write_dataset(motions, out, splits=SPLITS, progress=False)
    return info, motions


def _cfg(bones="clip", **changes):
    c = get_config().data
    c.update(batch_size=8, splits=dict(SPLITS), bones=bones, **changes)
    return c


def _records(info):
    """Every clip's record, decoded straight from the shards (the reference)."""
    source = grain.sources.ArrayRecordDataSource([str(p) for p in info.shard_paths()])
    return [records.decode_record(source[i]) for i in range(len(source))]


def _distances(positions):
    """Pairwise joint distances ``[..., J, J]``: unchanged by the window's turn, shift or mirror."""
    return np.linalg.norm(positions[..., :, None, :] - positions[..., None, :, :], axis=-1)


def _batch_positions(info, batch, key="clean"):
    """FK of a batch's standardized features ``[B, N, C, F]`` on its offsets: ``[B, T, J, 3]``."""
    b = batch[key].shape[0]
    return np.asarray(metrics.feature_positions(info.skeleton, batch[key].reshape(b, -1, info.feature_dim),
                                                   info.mean, info.std, batch.get("offsets")))


def test_mirror_offsets_make_the_mirrored_window_the_reflection():
    """FK of a mirrored window on the mirrored offsets is the reflection of FK of the window, for a
    body whose sides differ; symmetric offsets come back unchanged."""
    rng = np.random.default_rng(0)
    skeleton = read_deepmimic(deepmimic_clip_paths()[0]).skeleton
    offsets = _performer_b(skeleton).offsets
    root = rng.normal(size=(2, 6, 3))
    quats = rot.quat_normalize(rng.normal(size=(2, 6, skeleton.num_joints, 4)))
    m_root, m_quats = transforms.mirror(skeleton, root, quats)
    got = forward_kinematics(skeleton, m_quats, m_root, transforms.mirror_offsets(skeleton, offsets))[0]
    flip = np.ones(3)
    flip[skeleton.lateral_axis] = -1
    want = forward_kinematics(skeleton, quats, root, offsets)[0][..., skeleton.symmetry, :] * flip
    np.testing.assert_allclose(got, want, atol=1e-9)
    wrong = forward_kinematics(skeleton, m_quats, m_root, offsets)[0]  # the clip's own offsets: not it
    assert np.abs(wrong - want).max() > 0.01
    same = transforms.mirror_offsets(skeleton, skeleton.offsets)
    np.testing.assert_allclose(same, skeleton.offsets, atol=1e-6)


def test_batches_carry_each_clips_offsets(two_performers):
    """Eval, Grain and naive batches: ``offsets`` rows are the records' offsets (mirrored with a
    mirrored window); the clean windows' bodies are the recorded ones (FK distances of a window
    equal those of its record's frames on the record's offsets) in "clip" mode and not in
    "canonical" mode; canonical batches carry no offsets."""
    info, _ = two_performers
    recs = _records(info)
    assert transforms.mirrorable(info.skeleton)  # the median body is performer A's
    b_rows = {1, 3}
    cfg = _cfg()
    batches = pipeline.make_eval_batches(cfg, info, "train")
    windows = pipeline.eval_windows(info, "train", cfg.window, cfg.eval_stride)
    row = 0
    for batch in batches:
        assert batch["offsets"].shape == (cfg.batch_size, info.skeleton.num_joints, 3)
        assert batch["offsets"].dtype == np.float32
        pos = _batch_positions(info, batch)
        for i, c in enumerate(batch["clip"]):
            if c < 0:
                continue
            np.testing.assert_array_equal(batch["offsets"][i], recs[c]["offsets"])
            _, start, end = windows[row]
            row += 1
            idx = np.minimum(np.arange(start, start + cfg.window), end - 1)
            ref = forward_kinematics(info.skeleton.replace(offsets=recs[c]["offsets"].astype(np.float64)),
                                     recs[c]["rotations"][idx], recs[c]["root_position"][idx])[0]
            np.testing.assert_allclose(_distances(pos[i]), _distances(ref), atol=2e-4)
    assert row == len(windows) and {c for c, *_ in windows} >= b_rows
    # "canonical": the dataset skeleton for every clip, so performer B's windows change body.
    canonical = pipeline.make_eval_batches(_cfg("canonical"), info, "train")
    assert all("offsets" not in b for b in canonical)
    j = next(j for j, b in enumerate(batches) if 1 in b["clip"])
    i = int(np.argmax(batches[j]["clip"] == 1))
    diff = np.abs(_distances(_batch_positions(info, canonical[j])[i])
                  - _distances(_batch_positions(info, batches[j])[i])).max()
    assert diff > 0.02
    # Training streams, every window mirrored: performer B's rows carry B's offsets mirrored.
    allowed = {tuple(np.round(r["offsets"].ravel(), 6)) for r in recs}
    mirrored = {tuple(np.round(transforms.mirror_offsets(info.skeleton, recs[c]["offsets"]).ravel(), 6))
                for c in b_rows}
    train_cfg = _cfg(mirror_prob=1.0)
    it = feed.Feed(train_cfg, info, seed=0)
    grain_rows = np.concatenate([np.asarray(next(it)["offsets"]) for _ in range(4)])
    it.close()
    naive = pipeline.make_naive_train_iterator(train_cfg, info, seed=0)
    naive_rows = np.concatenate([next(naive)["offsets"] for _ in range(2)])
    for rows in (grain_rows, naive_rows):
        seen = {tuple(np.round(r.ravel(), 6)) for r in rows}
        assert seen <= (allowed - {tuple(np.round(recs[c]["offsets"].ravel(), 6)) for c in b_rows}) | mirrored
        assert seen & mirrored  # performer B drawn at least once


def test_train_step_loss_is_each_windows_loss_on_its_own_skeleton(two_performers):
    """One train step on a 2 x 4 (data x time) mesh, batch with per-window offsets (both
    performers): its loss and terms (dynamics included) equal the mean over windows of
    ``reconstruction_loss`` run unsharded, window by window, on ``Skeleton.replace(offsets=...)``;
    and differ from the loss on the dataset skeleton. The offsets are sharded over data only."""
    info, _ = two_performers
    config = runlocal_config("unused", (("data", 2), ("time", 4)))
    config.data.update(splits=dict(SPLITS), bones="clip")
    config.loss.update(foot=0.0, dynamics_weight=1.0)  # foot: a mean over planted frames, not per window
    mesh = parallel.make_mesh(config.mesh, jax.devices()[:8])
    rows = [(b, i) for b in pipeline.make_eval_batches(config.data, info, "train", noise_level=1.0)
            for i in range(len(b["clip"])) if b["clip"][i] >= 0]
    rows = rows[::max(1, len(rows) // 8)][:8]  # windows spread over the clips
    batch = {k: np.stack([b[k][i] for b, i in rows]) for k in ("noisy", "clean", "offsets")}
    assert len({r.tobytes() for r in batch["offsets"]}) == 2
    step, state, _, eval_graphdef = train.build_train_step(config, info, mesh)
    model = jax.jit(lambda p, r, x: nnx.merge(eval_graphdef, p, r)(x))
    pred = np.asarray(model(state["params"], state["rest"], batch["noisy"]))
    # The reference, unsharded: the windows of each performer on Skeleton.replace(offsets=theirs)
    # (every window has the same number of frames, so the batch means are means over windows).
    t, f = config.data.window, info.feature_dim
    flat = lambda x: jnp.asarray(x.reshape(len(x), t, f))

    def reference(skeleton, rows):
        loss = jax.jit(lambda p, c: losses.reconstruction_loss(config.loss, skeleton, float(info.fps), p, c,
                                                               info.mean, info.std))
        return loss(flat(pred[rows]), flat(batch["clean"][rows]))

    groups = {}
    for i, o in enumerate(batch["offsets"]):
        groups.setdefault(o.tobytes(), []).append(i)
    parts = [(len(rows), reference(info.skeleton.replace(offsets=batch["offsets"][rows[0]]), rows))
             for rows in groups.values()]
    mean = lambda get: sum(n * float(get(r)) for n, r in parts) / 8
    global_batch = pipeline.to_global(parallel.batch_shardings(mesh, ("noisy", "clean", "offsets")), batch)
    assert global_batch["offsets"].sharding.spec == PartitionSpec("data", None, None)
    _, metrics = step(jax.tree.map(jnp.copy, state), global_batch)
    np.testing.assert_allclose(float(metrics["loss"]), mean(lambda r: r[0]), rtol=2e-4)
    for k in ("rotation", "position", "pose", "dynamics"):
        np.testing.assert_allclose(float(metrics[k]), mean(lambda r, k=k: r[1][k]), rtol=2e-4, err_msg=k)
    # On the dataset skeleton (the "canonical" body) performer B's windows score otherwise.
    plain = reference(info.skeleton, np.arange(8))[1]["position"]
    assert abs(float(plain) - float(metrics["position"])) > 1e-3 * float(metrics["position"])


def test_clip_and_canonical_agree_on_a_single_skeleton_corpus(deepmimic_dir):
    """DeepMimic has one skeleton: both modes give the same batches and the same metrics."""
    cfgs = {}
    for bones in ("clip", "canonical"):
        cfgs[bones] = get_config().data
        cfgs[bones].update(dir=str(deepmimic_dir), batch_size=8, bones=bones)
    info = pipeline.dataset_info(cfgs["clip"])
    evals = {k: pipeline.make_eval_batches(c, info, "validation", noise_level=1.0) for k, c in cfgs.items()}
    for a, b in zip(evals["clip"], evals["canonical"], strict=True):
        np.testing.assert_allclose(a["offsets"], np.broadcast_to(info.skeleton.offsets, a["offsets"].shape),
                                   atol=1e-7)
        for k in b:
            np.testing.assert_allclose(a[k], b[k], atol=2e-5, err_msg=k)
    results = {k: metrics.evaluate(lambda x: x * 0.9, batches, info.skeleton, info.fps, info.mean,
                                      info.std, 0.3) for k, batches in evals.items()}
    for k, v in results["canonical"].items():
        np.testing.assert_allclose(results["clip"][k], v, rtol=1e-4, atol=1e-6, err_msg=k)
    its = {k: feed.Feed(c, info, seed=1) for k, c in cfgs.items()}
    a, b = next(its["clip"]), next(its["canonical"])
    for it in its.values():
        it.close()
    for k in b:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), atol=2e-5, err_msg=k)


def test_sharded_train_batches_put_offsets_over_data_only(deepmimic_dir):
    cfg = get_config().data
    cfg.update(dir=str(deepmimic_dir), batch_size=8)
    info = pipeline.dataset_info(cfg)
    mesh = jax.make_mesh((4, 2), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharding = NamedSharding(mesh, PartitionSpec("data", "time", None, None))
    host, dev = (feed.Feed(cfg, info, m, seed=2) for m in (None, mesh))
    want, got = next(host), next(dev)
    host.close()
    dev.close()
    assert got["offsets"].sharding == NamedSharding(mesh, PartitionSpec("data", None, None))
    assert got["noisy"].sharding == sharding
    for k in got:  # one device or eight: the same windows, draws and transforms
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), atol=1e-5, err_msg=k)
