"""Motion generation (motionjax.generation, experiments/generate.py) and its evaluation
(motionjax.evaluation.generative, motionjax.evaluation.plausibility), on the DeepMimic clips labelled by
the config (experiments/generate.py:deepmimic,runlocal)."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The toy variant (DeepMimic, labelled by the config) at runlocal sizes, prepared in a temp dir."""
    from experiments import generate

    c = generate.get_config("deepmimic,runlocal")
    c.data.dir = str(tmp_path_factory.mktemp("prepared"))
    return c


@pytest.fixture(scope="module")
def run(config, tmp_path_factory):
    """The whole experiment, end to end in this process (what scripts/train.py runs for the config).
    ~95 CPU s, and each test that reads it compiles its own sampler programs (~200 in all): they are e2e,
    in make test-all only; make test keeps the closed-form tests here, test_style_transfer.py and
    test_physics_guidance.py."""
    from motionjax.generation import run

    workdir = tmp_path_factory.mktemp("generate")
    summary = run.run_experiment(config, workdir)
    return workdir, summary


@pytest.mark.e2e
def test_end_to_end_writes_the_table_and_samples(run):
    workdir, summary = run
    assert set(summary["results"]) == {"test", "unseen_pairs"}
    for split, rows in summary["results"].items():
        # physics guidance is on in the config: the same generator without it is the no_physics row
        assert set(rows) == {"generator", "no_physics", "retrieval", "real", "autoencoder"}, split
        for method, row in rows.items():
            assert np.isfinite(row["fid"]) and row["fid"] >= 0, (split, method)
            assert 0 <= row["accuracy_content"] <= 1
    # Retrieval copies real motion: its bones are the clips' own.
    assert summary["results"]["test"]["retrieval"]["bone_error"] < 1e-3
    assert any(line.startswith("| test (") and "| generator |" in line for line in summary["table"])
    for split, rows in summary["results"].items():
        for method, row in rows.items():  # every measure carries its interval over clips
            for key in ("accuracy_content", "skate_ratio", "contact", "diversity"):
                lo, hi = row[key + "_ci"]
                assert lo <= hi, (split, method, key)
            # FID's interval: none where a replicate can leave one half of a 3-clip split empty
            assert row["fid_ci"] is None or row["fid_ci"][0] <= row["fid_ci"][1]
            lo, hi = row["accuracy_content_ci"]
            assert lo - 1e-9 <= row["accuracy_content"] <= hi + 1e-9
            assert 0 <= row["skate_ratio_avg5"] <= row["skate_ratio"] <= 1
        assert "fid_ratio" in rows["generator"] and "fid_ratio" not in rows["real"]
    assert set(summary["per_content"]["test"]) and summary["skating"]["joints"]
    assert (workdir / "summary.json").exists() and (workdir / "samples.png").exists()
    bvh = sorted((workdir / "samples").glob("*.bvh"))
    assert bvh and any("dance_a" in p.name for p in bvh)  # the unseen pair was sampled


@pytest.fixture(scope="module")
def setup(run, config):
    """The run's stages read back from its directory (nothing is trained again)."""
    from motionjax.generation import run as run_module

    return run_module.setup(config, run[0])


def _with_moments(rng, mean, cov, n):
    """``n`` samples whose sample mean and covariance (``np.cov``) are exactly ``mean`` and ``cov``."""
    z = rng.normal(size=(n, len(mean)))
    z -= z.mean(0)
    z = z @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T  # whitened: cov exactly I
    return z @ np.linalg.cholesky(cov).T + mean


def test_fid_against_closed_forms():
    """FID against independent references: for diagonal covariances the closed form |mu1 - mu2|^2 +
    sum (sqrt(a) - sqrt(b))^2; for general ones tr((S1 S2)^1/2) as the sum of the square roots of the
    eigenvalues of S1 S2 (no matrix square root), on samples built to have exactly those moments."""
    from motionjax.evaluation import generative

    rng = np.random.default_rng(0)
    d = 6
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    a, b = rng.uniform(0.2, 3.0, d), rng.uniform(0.2, 3.0, d)
    x, y = _with_moments(rng, mu1, np.diag(a), 400), _with_moments(rng, mu2, np.diag(b), 300)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert generative.fid(x, y) == pytest.approx(expected, rel=1e-6)
    m1, m2 = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    s1, s2 = m1 @ m1.T + 0.1 * np.eye(d), m2 @ m2.T + 0.1 * np.eye(d)
    x, y = _with_moments(rng, mu1, s1, 500), _with_moments(rng, mu2, s2, 500)
    trace_root = np.sum(np.sqrt(np.linalg.eigvals(s1 @ s2).real))
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * trace_root
    assert generative.fid(x, y) == pytest.approx(expected, rel=1e-6)
    assert generative.fid(x, x + 1.0) == pytest.approx(d, rel=1e-9)  # a shift by 1 in every dimension


