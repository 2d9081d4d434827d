"""Held-out metrics (motionjax.evaluation) against independent numpy/scipy references."""
import numpy as np
from scipy.spatial.transform import Rotation

from motionjax.core.skeleton import deepmimic_humanoid
from motionjax.evaluation import metrics

SKELETON = deepmimic_humanoid()
FPS = 30.0


def _poses(seed, b=2, t=6):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(b, t, SKELETON.num_joints, 3)).astype(np.float32) * 0.3


def test_mpjpe_is_root_relative_and_global_adds_the_root_error():
    true, pred = _poses(0), _poses(1)
    m = metrics.motion_metrics(SKELETON, FPS, pred, true)
    rel = lambda p: p - p[..., :1, :]
    error = lambda a, b: 100 * np.linalg.norm(a - b, axis=-1).mean()  # cm
    np.testing.assert_allclose(m["mpjpe"], error(rel(pred), rel(true)), rtol=1e-5)
    np.testing.assert_allclose(m["mpjpe_global"], error(pred, true), rtol=1e-5)
    # Moving the whole predicted body by a per-frame offset changes the global error, not MPJPE.
    shift = np.random.default_rng(2).normal(size=(2, 6, 1, 3)).astype(np.float32)
    moved = metrics.motion_metrics(SKELETON, FPS, true + shift, true)
    assert moved["mpjpe"] < 1e-4
    np.testing.assert_allclose(moved["mpjpe_global"], 100 * np.linalg.norm(shift, axis=-1).mean(), rtol=1e-5)
    np.testing.assert_allclose(moved["root_error"], moved["mpjpe_global"], rtol=1e-5)


def test_pa_mpjpe_matches_a_scipy_kabsch_alignment():
    true, pred = _poses(3, b=1, t=3), _poses(4, b=1, t=3)
    errors = []
    for p, y in zip(pred[0].astype(np.float64), true[0].astype(np.float64), strict=True):
        x, yc = p - p.mean(0), y - y.mean(0)
        r, _ = Rotation.align_vectors(yc, x)  # rotation taking x onto yc, least squares
        x = r.apply(x)
        scale = np.sum(x * yc) / np.sum(x * x)  # optimal scale given the rotation
        errors.append(np.linalg.norm(scale * x - yc, axis=-1).mean())
    m = metrics.motion_metrics(SKELETON, FPS, pred, true)
    np.testing.assert_allclose(m["pa_mpjpe"], 100 * np.mean(errors), rtol=1e-4)
    # A similarity transform of the truth aligns to zero error.
    rotated = Rotation.from_rotvec([0.3, -1.0, 0.5]).apply(true.reshape(-1, 3)).reshape(true.shape)
    similar = 1.3 * rotated + 0.7
    assert metrics.motion_metrics(SKELETON, FPS, similar.astype(np.float32), true)["pa_mpjpe"] < 1e-3


def test_jitter_and_bone_error_match_numpy_references():
    true, pred = _poses(5, t=8), _poses(6, t=8)
    m = metrics.motion_metrics(SKELETON, FPS, pred, true)
    jerk = np.diff(pred.astype(np.float64), 3, axis=1) * FPS**3
    np.testing.assert_allclose(m["jitter"], np.linalg.norm(jerk, axis=-1).mean(), rtol=1e-4)
    parents = np.asarray(SKELETON.parents)[1:]
    bones = lambda p: np.linalg.norm(p[..., 1:, :] - p[..., parents, :], axis=-1)
    np.testing.assert_allclose(m["bone_error"], 100 * np.abs(bones(pred) - bones(true)).mean(), rtol=1e-4)
    # A rigid motion of the truth keeps every bone length: zero bone error, non-zero MPJPE.
    rotated = Rotation.from_rotvec([0.0, 0.7, 0.0]).apply(true.reshape(-1, 3)).reshape(true.shape)
    moved = metrics.motion_metrics(SKELETON, FPS, rotated.astype(np.float32), true)
    assert moved["bone_error"] < 1e-4 and moved["mpjpe"] > 1.0


