"""The benchmark's pieces: power-law fit, MFU arithmetic, FLOP counts, and the PyTorch peer computing
the same model and loss as motionjax (so the speed comparison compares one computation)."""
import json
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from benchmarks import measure, report
from motionjax import losses, models
from motionjax.configs import base
from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.core.skeleton import deepmimic_humanoid, random_tree


def test_fit_power_law_recovers_exponent():
    x = np.array([16, 32, 64, 128, 256])
    k, c, r2 = measure.fit_power_law(x, 3e-3 * x**1.5)
    assert k == pytest.approx(1.5) and c == pytest.approx(3e-3) and r2 == pytest.approx(1.0)
    noisy = 2.0 * x * np.exp(np.random.default_rng(0).normal(0, 0.05, x.size))
    k, _, r2 = measure.fit_power_law(x, noisy)
    assert abs(k - 1.0) < 0.1 and 0.95 < r2 < 1.0


def test_mfu_and_flop_count_of_a_matmul():
    n = 128
    a = jnp.ones((n, n))
    compiled = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    assert measure.compiled_flops(compiled) == pytest.approx(2 * n**3, rel=0.01)
    assert measure.mfu(2e9, 0.5, 8e9) == pytest.approx(0.5)  # 4 GFLOP/s achieved of 8
    assert measure.peak_flops(n, repeats=2) > 0


def test_interleaved_times_every_call_round_robin():
    order = []
    calls = {name: (lambda name=name: order.append(name) or jnp.ones(2)) for name in ("a", "b")}
    times = measure.interleaved(calls, rounds=3, repeats=2)
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 3  # warm-up, then alternating rounds


def test_lower_and_compile_times_each_stage_and_sees_a_persistent_cache_hit():
    """With the session's persistent cache (conftest) keeping every program, the second compile of
    a program (a fresh one: a random constant), after the in-memory caches are cleared, is a load."""
    fresh = np.float32(np.random.default_rng().normal())
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + fresh)
    x = jnp.ones(7)
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        first, seconds = measure.lower_and_compile(lambda: f.lower(x))
        jax.clear_caches()
        again, cached = measure.lower_and_compile(lambda: f.lower(x))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    assert not seconds["cache_hit"] and cached["cache_hit"]
    assert seconds["lower_s"] > 0 and seconds["compile_s"] > 0  # CPU seconds tick in 10 ms: may be 0
    assert seconds["lower_cpu_s"] >= 0 and seconds["compile_cpu_s"] >= 0
    np.testing.assert_array_equal(first(x), again(x))


def test_time_call_waits_for_the_result():
    calls = []
    t = measure.time_call(lambda: calls.append(1) or jnp.ones(3), repeats=3, warmup=2)
    assert len(calls) == 5 and t >= 0


# ---------------------------------------------------------------------------------------------
# The PyTorch peer (skipped without the optional extra)


def _windows(skeleton, b, t, seed):
    """Smooth random motion, standardized: ``(clean, pred, mean, std)`` ``[B, T, F]``."""
    rng = np.random.default_rng(seed)
    root, angles = measure.smooth_motion(rng, b, t, skeleton.num_joints, angle_std=0.08)
    root += np.float32([0, 0.9, 0])
    x = np.asarray(features.pack(skeleton, jnp.asarray(root), rot.axis_angle_to_quat(jnp.asarray(angles))))
    f = x.shape[-1]
    mean, std = x.reshape(-1, f).mean(0), x.reshape(-1, f).std(0) + 0.1
    clean = ((x - mean) / std).astype(np.float32)
    pred = (clean + 0.2 * rng.standard_normal(clean.shape)).astype(np.float32)
    return clean, pred, mean.astype(np.float32), std.astype(np.float32)