def test_second_order_samplers_integrate_the_flow_ode_against_closed_forms():
    """``flow.sample``'s samplers on a stand-in network whose velocity is known in closed form (labels
    ignored, so guidance changes nothing): ``v = c·t`` (x(1) = x(0) + c/2) is integrated exactly by Heun's
    and the midpoint steps and missed by Euler's by c/(2N); ``v = a·x`` (x(1) = x(0)·e^a) gives each
    step's own recursion, Euler ``(1 + a/N)^N``, Heun and midpoint ``(1 + a/N + a²/(2N²))^N`` (second
    order: at 8 steps already closer than Euler at 32)."""
    import jax.numpy as jnp
    from flax import nnx

    from motionjax.generation import flow

    class Known(nnx.Module):  # what flow.sample reads of a FlowTransformer: classes, position, head
        def __init__(self, kind: str, k: float):
            self.classes, self.kind, self.k = (2, 3), kind, k
            self.position = nnx.Param(jnp.zeros((5, 4)))
            self.head = nnx.Linear(4, 3, rngs=nnx.Rngs(0))

        def __call__(self, x, t, labels):
            return self.k * (x if self.kind == "x" else jnp.ones_like(x) * t[:, None, None])

    labels, key, scales = np.array([[0, 1], [1, 2]]), jax.random.key(3), (2.0, 2.0)
    x0 = np.asarray(jax.random.normal(key, (2, 5, 3)))  # flow.sample's own noise of that key and shape
    run = lambda m, steps, sampler: flow.sample(m, labels, scales, steps, key, sampler=sampler)  # noqa: E731
    c, n = 1.5, 4
    for sampler in ("heun", "midpoint"):
        np.testing.assert_allclose(run(Known("t", c), n, sampler), x0 + c / 2, atol=1e-5)
    np.testing.assert_allclose(run(Known("t", c), n, "euler"), x0 + c * (n - 1) / (2 * n), atol=1e-5)
    a = -1.2
    errors = {}
    for sampler, n in (("euler", 32), ("heun", 8), ("midpoint", 8)):
        growth = 1 + a / n + (0 if sampler == "euler" else a**2 / (2 * n**2))
        z = run(Known("x", a), n, sampler)
        np.testing.assert_allclose(z, x0 * growth**n, rtol=1e-4, atol=1e-6)
        errors[sampler] = np.abs(z - x0 * np.exp(a)).max()
    assert errors["heun"] < errors["euler"] / 2 and errors["midpoint"] < errors["euler"] / 2, errors
    with pytest.raises(ValueError, match="sampler 'rk4'"):
        run(Known("t", c), n, "rk4")


@pytest.mark.e2e
def test_evaluator_tells_motion_from_noise_at_the_same_n(setup):
    """FID of decoded noise latents against real windows is far above the real reference at the same
    sample sizes (two halves of the clips, :func:`run.halves`), whose halves share no clip."""
    from motionjax.evaluation import generative
    from motionjax.generation import run as run_module

    w = setup.splits["test"]
    a, b, how = run_module.halves(w, 0)
    assert how == "clips" and not set(w.clip[a]) & set(w.clip[b])
    real = setup.real["test"]["features"]
    noise = np.random.default_rng(1).normal(size=(len(a), *setup.latents.shape[1:])).astype(np.float32) * 3
    noisy = setup.score(setup.codec.decode(setup.stats.raw(noise)), None, w.valid[a])["features"]
    assert generative.fid(noisy, real[b]) > 3 * generative.fid(real[a], real[b])


@pytest.mark.e2e
def test_guidance_scale_zero_ignores_labels(setup, config):
    """With both guidance scales 0 the flow is the unconditional one: the same noise gives the same sample
    whatever the labels; at scale 1 the labels change it (the label tables are perturbed, so they matter)."""
    from flax import nnx

    from motionjax.generation import flow

    model = flow.make_generator(config.generation, *setup.latents.shape[1:], setup.classes, seed=0)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(3)  # numpy: no program compiled per parameter shape
    noisy = lambda x: jax.numpy.asarray(np.asarray(x) + 0.1 * rng.standard_normal(x.shape, np.float32))
    state = jax.tree.map(noisy, state)
    model = nnx.merge(graphdef, state)
    a, b = np.array([[0, 0]] * 3, np.int32), np.array([[1, 1]] * 3, np.int32)
    key = jax.random.key(5)
    off = [flow.sample(model, y, (0.0, 0.0), 4, key) for y in (a, b)]
    np.testing.assert_allclose(off[0], off[1], atol=1e-6)
    on = [flow.sample(model, y, (1.0, 1.0), 4, key) for y in (a, b)]
    assert np.abs(on[0] - on[1]).max() > 1e-2


