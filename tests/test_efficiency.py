"""The efficiency toolbox (issue #16) on tiny models: exports equal JAX, int8 weights, the batch
finder's memory limit. No dataset needed: the models only see feature widths."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiments import deepmimic_denoise
from motionjax import models, parallel
from motionjax.configs import base
from motionjax.efficiency import export, finetune, prune, quantize, scorecard
from motionjax.train import batch_finder

FEATURES = 21  # root position 3 + three rotating joints x 6D
WINDOW = (4, 8, FEATURES)  # N chunks x C frames x F features


def tiny_model(seed: int = 0, **overrides) -> nnx.Module:
    """A tiny residual transformer (or ``name="tconv"``) with every parameter perturbed: its
    zero-initialized heads would make it the identity map, and an export test on the identity could
    not fail."""
    cfg = base.get_config().model
    cfg.update(dict(name="transformer", dim=16, depth=1, heads=2, mlp_ratio=2, halo=2, kernel=3,
                    latent_dim=8, stride=2, residual=True, dtype="float32"), **overrides)
    model = models.make_model(cfg, FEATURES, WINDOW[1], nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(seed + 1)  # numpy: jax.random compiled its programs per parameter shape
    noisy = lambda p: jnp.asarray(np.asarray(p) + 0.3 * rng.standard_normal(p.shape, np.float32))
    nnx.update(model, jax.tree.map(noisy, params))
    model.eval()
    return model


def _missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(_missing("jax2onnx", "onnxruntime")),
                    reason=f"needs the 'export' extra: {_missing('jax2onnx', 'onnxruntime')} not installed")
@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_onnx_runtime_equals_jax(tmp_path, name):
    model = tiny_model(name=name, **({"stride": 1, "highpass": 5} if name == "tconv" else {}))
    x = scorecard.window(WINDOW, batch=2, seed=3)
    want = scorecard.jit_predict(model)(x)  # jitted: eager nnx compiles every op on its own (slow)
    assert np.abs(want - x).max() > 0.1  # the model does something: equality below means something
    for batch in (1, 2):  # batch 1: the plain graph; batch 2: it mapped over windows (ONNX Loop)
        export.to_onnx(model, WINDOW, tmp_path / f"m{batch}.onnx", batch=batch)
        # A batch larger than the file's runs in slices of the file's batch.
        got = export.onnx_predict(tmp_path / f"m{batch}.onnx")(x)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_stablehlo_roundtrip_any_batch(tmp_path):
    model = tiny_model()
    export.to_stablehlo(model, WINDOW, tmp_path / "m.stablehlo")
    predict = export.load_stablehlo(tmp_path / "m.stablehlo")  # no model code: the serialized program
    for batch in (1, 3):
        x = scorecard.window(WINDOW, batch=batch, seed=batch)
        np.testing.assert_allclose(predict(x), scorecard.jit_predict(model)(x), atol=1e-5, rtol=0)


@pytest.mark.skipif(bool(_missing("qwix")), reason="needs qwix (the 'export' extra) for int8 quantization")
def test_int8_weights_are_int8_and_close():
    model = tiny_model(dim=64, heads=2, latent_dim=16)
    x = scorecard.window(WINDOW, batch=2, seed=5)
    q = quantize.quantize(model, x)
    kernels = [v for p, v in jax.tree_util.tree_leaves_with_path(nnx.state(q, nnx.Param))
               if "kernel" in jax.tree_util.keystr(p)]
    assert kernels and {str(np.asarray(k).dtype) for k in kernels} >= {"int8"}
    assert scorecard.param_bytes(model) / scorecard.param_bytes(q) >= 3.5
    # int8 per-channel weights: the model's correction (output - input) is kept to a few percent.
    y, yq = scorecard.jit_predict(model)(x), scorecard.jit_predict(q)(x)
    assert np.linalg.norm(yq - y) / np.linalg.norm(y - x) < 0.05


def test_largest_fitting_is_the_last_size_that_fits():
    for threshold in (0, 1, 2, 3, 7, 8, 9, 31, 100):
        calls = []
        fits = lambda b, t=threshold, calls=calls: calls.append(b) or b <= t
        assert batch_finder.largest_fitting(fits, max_batch=64) == min(threshold, 64)
        assert len(calls) <= 2 * 6 + 2  # doubling then bisection: ~2·log2(64) sizes


def _sgd_step_probe():
    """A plain SGD step of the tiny model on the test mesh (8 CPU devices on 'data')."""
    model = tiny_model(name="tconv", stride=1)  # the lightest to compile
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    mesh = parallel.make_mesh(deepmimic_denoise.get_config("runlocal").mesh)

    def step(params, batch):
        loss = lambda p: jnp.mean((nnx.merge(graphdef, p, rest)(batch["noisy"]) - batch["clean"]) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), {"loss": value}

    replicated = parallel.replicated(mesh)
    jitted = jax.jit(step, in_shardings=(replicated, parallel.window_sharding(mesh)),
                     out_shardings=(replicated, None), donate_argnums=0)
    return batch_finder.StepProbe(jitted, jax.device_put(params, replicated), WINDOW, mesh), jitted, mesh


def _peak(jitted, params, mesh, global_batch):
    """Per-device bytes from XLA's memory analysis, lowered here directly (not through the probe)."""
    spec = jax.ShapeDtypeStruct((global_batch, *WINDOW), jnp.float32, sharding=parallel.window_sharding(mesh))
    m = jitted.lower(params, {"noisy": spec, "clean": spec}).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def test_batch_finder_respects_a_forced_memory_limit():
    probe, jitted, mesh = _sgd_step_probe()
    devices = mesh.shape["data"]
    small = _peak(jitted, probe.state, mesh, 2 * devices)
    large = _peak(jitted, probe.state, mesh, 8 * devices)
    assert small < large  # memory grows with the batch, or no limit could separate sizes
    limit = (small + large) // 2
    chosen = batch_finder.max_batch(probe, limit, max_per_device=16)
    assert 2 <= chosen < 8
    assert _peak(jitted, probe.state, mesh, chosen * devices) <= limit
    assert _peak(jitted, probe.state, mesh, (chosen + 1) * devices) > limit


