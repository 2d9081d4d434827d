"""Motion generation (motionjax.generation, experiments/generate.py) and its evaluation
(motionjax.evaluation.generative, motionjax.evaluation.plausibility), on the DeepMimic clips labelled by
the config (experiments/generate.py:deepmimic,runlocal)."""

import dataclasses

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
    """The whole experiment, end to end in this process (what scripts/train.py runs for the config)."""
    from motionjax.generation import run

    workdir = tmp_path_factory.mktemp("generate")
    summary = run.run_experiment(config, workdir)
    return workdir, summary


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
    assert any(line.startswith("test") and "generator" in line for line in summary["table"])
    assert (workdir / "summary.json").exists() and (workdir / "samples.png").exists()
    bvh = sorted((workdir / "samples").glob("*.bvh"))
    assert bvh and any("dance_a" in p.name for p in bvh)  # the unseen pair was sampled


@pytest.fixture(scope="module")
def setup(run, config):
    """The run's stages read back from its directory (nothing is trained again)."""
    from motionjax.generation import run as run_module

    return run_module.setup(config, run[0])


def test_fid_of_real_halves_is_near_zero_and_of_noise_large(setup):
    """The evaluator's FID of the real windows against themselves (two halves) is far below that of decoded
    noise latents against them: the evaluator tells motion from noise."""
    from motionjax.evaluation import generative

    real = np.concatenate([setup.real[s]["features"] for s in ("test", "validation", "unseen_pairs")])
    order = np.random.default_rng(0).permutation(len(real))
    halves = generative.fid(real[order[::2]], real[order[1::2]])
    noise = np.random.default_rng(1).normal(size=(len(real), *setup.latents.shape[1:])).astype(np.float32) * 3
    noisy = setup.score(setup.codec.decode(setup.stats.raw(noise)))["features"]
    assert generative.fid(noisy, real) > 10 * halves
    assert generative.fid(real, real) < 1e-6


def test_guidance_scale_zero_ignores_labels(setup, config):
    """With both guidance scales 0 the flow is the unconditional one: the same noise gives the same sample
    whatever the labels; at scale 1 the labels change it (the label tables are perturbed, so they matter)."""
    from flax import nnx

    from motionjax.generation import flow

    model = flow.make_generator(config.generation, *setup.latents.shape[1:], setup.classes, seed=0)
    graphdef, state = nnx.split(model)
    keys = jax.random.split(jax.random.key(3), len(jax.tree.leaves(state)))
    state = jax.tree.unflatten(
        jax.tree.structure(state),
        [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(jax.tree.leaves(state), keys, strict=True)],
    )
    model = nnx.merge(graphdef, state)
    a, b = np.array([[0, 0]] * 3, np.int32), np.array([[1, 1]] * 3, np.int32)
    key = jax.random.key(5)
    off = [flow.sample(model, y, (0.0, 0.0), 4, key) for y in (a, b)]
    np.testing.assert_allclose(off[0], off[1], atol=1e-6)
    on = [flow.sample(model, y, (1.0, 1.0), 4, key) for y in (a, b)]
    assert np.abs(on[0] - on[1]).max() > 1e-2


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


def test_physics_guidance_lowers_the_physics_cost_of_the_same_noise(setup, run, config):
    """Sampling-time physics guidance (generation.physics_guidance): from the same noise and labels, the
    guided samples' :func:`flow.physics_cost` is lower than the unguided ones'; and the cost equals its
    definition computed in numpy from the decoded motion (the positions by the metrics' own FK path)."""
    from motionjax.core import dynamics
    from motionjax.generation import flow, latents
    from motionjax.generation import run as run_module

    s = setup
    model, _ = run_module.fit_generator(s, config.generation, config.seed, run[0] / "generator")
    labels, key, steps = s.labels[:6], jax.random.key(11), config.generation.sample_steps
    plain = flow.sample(model, labels, (1.0, 1.0), steps, key)
    guided = flow.sample(model, labels, (1.0, 1.0), steps, key, guide=s.guide, guide_scale=2.0,
                         guide_from=0.0)
    cost = jax.jit(s.guide.fn)
    before, after = np.asarray(cost(s.guide.params, plain)), np.asarray(cost(s.guide.params, guided))
    assert np.all(np.isfinite(after)) and after.mean() < 0.9 * before.mean(), (before, after)

    sk, fps, feet = s.info.skeleton, float(s.info.fps), s.feet
    root, rotations, positions = latents.motion(s.info, s.codec.decode(s.stats.raw(plain)))
    tau = np.asarray(dynamics.generalized_forces(sk, root, rotations, fps), np.float64)[:, 1:-1, 0]
    tau[..., sk.up_axis] -= dynamics.GRAVITY
    force = (tau**2).sum(-1).mean(-1) / dynamics.GRAVITY**2
    foot = positions[:, :, list(feet.joints)].astype(np.float64)
    speed = np.delete((foot[:, 2:] - foot[:, :-2]) * fps / 2, sk.up_axis, axis=-1)
    lift = foot[:, 1:-1, :, sk.up_axis] - np.asarray(feet.floor)
    contact = 1 / (1 + np.exp(-(feet.contact_m - lift) / (feet.contact_m / 4)))
    skate = (contact * (speed**2).sum(-1)).mean((1, 2))
    np.testing.assert_allclose(before, force + skate, rtol=2e-3, atol=1e-5)