@pytest.mark.e2e
def test_samples_decode_to_valid_motions(setup, run):
    """Samples of the trained generator decode to unit quaternions on the skeleton's bones (FK bone lengths
    equal the rest offsets)."""
    from motionjax.generation import latents
    from motionjax.generation import run as run_module

    model, _ = run_module.fit_generator(
        setup, setup.config.generation, setup.config.seed, run[0] / "generator"
    )
    x = run_module.generate(setup, model, setup.labels[:4], (2.0, 2.0), jax.random.key(0))
    root, rotations, positions = latents.motion(setup.info, x)
    assert np.isfinite(positions).all()
    np.testing.assert_allclose(np.linalg.norm(rotations, axis=-1), 1.0, atol=1e-5)
    sk = setup.info.skeleton
    parents = np.asarray(sk.parents)[1:]
    bones = np.linalg.norm(positions[..., 1:, :] - positions[..., parents, :], axis=-1)
    np.testing.assert_allclose(
        bones, np.broadcast_to(np.linalg.norm(sk.offsets[1:], axis=-1), bones.shape), atol=1e-4
    )


@pytest.mark.e2e
def test_plausibility_against_physics(setup):
    """Against independent references: a body held still needs exactly gravity at its root (9.81 N/kg) and
    skates 0; the same pose carried across the floor at 1.5 m/s skates 150 cm/s; a body in free fall (root
    accelerating at -g) needs no root force."""
    from motionjax.evaluation import plausibility
    from motionjax.generation import latents

    sk, fps = setup.info.skeleton, 30.0
    root, rotations, _ = latents.motion(setup.info, setup.splits["test"].features[:1])
    t = np.arange(32) / fps
    pose = np.broadcast_to(rotations[:, :1], rotations.shape).copy()  # the first frame held
    still = np.broadcast_to(root[:, :1], root.shape).copy()
    feet = dataclasses.replace(setup.feet, contact_m=10.0)  # every frame is a contact frame
    held = plausibility.plausibility(sk, fps, feet, still, pose)
    assert held["foot_skate"] < 1e-3 and held["jitter"] < 1e-2
    assert abs(held["root_force"] - 9.81) < 1e-3
    forward = [a for a in range(3) if a != sk.up_axis][0]
    slide = still.copy()
    slide[..., forward] += 1.5 * t
    assert abs(plausibility.plausibility(sk, fps, feet, slide, pose)["foot_skate"] - 150.0) < 0.1
    fall = still.copy()
    fall[..., sk.up_axis] -= 0.5 * 9.81 * t**2
    assert plausibility.plausibility(sk, fps, feet, fall, pose)["root_force"] < 1e-2
    assert held["bone_error"] < 1e-4


@pytest.mark.e2e
def test_dynamics_term_gradient_matches_finite_differences(setup):
    """The dynamics loss on decoded samples (what training with generation.dynamics_weight > 0 adds): its
    gradient through the frozen decoder against a central finite difference, in float32 on a random
    direction; and the term of the training latents themselves is finite and positive (jerk, forces)."""
    from motionjax.generation import flow

    s = setup
    term = flow.physics_term(s.codec, s.codec.state, s.stats, s.info, float(s.info.fps),
                             dict(s.config.loss.dynamics))
    x1 = jax.numpy.asarray(s.latents[:2])
    t = jax.numpy.asarray([0.5, 1.0])
    rng = np.random.default_rng(0)
    x = x1 + 0.1 * jax.numpy.asarray(rng.normal(size=x1.shape), jax.numpy.float32)
    v = jax.numpy.asarray(rng.normal(size=x1.shape), jax.numpy.float32)
    value_and_grad = jax.jit(jax.value_and_grad(lambda x: term(x, x1, t)))  # one program for both
    f = lambda x: value_and_grad(x)[0]  # noqa: E731
    value, grad = value_and_grad(x)
    assert np.isfinite(float(value)) and float(value) > 0
    eps = 1e-2
    numeric = (float(f(x + eps * v)) - float(f(x - eps * v))) / (2 * eps)
    analytic = float(jax.numpy.sum(grad * v))
    assert abs(numeric - analytic) <= 0.05 * abs(analytic) + 1e-4, (numeric, analytic)