def _clip_batches():
    """Two eval batches of features on the DeepMimic skeleton with per-window offsets and clip ids."""
    from motionjax.core import features as feat
    from motionjax.core import rotations as rot
    rng = np.random.default_rng(0)
    f = feat.feature_dim(SKELETON)
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    batches = []
    for seed in range(2):
        q = rot.quat_normalize(rng.normal(size=(3, 8, SKELETON.num_joints, 4)))
        clean = feat.pack(SKELETON, rng.normal(size=(3, 8, 3)), q).astype(np.float32)
        batches.append({"clean": clean.reshape(3, 2, 4, f), "noisy": clean.reshape(3, 2, 4, f) * 1.1,
                        "valid": np.ones((3, 2, 4, 1), np.float32),
                        "offsets": (SKELETON.offsets * rng.uniform(0.8, 1.2, (3, 1, 1))).astype(np.float32),
                        "clip": np.array([0, 1, 2]) if seed == 0 else np.array([2, 2, 1])})
    return batches, mean, std


def test_evaluate_uses_each_windows_offsets_and_breaks_mpjpe_down_by_label():
    batches, mean, std = _clip_batches()
    labels = ({"content": "walk", "style": "happy"}, {"content": "run", "style": "happy"},
              {"content": "walk", "style": "sad"})
    shrink = lambda x: x + 0.2  # a shift of the 6D features turns every joint
    out = metrics.evaluate(shrink, batches, SKELETON, FPS, mean, std, 0.3, labels=labels)
    # Independent reference: per-window FK on that window's offsets, then the plain MPJPE formula.
    errors = {}
    for b in batches:
        for i, clip in enumerate(b["clip"]):
            pos = lambda x, b=b, i=i: np.asarray(metrics.feature_positions(
                SKELETON, x[i].reshape(8, -1), mean, std, b["offsets"][i]))
            p, t = pos(shrink(b["noisy"])), pos(b["clean"])
            errors.setdefault(int(clip), []).append(
                100 * np.linalg.norm((p - p[:, :1]) - (t - t[:, :1]), axis=-1).mean())
    window_mean = lambda clips: np.mean([e for c in clips for e in errors[c]])
    np.testing.assert_allclose(out["mpjpe"], window_mean([0, 1, 2]), rtol=1e-4)
    by = out["by_label"]
    np.testing.assert_allclose(by["content"]["walk"]["mpjpe"], window_mean([0, 2]), rtol=1e-4)
    np.testing.assert_allclose(by["style"]["happy"]["mpjpe"], window_mean([0, 1]), rtol=1e-4)
    assert by["content"]["run"]["frames"] == 8 * len(errors[1])
    # The skeleton's own offsets give other positions: the offsets were used.
    plain = [dict(b, offsets=None) for b in batches]
    other = metrics.evaluate(shrink, plain, SKELETON, FPS, mean, std, 0.3)["mpjpe"]
    assert abs(other - out["mpjpe"]) > 1e-3


def test_evaluator_results_merge_rows_whatever_the_order():
    """Two evaluators of one split and input (the held-out one during training, the final one with its
    reference rows) add up to one row with every method, in either order (ConfigDict sorts names)."""
    from motionjax.evaluation import evaluators

    heldout = lambda predict, workdir=None: {"validation": {"clean": {"model": {"mpjpe": 1.0}}}}
    final = lambda predict, workdir=None: {"validation": {"clean": {"model": {"mpjpe": 1.0},
                                                                    "pca": {"mpjpe": 3.0}}},
                                           "test": {"noisy": {"model": {"mpjpe": 2.0}}}}
    for order in ({"a": heldout, "b": final}, {"a": final, "b": heldout}):
        results = evaluators.run(order, predict=None)
        assert sorted(results["validation"]["clean"]) == ["model", "pca"]
        assert results["test"]["noisy"]["model"]["mpjpe"] == 2.0