@pytest.mark.parametrize("jacobian", ["blocked", "dense"])
def test_torch_loss_and_gradient_match_motionjax(jacobian):
    """On the DeepMimic body: ball, hinge and fixed joints (random trees: the Jacobian test below)."""
    torch = pytest.importorskip("torch")
    from benchmarks import torch_peer

    skeleton = deepmimic_humanoid()
    cfg = base.get_config().loss
    cfg.jacobian = jacobian
    cfg.dynamics = ml_collections.ConfigDict({"velocity": 1.0, "force": 0.01, "jerk": 1e-5})
    clean, pred, mean, std = _windows(skeleton, 2, 12, seed=1)

    def jax_loss(p):
        return losses.reconstruction_loss(cfg, skeleton, 30.0, p, jnp.asarray(clean), jnp.asarray(mean),
                                          jnp.asarray(std))

    (loss, terms), grad = jax.jit(jax.value_and_grad(jax_loss, has_aux=True))(jnp.asarray(pred))
    p = torch.tensor(pred, requires_grad=True)
    t_loss, t_terms = torch_peer.reconstruction_loss(cfg, torch_peer.Body(skeleton), 30.0, p,
                                                     *(torch.tensor(x) for x in (clean, mean, std)))
    t_loss.backward()
    assert terms["dynamics"] > 0.1 * loss  # the Jacobian term carries weight in this check
    for k in terms:
        assert t_terms[k].item() == pytest.approx(float(terms[k]), rel=1e-4, abs=1e-6), k
    np.testing.assert_allclose(p.grad.numpy(), np.asarray(grad), rtol=1e-3, atol=1e-4 * np.abs(grad).max())


def test_torch_dense_jacobian_matches_blocked_jacobian():
    torch = pytest.importorskip("torch")
    from benchmarks import torch_peer
    from motionjax.core import kinematics

    skeleton = random_tree(7, seed=1)
    rng = np.random.default_rng(0)
    q = np.asarray(rot.axis_angle_to_quat(jnp.asarray(rng.normal(0, 0.6, (3, 7, 3)), jnp.float32)))
    root = rng.normal(0, 1, (3, 3)).astype(np.float32)
    jac = torch_peer.dense_jacobian(torch_peer.Body(skeleton), torch.tensor(q), torch.tensor(root)).detach()
    positions, world = kinematics.forward_kinematics(skeleton, q, root)
    reference = kinematics.dense_jacobian(skeleton, jnp.asarray(positions), jnp.asarray(world))
    np.testing.assert_allclose(jac.numpy(), np.asarray(reference), atol=1e-5)