@pytest.mark.e2e
def test_physics_guidance_lowers_the_physics_cost_of_the_same_noise(setup, run, config):
    """Sampling-time physics guidance (generation.physics_guidance): from the same noise and labels, the
    guided samples' :func:`flow.physics_cost` is lower than the unguided ones'; and the cost equals an
    independent numpy reference from the decoded joint positions (the centre of mass's acceleration by
    finite differences for the root force, the soft-contact foot speed)."""
    from motionjax.core import dynamics
    from motionjax.generation import flow, latents
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    labels, key, steps = s.labels[:6], jax.random.key(11), config.generation.sample_steps
    plain = flow.sample(model, labels, (1.0, 1.0), steps, key)
    # From the config's flow time (physics_guidance_from): test_samples_decode_to_valid_motions's program
    # (the scale is an argument of it, not a constant); another start compiled a sampler of its own.
    guided = flow.sample(model, labels, (1.0, 1.0), steps, key, guide=s.guide, guide_scale=2.0,
                         guide_from=config.generation.physics_guidance_from)
    cost = jax.jit(s.guide.fn)
    before, after = np.asarray(cost(s.guide.params, plain)), np.asarray(cost(s.guide.params, guided))
    assert np.all(np.isfinite(after)) and after.mean() < 0.9 * before.mean(), (before, after)

    # The root residual beyond standing is the centre of mass's acceleration (sum_j m_j a_j / M): here
    # from finite differences of the FK positions, not through the dynamics module's Jacobian products.
    sk, fps, feet = s.info.skeleton, float(s.info.fps), s.feet
    _, _, positions = latents.motion(s.info, s.codec.decode(s.stats.raw(plain)))
    p64 = positions.astype(np.float64)
    accel = (p64[:, 2:] - 2 * p64[:, 1:-1] + p64[:, :-2]) * fps**2  # [B, T-2, J, 3]
    mass = np.asarray(sk.masses, np.float64) / np.sum(sk.masses)
    com = np.einsum("j,btjc->btc", mass, accel)
    force = (com**2).sum(-1).mean(-1) / dynamics.GRAVITY**2
    foot = positions[:, :, list(feet.joints)].astype(np.float64)
    speed = np.delete((foot[:, 2:] - foot[:, :-2]) * fps / 2, sk.up_axis, axis=-1)
    lift = foot[:, 1:-1, :, sk.up_axis] - np.asarray(feet.floor)
    contact = 1 / (1 + np.exp(-(feet.contact_m - lift) / (feet.contact_m / 4)))
    skate = (contact * (speed**2).sum(-1)).mean((1, 2))
    np.testing.assert_allclose(before, force + skate, rtol=2e-3, atol=1e-5)
    # The band foot term (the papers' skating ratio, smoothed) in its place: the standard joints, the
    # floor at 0, the step between frames, in the band in both frames.
    band = s.guide_of(("force", "band"))
    toes = positions[:, :, list(feet.standard)].astype(np.float64)
    inside = 1 / (1 + np.exp(-(feet.band_m - toes[..., sk.up_axis]) / (feet.band_m / 4)))
    step = np.delete(toes[:, 1:] - toes[:, :-1], sk.up_axis, axis=-1) * fps
    ratio_term = (inside[:, 1:] * inside[:, :-1] * (step**2).sum(-1)).mean((1, 2))
    np.testing.assert_allclose(np.asarray(jax.jit(band.fn)(band.params, plain)), force + ratio_term,
                               rtol=2e-3, atol=1e-5)


def _gmd_skating_ratio(feet_xyz, fps, band, up=1):
    """A transcription of GMD's / OmniControl's ``calculate_skating_ratio`` (their eval code): ``feet_xyz
    [B, 2, 3, T]`` -> per-sequence ratio with their 5-frame mean speed, and without it."""
    from scipy.ndimage import uniform_filter1d

    plane = [a for a in range(3) if a != up]
    vel = np.linalg.norm(feet_xyz[:, :, plane, 1:] - feet_xyz[:, :, plane, :-1], axis=2) * fps
    avg = uniform_filter1d(vel, axis=-1, size=5, mode="constant", origin=0)
    height = feet_xyz[:, :, up, :]
    contact = (height[:, :, :-1] < band) & (height[:, :, 1:] < band)
    skating = contact & (vel > 0.5)
    both = np.logical_or(*np.moveaxis(skating & (avg > 0.5), 1, 0))
    plain = np.logical_or(*np.moveaxis(skating, 1, 0))
    return both.sum(1) / both.shape[1], plain.sum(1) / plain.shape[1]


