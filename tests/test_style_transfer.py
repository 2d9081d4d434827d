"""Style transfer's pieces (benchmarks/generation_tasks.py, motionjax.generation.edit.stylize) on a tiny
untrained flow and hand-made windows: the method grammar, the choice rule, the content-preservation
distances against loops, and stylize's mean of several samples. Seconds, no corpus."""
import types

import jax
import numpy as np
import pytest
from flax import nnx

from benchmarks import generation_tasks as tasks
from motionjax.generation import edit, flow


def test_methods_parse_strength_sampler_samples_and_guidance():
    a, b, c = tasks.parse_methods("0.7, 0.65/heun/x4, 0.8/g1.5:2")
    assert (a["strength"], a["sampler"], a["samples"], a["guidance"]) == (0.7, None, 1, None)
    assert (b["strength"], b["sampler"], b["samples"], b["guidance"]) == (0.65, "heun", 4, None)
    assert c["guidance"] == (1.5, 2.0) and tasks.parse_methods("0.7/g1.5")[0]["guidance"] == (1.5, 1.5)
    assert a["name"] != b["name"] != c["name"]
    for bad in ("0.7/rk4", "0.7/x0", "1.5", "0", ""):
        with pytest.raises(ValueError):
            tasks.parse_methods(bad)


def _row(style, content, distance):
    return {"accuracy_target_style": {"value": style}, "accuracy_content": {"value": content},
            "feature_distance": {"value": distance}}


def test_choice_is_the_closest_method_that_meets_both_floors():
    methods = tasks.parse_methods("0.6,0.65,0.7,0.75")
    names = [m["name"] for m in methods]
    rows = dict(zip(names, [_row(0.60, 0.95, 10.0),  # closest, but too little of the target style
                            _row(0.76, 0.93, 11.0),
                            _row(0.80, 0.91, 10.5),  # the closest of the two that meet both floors
                            _row(0.90, 0.89, 10.2)], strict=True))  # content below 0.9
    assert tasks.choose_method(rows, methods) == names[2]
    # None meets both: the best lower of the two accuracies (0.5, 0.7, 0.72, 0.6).
    rows = dict(zip(names, [_row(0.5, 0.95, 1), _row(0.7, 0.85, 1), _row(0.72, 0.8, 1), _row(0.9, 0.6, 1)],
                    strict=True))
    assert tasks.choose_method(rows, methods) == names[2]


def test_preservation_distances_against_loops():
    rng = np.random.default_rng(0)
    b, t, e, up = 3, 5, 4, 1
    s = types.SimpleNamespace(info=types.SimpleNamespace(skeleton=types.SimpleNamespace(up_axis=up)))
    src_f, src_root = rng.normal(size=(b, e)), rng.normal(size=(b, t, 3))
    feats, root = rng.normal(size=(b, e)), rng.normal(size=(b, t, 3))
    valid = np.ones((b, t), bool)
    valid[1, 3:] = False  # a short clip's padding is not scored
    got = tasks.preservation(s, src_f, src_root, {"features": feats}, root, valid)
    for i in range(b):
        assert got["feature_distance"][i] == pytest.approx(np.sqrt(((feats[i] - src_f[i]) ** 2).sum()))
        frames = [f for f in range(t) if valid[i, f]]
        horizontal = [np.hypot(root[i, f, 0] - src_root[i, f, 0], root[i, f, 2] - src_root[i, f, 2])
                      for f in frames]
        assert got["root_distance_cm"][i] == pytest.approx(100 * np.mean(horizontal))


@pytest.fixture(scope="module")
def tiny():
    """A setup whose codec is the identity on ``[B, L, D]`` latents, and a small flow with random weights
    (the untrained one's gates are zero: its velocity would not depend on the state)."""
    g = types.SimpleNamespace(dim=8, depth=1, heads=2, mlp_ratio=2, sample_steps=8, get=lambda k, d=None: d)
    model = flow.make_generator(g, 4, 3, (2, 2), 0)
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    state = jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape) if x.dtype.kind == "f" else x
                                      for x, k in zip(leaves, keys, strict=True)])
    model = nnx.merge(graphdef, state)
    identity = types.SimpleNamespace(encode=np.asarray, decode=np.asarray)
    s = types.SimpleNamespace(config=types.SimpleNamespace(generation=g), codec=identity,
                              stats=flow.LatentStats(np.zeros(3), np.ones(3)))
    x = np.random.default_rng(0).normal(size=(5, 4, 3)).astype(np.float32)
    return s, model, x, np.zeros((5, 2), np.int32)


def test_stylize_mean_of_samples_is_the_mean_of_independent_draws(tiny):
    s, model, x, labels = tiny
    key = jax.random.key(3)
    draws = [edit.stylize(s, model, x, labels, (1.0, 1.0), jax.random.fold_in(key, k), 0.5) for k in range(3)]
    assert np.abs(draws[0] - draws[1]).max() > 1e-3  # each draw its own noise
    mean = edit.stylize(s, model, x, labels, (1.0, 1.0), key, 0.5, samples=3)
    np.testing.assert_allclose(mean, np.mean(draws, axis=0), atol=1e-5)
    # The sampler asked for, not the run's (Euler here), and strength 0 keeps the source whatever it is.
    heun = edit.stylize(s, model, x, labels, (1.0, 1.0), key, 0.5, sampler="heun")
    z = flow.sample(model, labels, (1.0, 1.0), 8, key, source=x, strength=0.5, sampler="heun")
    np.testing.assert_allclose(heun, z, atol=1e-5)
    euler = edit.stylize(s, model, x, labels, (1.0, 1.0), key, 0.5)
    assert np.abs(heun - euler).max() > 1e-4
    kept = edit.stylize(s, model, x, labels, (1.0, 1.0), key, 0.0, samples=2)
    np.testing.assert_allclose(kept, x, atol=1e-5)


def test_the_stylize_command_defaults_to_the_strength_chosen_on_validation():
    from motionjax.commands import stylize

    assert stylize.parser().parse_args(["--workdir", "r", "--style", "elderly", "a.bvh"]).strength == \
        edit.STYLE_STRENGTH