def test_magnitude_mask_zeroes_the_smallest_weights_of_each_kernel():
    model = tiny_model()
    params = nnx.state(model, nnx.Param)
    mask = prune.magnitude_mask(params, 0.7)
    for (path, w), m in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(mask), strict=True):
        w, m = np.asarray(w), np.asarray(m)
        if "kernel" in jax.tree_util.keystr(path) and w.ndim >= 2:
            assert abs(1 - m.mean() - 0.7) < 0.05
            assert np.abs(w[m == 0]).max() <= np.abs(w[m == 1]).min()  # the smallest ones went
        else:
            assert m.all()  # biases and norms are never pruned
    pruned = jax.tree.map(lambda p, k: p * k, params, mask)
    assert abs(prune.sparsity_of(pruned) - 0.7) < 0.05


def test_masked_updates_keep_pruned_weights_at_zero():
    params = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32)}
    mask = {"w": (jnp.abs(params["w"]) > 0.5).astype(jnp.float32)}
    params = jax.tree.map(jnp.multiply, params, mask)
    tx = optax.chain(optax.adamw(0.1, weight_decay=0.1), finetune.keep_masked(mask))
    state = tx.init(params)
    for i in range(5):
        grads = {"w": jnp.asarray(np.random.default_rng(i + 1).standard_normal((8, 8)), jnp.float32)}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    w, m = np.asarray(params["w"]), np.asarray(mask["w"])
    assert (w[m == 0] == 0).all() and (w[m == 1] != 0).all()


def test_channel_pruning_removes_exactly_the_dead_channels():
    cfg = base.get_config().model
    cfg.update(name="transformer", dim=16, depth=1, heads=2, mlp_ratio=2, halo=2, latent_dim=8, stride=2,
               residual=True, dtype="float32")
    model = tiny_model()
    x = scorecard.window(WINDOW, batch=2, seed=6)
    # Silence half of each MLP's hidden channels: removing them must not change the output.
    for _, block in nnx.iter_graph(model):
        if isinstance(block, models.AttentionBlock):
            dead = np.arange(block.mlp_in.kernel.shape[1]) % 2 == 1
            block.mlp_out.kernel[...] = np.where(dead[:, None], 0.0, np.asarray(block.mlp_out.kernel[...]))
    small, small_cfg = prune.prune_mlp_channels(model, cfg, FEATURES, WINDOW[1], keep=0.5)
    assert small_cfg.mlp_ratio == 1
    assert scorecard.param_count(small) < scorecard.param_count(model)
    np.testing.assert_allclose(scorecard.jit_predict(small)(x), scorecard.jit_predict(model)(x), atol=1e-5)


