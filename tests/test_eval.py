"""Held-out metrics (motionjax.eval) against independent numpy/scipy references."""
import numpy as np
from scipy.spatial.transform import Rotation

from motionjax import eval as evaluation
from motionjax.skeleton import deepmimic_humanoid

SKELETON = deepmimic_humanoid()
FPS = 30.0


def _poses(seed, b=2, t=6):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(b, t, SKELETON.num_joints, 3)).astype(np.float32) * 0.3


def test_mpjpe_is_root_relative_and_global_adds_the_root_error():
    true, pred = _poses(0), _poses(1)
    m = evaluation.motion_metrics(SKELETON, FPS, pred, true)
    rel = lambda p: p - p[..., :1, :]
    error = lambda a, b: 100 * np.linalg.norm(a - b, axis=-1).mean()  # cm
    np.testing.assert_allclose(m["mpjpe"], error(rel(pred), rel(true)), rtol=1e-5)
    np.testing.assert_allclose(m["mpjpe_global"], error(pred, true), rtol=1e-5)
    # Moving the whole predicted body by a per-frame offset changes the global error, not MPJPE.
    shift = np.random.default_rng(2).normal(size=(2, 6, 1, 3)).astype(np.float32)
    moved = evaluation.motion_metrics(SKELETON, FPS, true + shift, true)
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
    m = evaluation.motion_metrics(SKELETON, FPS, pred, true)
    np.testing.assert_allclose(m["pa_mpjpe"], 100 * np.mean(errors), rtol=1e-4)
    # A similarity transform of the truth aligns to zero error.
    rotated = Rotation.from_rotvec([0.3, -1.0, 0.5]).apply(true.reshape(-1, 3)).reshape(true.shape)
    similar = 1.3 * rotated + 0.7
    assert evaluation.motion_metrics(SKELETON, FPS, similar.astype(np.float32), true)["pa_mpjpe"] < 1e-3