def test_skating_ratio_matches_the_papers_code():
    """:func:`plausibility.skating_pairs` against the transcription of GMD's code (scipy's filter) on
    random walks of two feet near the floor; padding frames leave the ratio of the valid ones."""
    import jax.numpy as jnp

    from motionjax.evaluation import plausibility

    rng = np.random.default_rng(0)
    b, t, fps, band = 16, 60, 30.0, 0.05
    xz = np.cumsum(rng.normal(0, 0.03, size=(b, t, 2, 2)), axis=1)  # ~0.9 m/s steps: some above 0.5
    h = np.abs(rng.normal(0.04, 0.03, size=(b, t, 2)))
    pos = np.stack([xz[..., 0], h, xz[..., 1]], -1)  # [B, T, 2, 3], y up
    step = np.linalg.norm(np.delete(pos[:, 1:] - pos[:, :-1], 1, axis=-1), axis=-1)
    valid = np.ones((b, t), bool)
    skate, skate5, pair = (np.asarray(x) for x in plausibility.skating_pairs(
        jnp.asarray(h), jnp.asarray(step), jnp.asarray(valid), fps, band))
    ref5, ref = _gmd_skating_ratio(np.moveaxis(pos, 1, -1), fps, band)
    np.testing.assert_allclose(skate.sum(1) / pair.sum(1), ref, atol=1e-12)
    np.testing.assert_allclose(skate5.sum(1) / pair.sum(1), ref5, atol=1e-12)
    assert 0.05 < ref.mean() < 0.95  # the random walk exercises both outcomes
    # Padding: the last 20 frames masked count as the ratio of the first 40 (the filter zero-padded there).
    valid[:, 40:] = False
    skate, skate5, pair = (np.asarray(x) for x in plausibility.skating_pairs(
        jnp.asarray(h), jnp.asarray(step), jnp.asarray(valid), fps, band))
    ref5, ref = _gmd_skating_ratio(np.moveaxis(pos[:, :40], 1, -1), fps, band)
    np.testing.assert_allclose(skate.sum(1) / pair.sum(1), ref, atol=1e-12)
    np.testing.assert_allclose(skate5.sum(1) / pair.sum(1), ref5, atol=1e-12)


BANDAI1 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bandai-namco-1" / "data"


@pytest.mark.skipif(not BANDAI1.is_dir(), reason="Bandai-1 is not on this machine")
def test_sample_bvh_has_the_source_clips_units_and_hierarchy(tmp_path):
    """A window written as a generated sample is (artifacts.export_bvh with a source clip): the header of
    the corpus clip it came from verbatim (joint_Root, 6 channels a joint, centimetre offsets), and read
    back in centimetres its joints are where the window's are (x100 the metres it was given)."""
    from motionjax.core import features
    from motionjax.data import corpus
    from motionjax.evaluation import artifacts
    from motionjax.formats import load

    source = sorted(BANDAI1.glob("*.bvh"))[0]
    original = load(source)
    clip, decided = corpus.conform(original)
    assert decided["units"] == "cm"
    t = 40
    sk = clip.skeleton
    x = features.pack(sk, clip.root_position[:t], clip.rotations[:t])
    out = tmp_path / "sample.bvh"
    f = x.shape[-1]
    artifacts.export_bvh(out, sk, clip.fps, x, np.zeros(f), np.ones(f), source=source)
    head = lambda path: path.read_text().split("MOTION")[0]  # noqa: E731
    assert head(out) == head(source) and "ROOT joint_Root" in head(out)
    back = load(out)  # in the file's units (cm), as any BVH viewer reads it
    assert back.num_frames == t and back.skeleton.names == original.skeleton.names
    np.testing.assert_allclose(back.positions(), original.positions()[:t], atol=1e-3)
    bare = tmp_path / "bare.bvh"  # without a source: metres on the run's skeleton (100x smaller)
    artifacts.export_bvh(bare, sk, clip.fps, x, np.zeros(f), np.ones(f))
    assert "joint_Root" not in head(bare)