def test_width_pruning_keeps_the_strongest_stream_channels_in_every_layer():
    cfg = base.get_config().model
    cfg.update(name="tconv", dim=16, depth=1, kernel=3, latent_dim=8, stride=4, stages=2, residual=False,
               upsample="interp", dtype="float32")
    model = tiny_model(**{k: cfg[k] for k in ("name", "stride", "stages", "residual", "upsample")})
    x = scorecard.window(WINDOW, batch=2, seed=7)
    same, _ = prune.prune_width(model, cfg, FEATURES, WINDOW[1], dim=16)   # every channel: the same model
    np.testing.assert_allclose(scorecard.jit_predict(same)(x), scorecard.jit_predict(model)(x), atol=1e-6)
    # Channels 1, 3, 5, ... carry weights 100x weaker in every layer: pruning to 8 keeps 0, 2, 4, ...
    weak = np.arange(16) % 2 == 1
    params = nnx.state(model, nnx.Param)

    def weaken(w):
        w = np.asarray(w)
        for a, n in enumerate(w.shape):
            if n % 16 == 0 and n // 16 in (1, 2):    # stream axes: 16 channels, or 2 frames x 16
                w = np.moveaxis(np.moveaxis(w, a, 0) * np.where(np.tile(weak, n // 16), 0.01, 1.0)
                                .reshape(n, *[1] * (w.ndim - 1)), 0, a)
        return jnp.asarray(w)

    nnx.update(model, jax.tree.map(weaken, params))
    small, small_cfg = prune.prune_width(model, cfg, FEATURES, WINDOW[1], dim=8)
    assert small_cfg.dim == 8 and scorecard.param_count(small) < scorecard.param_count(model) / 2.5
    kept = np.flatnonzero(~weak)
    conv, small_conv = model.encoder[0][0].conv.kernel[...], small.encoder[0][0].conv.kernel[...]
    np.testing.assert_array_equal(small_conv, np.asarray(conv)[:, :, kept][..., kept])
    down, small_down = np.asarray(model.downs[0].kernel[...]), small.downs[0].kernel[...]  # [2 x 16, 16]
    np.testing.assert_array_equal(small_down, down[np.concatenate([kept, 16 + kept])][:, kept])
    head = np.asarray(model.rotation_head.kernel[...])
    np.testing.assert_array_equal(small.rotation_head.kernel[...], head[kept])


def test_finetune_runs_the_trainers_step_masked_and_distilled(deepmimic_dir):
    """The fine-tuning loop is the trainer's step with two hooks: pruned weights stay exactly zero
    while the kept ones train, and with a teacher at weight 0 the student trains exactly as without
    one (the objective's mix adds nothing), while weight 1 trains it towards the teacher instead."""
    from motionjax.data import pipeline
    from motionjax.efficiency import trained
    from runs import runlocal_config

    config = runlocal_config(deepmimic_dir)
    info = pipeline.dataset_info(config.data)
    student, teacher = trained.build_model(config, info, seed=1), tiny_teacher(config, info)
    params = jax.tree.map(np.asarray, nnx.state(student, nnx.Param))
    mask = prune.magnitude_mask(params, 0.5)
    # One loop for the masked and the plain run (as the teacher's loop below serves both its runs): one
    # traced and compiled step, which every run uses (all-ones mask when nothing is pruned).
    loop = finetune.Loop(config, info, student, 3)
    tuned, _ = loop.run(student, seed=0, mask=mask)
    after = jax.tree.map(np.asarray, nnx.state(tuned, nnx.Param))
    for w, m in zip(jax.tree.leaves(after), jax.tree.leaves(mask), strict=True):
        assert (w[m == 0] == 0).all()
    assert any(not np.array_equal(w[m == 1], w0[m == 1])
               for w, w0, m in zip(*(jax.tree.leaves(t) for t in (after, params, mask)), strict=True))
    plain, _ = loop.run(student, seed=0)
    loop = finetune.Loop(config, info, student, 3, teacher=teacher)
    zero, _ = loop.run(student, seed=0, alpha=0.0)
    one, _ = loop.run(student, seed=0, alpha=1.0)
    leaves = lambda m: jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(m, nnx.Param)))
    for a, b in zip(leaves(plain), leaves(zero), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(leaves(plain), leaves(one), strict=True))


def tiny_teacher(config, info):
    """Another model of the config's architecture, with other weights: its outputs are not the data."""
    from motionjax.efficiency import trained

    return trained.build_model(config, info, seed=7)
