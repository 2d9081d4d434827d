"""The band term of the physics guidance (motionjax.generation.flow.band_skating): its value against an
independent numpy reference, its gradient against finite differences, and that descending it lowers the
papers' skating ratio (motionjax.evaluation.plausibility.skating_pairs) and leaves a planted foot alone,
on joint positions built by hand (no model: seconds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

FPS, BAND, UP = 30.0, 0.02, 1


def _reference(foot: np.ndarray) -> np.ndarray:
    """``foot [B, T, K, 3]`` -> ``[B]``: the mean over frame pairs and joints of (soft in the band in both
    frames) x (horizontal speed of the step)², written out with numpy."""
    h = foot[..., UP]
    inside = 1 / (1 + np.exp(-(BAND - h) / (BAND / 4)))
    step = foot[:, 1:] - foot[:, :-1]
    speed2 = (step[..., 0] ** 2 + step[..., 2] ** 2) * FPS**2
    return (inside[:, 1:] * inside[:, :-1] * speed2).mean((1, 2))


def _toy(rng, b: int = 3, t: int = 24) -> np.ndarray:
    """Two toes per window: heights around the band (some pairs in it, some out), random horizontal steps
    of ~1 m/s (above the papers' 0.5 m/s)."""
    foot = np.zeros((b, t, 2, 3), np.float32)
    foot[..., UP] = rng.uniform(0.0, 0.04, (b, t, 2))
    foot[..., 0] = np.cumsum(rng.normal(0, 1.0 / FPS, (b, t, 2)), axis=1)
    foot[..., 2] = np.cumsum(rng.normal(0, 1.0 / FPS, (b, t, 2)), axis=1)
    return foot


def test_band_skating_matches_a_numpy_reference_and_finite_differences():
    from motionjax.generation import flow

    foot = _toy(np.random.default_rng(0))
    cost = lambda x: flow.band_skating(x, UP, FPS, BAND)  # noqa: E731
    np.testing.assert_allclose(np.asarray(cost(jnp.asarray(foot))), _reference(foot.astype(np.float64)),
                               rtol=1e-5)
    grad = np.asarray(jax.grad(lambda x: jnp.sum(cost(x)))(jnp.asarray(foot)))
    # Central differences of the float64 reference: every coordinate of one window, others spot-checked.
    rng = np.random.default_rng(1)
    picks = [(0, i, k, c) for i in range(foot.shape[1]) for k in range(2) for c in range(3)]
    picks += [(b, int(rng.integers(foot.shape[1])), int(rng.integers(2)), int(rng.integers(3)))
              for b in (1, 2) for _ in range(12)]
    for b, i, k, c in picks:
        eps = 1e-6 if c == UP else 1e-4  # heights: the sigmoid's width is 5 mm
        plus, minus = foot.astype(np.float64).copy(), foot.astype(np.float64).copy()
        plus[b, i, k, c] += eps
        minus[b, i, k, c] -= eps
        numeric = (_reference(plus)[b] - _reference(minus)[b]) / (2 * eps)
        assert grad[b, i, k, c] == pytest.approx(numeric, rel=2e-3, abs=2e-3), (b, i, k, c)
    # Higher is never costlier: descending the cost lifts a foot, never presses it into the floor.
    assert np.all(grad[..., UP] <= 0) and np.any(grad[..., UP] < 0)


def _ratio_and_contact(foot) -> tuple[float, float]:
    """The papers' skating ratio (any toe in the band in both frames moving > 0.5 m/s) and the share of
    (toe, frame) in the band, by the evaluation's own code."""
    from motionjax.evaluation import plausibility

    foot = jnp.asarray(foot)
    step = jnp.linalg.norm(jnp.delete(foot[:, 1:] - foot[:, :-1], UP, axis=-1), axis=-1)
    valid = jnp.ones(foot.shape[:2], bool)
    skating, _, pair = plausibility.skating_pairs(foot[..., UP], step, valid, FPS, BAND)
    return float(skating.sum() / pair.sum()), float(np.mean(np.asarray(foot[..., UP]) < BAND))


def test_guidance_on_band_skating_lowers_the_papers_ratio():
    """Steps down the gradient normalized per window to unit RMS (as the sampler's guidance does) on a
    window with three toes: one sliding through the band at 1 m/s, one planted and still in it, one
    swinging 10 cm above it at 2 m/s. The papers' ratio falls (by more than half) and the planted toe stays
    exactly where it was (no speed: no push, no lift). (The swinging toe's weight is ~1e-7, but once the
    sliding one has left the band the unit-RMS normalization magnifies what is left: it moves too.)"""
    from motionjax.generation import flow

    t = 32
    foot = np.zeros((1, t, 3, 3), np.float32)
    foot[0, :, 0, 0] = np.arange(t) / FPS * 1.0  # sliding: 1 m/s along x, 0.5 cm up
    foot[0, :, 0, UP] = 0.005
    foot[0, :, 1, UP] = 0.003  # planted, still
    foot[0, :, 2, 0] = np.arange(t) / FPS * 2.0  # swinging: 2 m/s, 10 cm up
    foot[0, :, 2, UP] = 0.10
    before, contact_before = _ratio_and_contact(foot)
    assert before == 1.0 and contact_before == pytest.approx(2 / 3)

    grad_fn = jax.jit(jax.grad(lambda x: jnp.sum(flow.band_skating(x, UP, FPS, BAND))))
    x = jnp.asarray(foot)
    for _ in range(100):
        g = grad_fn(x)
        x = x - 0.005 * g / (jnp.sqrt(jnp.mean(g**2, axis=(1, 2, 3), keepdims=True)) + 1e-12)
    after, _ = _ratio_and_contact(x)
    assert after < 0.5 * before, (before, after)
    np.testing.assert_array_equal(np.asarray(x)[0, :, 1], foot[0, :, 1])


def test_physics_cost_names_its_foot_terms():
    from motionjax.generation import flow

    with pytest.raises(ValueError, match="'ratio'.*force.*contact.*band"):
        flow.physics_cost(None, None, None, None, 30.0, None, ("force", "ratio"))