def test_torch_model_matches_flax_model_with_copied_weights():
    torch = pytest.importorskip("torch")
    from flax import nnx

    from benchmarks import torch_peer

    cfg = base.get_config().model
    cfg.update(dim=32, heads=2, halo=3, latent_dim=8, dtype="float32")
    f, chunk = 21, 8
    model = models.make_model(cfg, f, chunk, nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(0)
    for _, v in nnx.to_flat_state(params):  # non-zero heads and biases: every weight matters
        v.set_value(v.get_value() + 0.1 * rng.standard_normal(v.get_value().shape).astype(np.float32))
    nnx.update(model, params)
    twin = torch_peer.make_model(cfg, f, chunk)
    torch_peer.load_flax_params(twin, params)
    x = rng.standard_normal((2, 3, chunk, f)).astype(np.float32)
    with torch.no_grad():
        out = twin(torch.tensor(x)).numpy()
    np.testing.assert_allclose(out, np.asarray(model(jnp.asarray(x))), atol=1e-4)


def test_torch_inverse_kinematics_matches_motionjax():
    """Ball, hinge and fixed joints (the DeepMimic body), targets off the bones' reach."""
    torch = pytest.importorskip("torch")
    from benchmarks import torch_peer
    from motionjax.core import kinematics

    skeleton = deepmimic_humanoid()
    rng = np.random.default_rng(0)
    j = skeleton.num_joints
    hint = np.array(rot.axis_angle_to_quat(jnp.asarray(rng.normal(0, 0.5, (3, j, 3)), jnp.float32)))
    hint[:, [i for i, k in enumerate(skeleton.kinds) if k == "fixed"]] = [1, 0, 0, 0]
    goal = np.asarray(kinematics.forward_kinematics(skeleton, jnp.asarray(hint), jnp.zeros((3, 3)))[0])
    goal = (goal + rng.normal(0, 0.05, goal.shape)).astype(np.float32)  # unreachable: least squares decides
    ours = np.asarray(kinematics.inverse_kinematics(skeleton, jnp.asarray(goal), jnp.asarray(hint)))
    body = torch_peer.Body(skeleton)
    twin = torch_peer.inverse_kinematics(body, torch.tensor(goal), torch.tensor(hint)).numpy()
    # q and -q are one rotation: compare the rotations.
    np.testing.assert_allclose(np.asarray(rot.quat_to_matrix(twin)), np.asarray(rot.quat_to_matrix(ours)),
                               atol=2e-5)
    assert not np.allclose(ours, hint, atol=1e-2)  # the targets moved the joints


def _headline_twins(torch_peer):
    """The headline autoencoder's shape, small (experiments/autoencoder.py: temporal convs in two
    stages, interpolating decoder, FK positions in, the IK position head out), as Flax model and
    its perturbed weights, ``make_twin(state)``: the PyTorch twin holding a Flax ``Param`` state, and
    windows ``[2, 4, chunk, F]``."""
    from flax import nnx

    skeleton = deepmimic_humanoid()
    clean, _, mean, std = _windows(skeleton, 2, 32, seed=2)
    info = ml_collections.ConfigDict({"skeleton": skeleton, "mean": mean, "std": std})
    cfg = base.get_config().model
    cfg.update(name="tconv", dim=32, depth=1, kernel=5, stride=4, stages=2, latent_dim=16, upsample="interp",
               input_positions=True, position_head=True, dtype="float32")
    f, chunk = clean.shape[-1], 8
    model = models.make_model(cfg, f, chunk, nnx.Rngs(0), info=info)
    params = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(0)
    for _, v in nnx.to_flat_state(params):  # non-zero heads and biases: every weight matters
        v.set_value(v.get_value() + 0.05 * rng.standard_normal(v.get_value().shape).astype(np.float32))
    nnx.update(model, params)
    def make_twin(state):
        twin = torch_peer.make_model(cfg, f, chunk, info)
        torch_peer.load_flax_params(twin, state)
        return twin

    return model, params, make_twin, clean.reshape(2, 4, chunk, f)


def test_torch_headline_model_matches_flax_model_with_copied_weights():
    torch = pytest.importorskip("torch")
    from benchmarks import torch_peer

    model, params, make_twin, x = _headline_twins(torch_peer)
    twin = make_twin(params)
    with torch.no_grad():
        out = twin(torch.tensor(x)).numpy()
    expected = np.asarray(model(jnp.asarray(x)))
    assert np.abs(expected[..., 3:] - x[..., 3:]).mean() > 0.1  # the head moved the rotations
    np.testing.assert_allclose(out, expected, atol=2e-4 * np.abs(expected).max())


@pytest.mark.parametrize("optimizer,bf16", [("adamw", False), ("muon", False), ("muon", True)])
def test_torch_optimizer_updates_match_optax(optimizer, bf16):
    """Updates of the twin's optimizer from the same gradients move every weight as motionjax's
    (optax) does: three of AdamW to float32 precision; the first of Muon to float32 precision too,
    or within bfloat16's with torch's own Newton-Schulz (``bf16``). Only the first: optax
    bias-corrects Muon's momentum, torch does not, so their directions differ in the first
    ~1 / (1 - 0.95) updates, while the warmup's rate is small."""
    pytest.importorskip("torch")
    import optax

    from benchmarks import torch_peer
    from motionjax.train import step

    _, params, make_twin, _ = _headline_twins(torch_peer)
    twin = make_twin(params)
    cfg = base.get_config().train
    cfg.update(optimizer=optimizer, steps=10, warmup_steps=0, learning_rate=3e-3, weight_decay=0.1,
               grad_accum_steps=1, grad_clip=1e9)
    tx = step.make_optimizer(cfg)
    opt_state = tx.init(params)
    opts, schedules = torch_peer.make_optimizer(twin, cfg, muon_bf16=bf16)
    start = {k: v.detach().clone() for k, v in twin.named_parameters()}
    rng = np.random.default_rng(1)
    for _ in range(1 if optimizer == "muon" else 3):
        grads = jax.tree.map(lambda v: jnp.asarray(0.01 * rng.standard_normal(v.shape), jnp.float32), params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        for p, g in zip(twin.parameters(), make_twin(grads).parameters(), strict=True):
            p.grad = g.detach()  # the same gradients, in torch's layout
        for opt, schedule in zip(opts, schedules, strict=True):
            opt.step()
            schedule.step()
    expected = dict(make_twin(params).named_parameters())
    muon_matrices = 0
    for name, p in twin.named_parameters():
        ours, ref = p.detach() - start[name], expected[name].detach() - start[name]
        assert float(ref.norm()) > 0, name
        matrix = optimizer == "muon" and ref.ndim == 2
        muon_matrices += matrix
        assert float((ours - ref).norm() / ref.norm()) < (3e-2 if matrix and bf16 else 1e-4), name
    assert muon_matrices >= 10 if optimizer == "muon" else muon_matrices == 0


def test_torch_loss_matches_motionjax_on_clip_bones_and_padding():
    """``offsets`` per window (data.bones = "clip") and ``valid`` (padding frames count in no term,
    the dynamics loss's included; blocked Jacobian)."""
    torch = pytest.importorskip("torch")
    from benchmarks import torch_peer

    skeleton = deepmimic_humanoid()
    cfg = base.get_config().loss
    cfg.update(dynamics_weight=0.01, foot=1.0, contact_speed=100.0)  # every foot planted: the stencil counts
    cfg.dynamics = ml_collections.ConfigDict({"velocity": 1.0, "force": 0.01, "jerk": 1e-5})
    clean, pred, mean, std = _windows(skeleton, 2, 12, seed=3)
    rng = np.random.default_rng(3)
    offsets = (skeleton.offsets * rng.uniform(0.8, 1.2, (2, 1, 1))).astype(np.float32)
    valid = np.ones((2, 12), np.float32)
    valid[1, 8:] = 0
    pred[1, 8:] += 5.0  # padding frames: whatever they hold changes nothing

    def jax_loss(p):
        return losses.reconstruction_loss(cfg, skeleton, 30.0, p, jnp.asarray(clean), jnp.asarray(mean),
                                          jnp.asarray(std), offsets=jnp.asarray(offsets),
                                          valid=jnp.asarray(valid))

    (loss, terms), grad = jax.jit(jax.value_and_grad(jax_loss, has_aux=True))(jnp.asarray(pred))
    p = torch.tensor(pred, requires_grad=True)
    inputs = (torch.tensor(x) for x in (clean, mean, std, offsets, valid))
    t_loss, t_terms = torch_peer.reconstruction_loss(cfg, torch_peer.Body(skeleton), 30.0, p, *inputs)
    t_loss.backward()
    for k in terms:
        assert t_terms[k].item() == pytest.approx(float(terms[k]), rel=1e-4, abs=1e-6), k
    np.testing.assert_allclose(p.grad.numpy(), np.asarray(grad), rtol=1e-3, atol=1e-4 * np.abs(grad).max())
    assert terms["foot"] > 0 and terms["dynamics"] > 0
    assert np.abs(np.asarray(grad)[1, 8:]).max() == 0  # padding: no gradient


# ---------------------------------------------------------------------------------------------
# benchmarks/bench.py and its report (benchmarks/report.py)


def test_bench_skips_torch_part_without_torch(monkeypatch, tmp_path):
    from benchmarks import suite
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    monkeypatch.delitem(sys.modules, "benchmarks.torch_peer", raising=False)
    result = suite.part_torch(suite.SIZES["quick"], tmp_path, {})
    assert "pip install" in result["skipped"]
    assert "skipped" in report.markdown({"quick": True, "date": "", "wall_s": 1.0, "parts": {"torch": result},
                                         "machine": report.machine()})


def test_bench_table_flags_missed_targets():
    growth = {"batch": 8, "by_T": {32: 0.01, 64: 0.02, 128: 0.05}, "by_J": {15: 0.01, 30: 0.02},
              "fit_T": {"exponent": 1.3, "r2": 0.99}, "fit_T_tail": {"exponent": 1.32, "r2": 1.0},
              "fit_J": {"exponent": 1.0, "r2": 1.0}, "met": False}
    table = report.markdown({"quick": False, "date": "", "wall_s": 1.0, "parts": {"growth": growth},
                             "machine": report.machine()})
    assert "| step time ∝ T^k | k = 1.32 (T ≥ 64); 1.30 (all T) | k ≤ 1.1 | **no** |" in table


@pytest.mark.parametrize("bones", ["clip", "canonical"])
def test_compiled_step_runs_on_the_batch_it_builds(deepmimic_dir, bones):
    """bench's ahead-of-time step takes the batch bench builds for it, whatever keys the config's
    batches carry (``data.bones="clip"`` adds per-window offsets): a compiled step checks its input
    tree exactly, so a missing key is an error, not a retrace."""
    from benchmarks import suite
    from motionjax import train
    from motionjax.data import pipeline
    from runs import runlocal_config
    config = runlocal_config(deepmimic_dir)
    config.data.bones = bones
    info = pipeline.dataset_info(config.data)
    step, state, batch, mesh, _ = suite.compiled_step(config, info)
    assert set(batch) == set(train.abstract_batch(config, info, mesh))
    assert ("offsets" in batch) == (bones == "clip")
    _, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"]))


# ---------------------------------------------------------------------------------------------
# The run's bounds: the grid budget, partial results, the modes


def _grid_row(label, joints, frames, dtype, jvp=2.0, dense=60.0):
    """A measured grid row as :func:`benchmarks.dynamics_grid.measure_size` returns it."""
    row = {"J": label, "joints": joints, "frames": frames, "dtype": dtype, "rounds": 3, "wall_s": 100.0,
           "skipped": {}, "blocked_ms": 1.0, "jvp_ms": jvp, "dense_ms": dense, "jvp_over_blocked": jvp,
           "jvp_over_blocked_range": [jvp, jvp], "dense_over_blocked": dense}
    return row | {f"{n}_temp_mb": 1.0 for n in ("blocked", "jvp", "dense")}


def test_dynamics_grid_runs_target_rows_first_and_starts_none_past_its_budget(monkeypatch, tmp_path):
    """Rows run float32 at the targets' sizes first (per J, the largest first), then 65,536 frames,
    then bfloat16; once the grid budget is spent no row starts and the rest are listed as not run."""
    import types

    from benchmarks import dynamics_grid
    clock, order = [0.0], []

    def measure_size(label, skeleton, frames, dtype, budget_s):
        order.append((skeleton.num_joints, frames, dtype))
        clock[0] += 100.0  # every row takes 100 s of the fake clock
        return _grid_row(label, skeleton.num_joints, frames, dtype)

    monkeypatch.setattr(dynamics_grid, "measure_size", measure_size)
    monkeypatch.setattr(dynamics_grid, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(dynamics_grid.malloc, "keep_freed_memory", lambda: None)
    partial = tmp_path / "partial.json"
    results = dynamics_grid.run(joints=(13, 24), frames=(256, 4096, 65536), dtypes=("float32", "bfloat16"),
                                grid_budget_s=450.0, partial=partial)
    # J = 13 is the DeepMimic humanoid (15 joints), J = 24 the SMPL-like body.
    assert order == [(15, 4096, "float32"), (15, 256, "float32"), (24, 4096, "float32"), (24, 256, "float32"),
                     (15, 65536, "float32")]  # started at 0, 100, ..., 400 s; none at 500 s
    assert [(r["J"].split()[0], r["frames"], r["dtype"]) for r in results["not_run"]] == [
        ("24", 65536, "float32"), ("13", 4096, "bfloat16"), ("13", 256, "bfloat16"), ("24", 4096, "bfloat16"),
        ("24", 256, "bfloat16"), ("13", 65536, "bfloat16"), ("24", 65536, "bfloat16")]
    assert len(json.loads(partial.read_text())["rows"]) == 5  # rewritten after every row
    assert "Not run (grid budget of 450 s spent): J = 24 × 65536 (float32)" in "\n".join(
        dynamics_grid.markdown(results))


def test_dynamics_targets_are_judged_on_the_rows_measured():
    from benchmarks.dynamics_grid import check_targets
    j24 = [_grid_row("24", 24, f, "float32") for f in (256, 1024, 4096)]
    t = check_targets(j24)
    assert t["met"] and t["joints"] == [24] and len(t["measured"]) == 3
    assert t["dense_over_blocked_J24_4096"] == 60.0
    slow = check_targets([*j24, _grid_row("52", 52, 1024, "float32", jvp=1.4)])  # one J misses 1.5x
    assert not slow["met"] and slow["jvp_over_blocked_min_at_1024_4096"] == 1.4 and slow["joints"] == [24, 52]
    only_1024 = check_targets([j24[1], _grid_row("24", 24, 1024, "bfloat16", jvp=0.5)])  # bf16 is not judged
    assert only_1024["met"] and only_1024["measured"] == ["jvp_over_blocked_min_at_1024_4096"]
    assert not check_targets([])["met"]  # nothing measured is not a target met


GROWTH = {"batch": 8, "by_T": {32: 0.01, 64: 0.02, 128: 0.04}, "by_J": {}, "by_T_at_1024_frames": {},
          "fit_T": {"exponent": 1.0, "coefficient": 3e-4, "r2": 1.0},
          "fit_T_tail": {"exponent": 1.0, "coefficient": 3e-4, "r2": 1.0}, "met": True}


def test_bench_run_keeps_finished_parts_when_one_fails_or_is_stopped(monkeypatch, tmp_path):
    from benchmarks import suite

    def fail(sizes, out, done):
        raise RuntimeError("boom")

    def growth(sizes, out, done):
        assert json.loads((out / "bench.json").read_text())["parts"]["train"]["error"] == "RuntimeError: boom"
        return dict(GROWTH)

    monkeypatch.setattr(suite, "RUNNERS", {"train": fail, "growth": growth})
    results = suite.run(["growth", "train"], "quick", tmp_path, "python benchmarks/bench.py --quick")
    assert list(results["parts"]) == ["train", "growth"]  # in PARTS order, whatever the order asked
    assert set(results["part_wall_s"]) == {"train", "growth"}
    table = (tmp_path / "bench.md").read_text()
    assert "**train: failed** (RuntimeError: boom)" in table and "| step time ∝ T^k | k = 1.00" in table
    assert "`python benchmarks/bench.py --quick`" in table and "Time per part: train" in table

    def stop(sizes, out, done):
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM through benchmarks/bench.py's handler

    monkeypatch.setattr(suite, "RUNNERS", {"mfu": stop, "growth": growth})
    (tmp_path / "bench.json").write_text(json.dumps({"parts": {"train": {"error": "RuntimeError: boom"}}}))
    with pytest.raises(KeyboardInterrupt):
        suite.run(["mfu", "growth"], "quick", tmp_path, "python benchmarks/bench.py --quick")
    kept = json.loads((tmp_path / "bench.json").read_text())
    assert kept["parts"]["mfu"]["error"] == "interrupted" and "growth" not in kept["parts"]


def test_bench_command_line_picks_the_mode_and_grid_budget(monkeypatch):
    from benchmarks import bench
    calls = []
    monkeypatch.setattr(bench, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    bench.main(["--full", "--parts", "dynamics", "--grid-budget", "0"])
    bench.main(["--quick"])
    bench.main([])
    (parts, mode, _, command), kwargs = calls[0]
    assert (parts, mode, command, kwargs) == (["dynamics"], "full", "python benchmarks/bench.py --full "
                                              "--parts dynamics --grid-budget 0", {"grid_budget_s": 0.0})
    assert calls[1][0][:2] == (["input", "train", "torch", "mfu", "growth"], "quick")
    assert calls[2][0][:2] == (list(bench.PARTS), "default") and calls[2][1] == {"grid_budget_s": None}
    for argv in (["--quick", "--full"], ["--parts", "train,fk"]):
        with pytest.raises(SystemExit):
            bench.main(argv)


def test_default_bench_measures_what_the_readme_claims():
    """The README's speed table names, per row, the command that produced it; these are the rows
    `make bench` (the default mode) must still produce."""
    from benchmarks.suite import SIZES
    default = SIZES["default"]
    grid = default.grid
    assert 24 in grid["joints"] and set(grid["frames"]) >= {256, 1024, 4096} and "float32" in grid["dtypes"]
    assert max(default.growth_t) >= 1024 and default.growth_fixed and default.torch_pairs
    assert default.steps == SIZES["full"].steps  # the same frames as the docs' full run: ratios comparable


def test_bench_table_states_the_grid_targets_on_the_joints_measured():
    from benchmarks import dynamics_grid
    rows = [_grid_row("24 (smpl_like)", 24, f, "float32", jvp=1.7 if f == 256 else 2.4)
            for f in (256, 1024, 4096)]
    grid = {"window": 64, "frames": [256, 1024, 4096], "dtypes": ["float32"], "rows": rows,
            "not_run": [{"J": "52 (random_tree)", "frames": 4096, "dtype": "float32"}],
            "grid_budget_s": 180.0, "targets": dynamics_grid.check_targets(rows)}
    part = {"results": grid, "markdown": dynamics_grid.markdown(grid), "met": True}
    table = report.markdown({"quick": False, "mode": "default", "command": "python benchmarks/bench.py",
                             "date": "", "wall_s": 1.0, "parts": {"dynamics": part},
                             "machine": report.machine()})
    assert ("| dynamics loss + gradient, dense `jax.jacfwd` ÷ blocked (J = 24, 4,096 frames) | **60.0×** "
            "| ≥ 50× | yes |") in table
    assert "4,096 frames (worst of J = 24) | 2.40× | ≥ 1.5× | yes |" in table
    assert "| the same at 256 frames (worst of J = 24) | 1.70× | ≥ 1× | yes |" in table
    assert "Not run (grid budget of 180 s spent): J = 52 × 4096 (float32)." in table