@pytest.mark.e2e
def test_editing_keeps_what_it_is_given(setup, run, config):
    """The sampler's editing mode (flow.sample with a source): held latent frames come back exactly; at
    strength 0 nothing is generated (the source's own reconstruction); interpolation keeps the given frames
    and puts a lone missing root position halfway between its neighbours."""
    from motionjax.generation import edit, flow
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    w = s.splits["test"].take(np.arange(4))
    labels = s.encode_labels(w)
    source = s.stats.standardize(s.codec.encode(w.features))
    known = np.zeros(source.shape[:2], bool)
    known[:, : source.shape[1] // 2] = True
    z = flow.sample(model, labels, (1.0, 1.0), 4, jax.random.key(0), source=source, strength=1.0, known=known)
    np.testing.assert_allclose(z[known], source[known], atol=1e-5)
    assert np.abs(z[~known] - source[~known]).max() > 1e-3  # the rest is generated
    kept = edit.stylize(s, model, w.features, labels, (1.0, 1.0), jax.random.key(0), strength=0.0)
    np.testing.assert_allclose(kept, s.codec.decode(source * s.stats.std + s.stats.mean), atol=1e-5)
    t = w.valid.shape[1]
    given = np.ones((4, t), bool)
    given[:, t // 2] = False
    x = edit.interpolate(s.info, w.features, given)
    flat, orig = x.reshape(4, t, -1), w.features.reshape(4, t, -1)
    np.testing.assert_allclose(flat[given], orig[given], atol=1e-4)
    from motionjax.generation import latents

    root = latents.motion(s.info, w.features)[0]
    mid = latents.motion(s.info, x)[0][:, t // 2]
    np.testing.assert_allclose(mid, (root[:, t // 2 - 1] + root[:, t // 2 + 1]) / 2, atol=1e-4)


@pytest.mark.e2e
def test_sample_and_stylize_commands(run, tmp_path):
    """motionjax sample writes --count BVH files of the run's window (unknown labels: exit 2 naming the
    known ones); motionjax stylize renders one of them in another style, the same length."""
    from motionjax import cli
    from motionjax.formats import load

    workdir, _ = run
    out = tmp_path / "samples"
    argv = ["sample", "--workdir", str(workdir), "--content", "loco", "--style", "a", "--count", "2",
            "--seed", "1", "--length", "20", "--no-video", "--out", str(out)]
    assert cli.main(argv) == 0
    files = sorted(out.glob("*.bvh"))
    assert [p.name for p in files] == ["loco_a_0.bvh", "loco_a_1.bvh"]
    assert load(files[0]).num_frames == 20
    assert cli.main([*argv[:6], "nosuch", *argv[7:]]) == 2
    longer = tmp_path / "longer"  # past the run's 32-frame window: continued by in-betweening
    assert cli.main([*argv[:8], "1", "--length", "50", "--no-video", "--out", str(longer)]) == 0
    motion = load(longer / "loco_a_0.bvh")
    assert motion.num_frames == 50 and np.isfinite(motion.root_position).all()
    styled = tmp_path / "styled"
    assert cli.main(["stylize", "--workdir", str(workdir), "--style", "b", "--strength", "0.5",
                     str(files[0]), "--out", str(styled)]) == 0
    assert load(styled / files[0].name).num_frames == 20


def test_join_keeps_the_given_frames_and_carries_the_residual_across_the_gap():
    """edit.join against hand-computed cases: the given frames come back exactly; a made motion that is
    the truth plus a residual linear in time across each gap is joined back to the truth exactly (the
    residual at the gap's ends, blended linearly, is what is added); a gap at a window's end takes its
    one side's residual."""
    from motionjax.generation import edit

    rng = np.random.default_rng(0)
    b, n, c, f = 3, 4, 4, 5
    t = n * c
    x = rng.normal(size=(b, n, c, f)).astype(np.float32)
    known = np.ones((b, t), bool)
    known[0, 5:9] = False  # one gap
    known[1, 2:4] = known[1, 10:13] = False  # two gaps
    known[2, 12:] = False  # a gap at the end
    frames = np.arange(t, dtype=np.float32)[None, :, None]
    slope, offset = rng.normal(size=(b, 1, f)), rng.normal(size=(b, 1, f))
    made = x.reshape(b, t, f) - (offset + slope * frames)  # residual x - made linear in time
    made = made.reshape(x.shape)
    joined = edit.join(x, made, known)
    np.testing.assert_allclose(joined[:2], x[:2], atol=1e-4)
    # The end gap: made + the residual of its last given frame (11), constant.
    flat, mflat = joined.reshape(b, t, f), made.reshape(b, t, f)
    np.testing.assert_allclose(flat[2, 12:], mflat[2, 12:] + (x.reshape(b, t, f)[2, 11] - mflat[2, 11]),
                               atol=1e-4)
    np.testing.assert_allclose(flat[2, :12], x.reshape(b, t, f)[2, :12], atol=1e-6)
    # Any made motion: given frames exact, missing ones made's plus something (not x's copied).
    other = rng.normal(size=x.shape).astype(np.float32)
    j2 = edit.join(x, other, known).reshape(b, t, f)
    np.testing.assert_array_equal(j2[known], x.reshape(b, t, f)[known])
    assert np.abs(j2[~known] - x.reshape(b, t, f)[~known]).min() > 0
    with pytest.raises(ValueError, match="no given frame"):
        edit.join(x, made, np.zeros((b, t), bool))


def test_toward_moves_the_result_a_share_of_the_way_and_keeps_what_both_hold():
    """edit.toward against closed forms: share 0 is the result, 1 the baseline; a result and a baseline
    that err in opposite directions by the same amount meet the truth at 0.5 (why a blend can beat both);
    the error of any blend is at most the larger of the two's (convexity); frames where both hold the same
    values keep them; a share outside [0, 1] is refused."""
    from motionjax.generation import edit

    rng = np.random.default_rng(1)
    truth = rng.normal(size=(2, 4, 4, 5)).astype(np.float32)
    error = rng.normal(size=truth.shape).astype(np.float32)
    made, base = truth + error, truth - error
    np.testing.assert_array_equal(edit.toward(made, base, 0.0), made)
    np.testing.assert_allclose(edit.toward(made, base, 1.0), base, atol=1e-6)
    np.testing.assert_allclose(edit.toward(made, base, 0.5), truth, atol=1e-5)
    other = truth + rng.normal(size=truth.shape).astype(np.float32)
    rms = lambda y: float(np.sqrt(np.mean((y - truth) ** 2)))  # noqa: E731
    for share in (0.25, 0.5, 0.75):
        assert rms(edit.toward(made, other, share)) <= max(rms(made), rms(other)) + 1e-6
    other[:, :2] = made[:, :2]  # frames both hold (the given ones, after join)
    np.testing.assert_allclose(edit.toward(made, other, 0.3)[:, :2], made[:, :2], atol=1e-6)
    with pytest.raises(ValueError, match="share"):
        edit.toward(made, base, 1.5)


@pytest.mark.e2e
def test_reconstruction_guidance_reproduces_the_given_frames(setup, run, config):
    """Reconstruction guidance (flow.reconstruction_cost through flow.sample's fit): the cost equals a
    numpy reference (weighted mean squared joint distance, cm², from the decoded motion's positions),
    its gradient matches central finite differences, and guided samples decode closer to the given
    frames of real windows than unguided ones from the same noise, each window toward its own target."""
    import jax.numpy as jnp

    from motionjax.generation import edit, flow, latents
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    w = s.splits["test"].take(np.arange(5))
    labels = s.encode_labels(w)
    t = w.valid.shape[1]
    known = edit.gap(t, t // 4, len(w), np.random.default_rng(3))
    target = latents.motion(s.info, w.features)[2]  # [B, T, J, 3]
    weight = np.broadcast_to(known[..., None, None], target.shape).astype(np.float32)
    z = s.stats.standardize(s.codec.encode(w.features)) + 0.3 * np.random.default_rng(1).normal(
        size=(len(w), *s.latents.shape[1:])).astype(np.float32)
    fit = s.fit
    cost = jax.jit(lambda z: fit.fn(fit.params, z, jnp.asarray(target), jnp.asarray(weight)))
    pos = latents.motion(s.info, s.codec.decode(s.stats.raw(z)))[2]
    reference = (100 * (pos - target)) ** 2 * weight
    np.testing.assert_allclose(np.asarray(cost(z)), reference.sum((1, 2, 3)) / weight.sum((1, 2, 3)),
                               rtol=1e-3)
    grad = jax.grad(lambda z: jnp.sum(cost(z)))(jnp.asarray(z, jnp.float32))
    v = np.random.default_rng(2).normal(size=z.shape).astype(np.float32)
    eps = 1e-2
    numeric = (float(cost(z + eps * v).sum()) - float(cost(z - eps * v).sum())) / (2 * eps)
    analytic = float(jnp.sum(grad * v))
    assert abs(numeric - analytic) <= 0.05 * abs(analytic) + 1e-4, (numeric, analytic)

    # From the same noise and labels, guided samples decode closer to the given frames than unguided
    # ones, and at least as close as the frozen encoder's own latent of the true window (the toy run's
    # autoencoder is barely trained: that reconstruction is the best it offers). Per-sample targets go
    # through the sampler's batches: batches of 2 (the last padded) give what one batch of 5 gives.
    steps, key = config.generation.sample_steps, jax.random.key(5)
    plain = flow.sample(model, labels, (1.0, 1.0), steps, key)
    run = lambda batch: flow.sample(model, labels, (1.0, 1.0), steps, key, fit=s.fit, target=target,  # noqa: E731
                                    weight=weight, fit_steps=8, fit_rate=0.5, batch=batch)
    guided = run(2)
    np.testing.assert_allclose(guided, run(8), atol=1e-4)
    before, after = np.asarray(cost(plain)), np.asarray(cost(guided))
    encoded = np.asarray(cost(s.stats.standardize(s.codec.encode(w.features))))
    assert np.all(np.isfinite(after)) and np.all(after < before) and np.all(after < encoded), (
        before, after, encoded)
    with pytest.raises(ValueError, match="target"):
        flow.sample(model, labels, (1.0, 1.0), steps, key, fit=s.fit, fit_steps=1)


@pytest.mark.e2e
def test_trajectory_control_follows_the_given_root_path(setup, run, config):
    """edit.follow_path: from the same noise and labels, the guided windows' root path on the floor is
    closer to the given one (real windows') than the unguided samples', every window (the toy run's
    decoder is barely trained: a little closer); the height is free."""
    from motionjax.generation import edit, latents
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    w = s.splits["test"].take(np.arange(5))
    labels, key, up = s.encode_labels(w), jax.random.key(9), s.info.skeleton.up_axis
    plain = run_module.generate(s, model, labels, (1.0, 1.0), key, physics=0.0)
    guided = edit.follow_path(s, model, w.features, labels, (1.0, 1.0), key, fit_steps=4)
    truth = latents.motion(s.info, w.features)[0]

    def error(x):  # [B]: mean horizontal root distance, m
        return np.linalg.norm(np.delete(latents.motion(s.info, x)[0] - truth, up, -1), axis=-1).mean(1)

    assert np.all(np.isfinite(guided)) and np.all(error(guided) < error(plain)), (
        error(guided), error(plain))


@pytest.mark.slow  # a notebook kernel
@pytest.mark.timeout(900)
@pytest.mark.e2e
def test_the_generation_notebook_runs_on_this_run(run, env):
    """notebooks/05_generate.ipynb top to bottom on this file's run (``MOTIONJAX_GENERATE_RUN``: the
    run the notebook would otherwise train as its toy, the same config, in a kernel of its own on one
    CPU device): it loads every stage, shows the table, samples, plays and exports a held-out pair."""
    from runs import NOTEBOOK_DIR, run_notebook

    nb = run_notebook(NOTEBOOK_DIR / "05_generate.ipynb", dict(env, MOTIONJAX_GENERATE_RUN=str(run[0])))
    printed = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                      for o in cell.outputs if o.output_type == "stream")
    assert f"{run[0]}: labels content" in printed, printed[-2000:]  # it read this run, trained nothing
    assert "unit quaternions: True" in printed and "guidance 0 ignores the labels: True" in printed
    assert (run[0] / "notebook_unseen.bvh").exists()


@pytest.mark.e2e
def test_inbetween_keeps_the_given_frames_and_its_mean_of_samples_is_the_mean_of_draws(setup, run, config):
    """edit.inbetween with join_ends: the given frames come back exactly, the missing ones are generated
    (not the interpolation's); the mean of K samples is the mean of K one-sample results of the keys
    folded with their index (join is affine in the generated windows, so it commutes with the mean)."""
    from motionjax.generation import edit
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    w = s.splits["test"].take(np.arange(3))
    b, n, c, f = w.features.shape
    known = edit.gap(n * c, 8, b, np.random.default_rng(0))
    labels, key = s.encode_labels(w), jax.random.key(4)
    go = lambda k, samples: edit.inbetween(s, model, w.features, known, labels, (1.0, 1.0), k,  # noqa: E731
                                           join_ends=True, samples=samples)
    frames = lambda x: np.asarray(x).reshape(b, n * c, f)  # noqa: E731
    one = go(key, 1)
    np.testing.assert_array_equal(frames(one)[known], frames(w.features)[known])
    base = frames(edit.interpolate(s.info, w.features, known))
    assert np.abs(frames(one)[~known] - base[~known]).max() > 1e-3
    draws = [go(jax.random.fold_in(key, k), 1) for k in range(2)]
    assert np.abs(draws[0] - draws[1]).max() > 1e-3  # each draw its own noise
    np.testing.assert_allclose(go(key, 2), np.mean(draws, axis=0), atol=1e-4)
