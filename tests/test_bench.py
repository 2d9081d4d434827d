"""The benchmark's pieces: power-law fit, MFU arithmetic, FLOP counts, and the PyTorch peer computing
the same model and loss as motionjax (so the speed comparison compares one computation)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import measure, report


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
# benchmarks/bench.py and its report (benchmarks/report.py)


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
    results = suite.run(["growth", "train"], "quick", tmp_path, "python -m benchmarks.bench --quick")
    assert list(results["parts"]) == ["train", "growth"]  # in PARTS order, whatever the order asked
    assert set(results["part_wall_s"]) == {"train", "growth"}
    table = (tmp_path / "bench.md").read_text()
    assert "**train: failed** (RuntimeError: boom)" in table and "| step time ∝ T^k | k = 1.00" in table
    assert "`python -m benchmarks.bench --quick`" in table and "Time per part: train" in table

    def stop(sizes, out, done):
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM through benchmarks/bench.py's handler

    monkeypatch.setattr(suite, "RUNNERS", {"mfu": stop, "growth": growth})
    (tmp_path / "bench.json").write_text(json.dumps({"parts": {"train": {"error": "RuntimeError: boom"}}}))
    with pytest.raises(KeyboardInterrupt):
        suite.run(["mfu", "growth"], "quick", tmp_path, "python -m benchmarks.bench --quick")
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
    assert (parts, mode, command, kwargs) == (["dynamics"], "full", "python -m benchmarks.bench --full "
                                              "--parts dynamics --grid-budget 0", {"grid_budget_s": 0.0})
    assert calls[1][0][:2] == (["input", "train", "mfu", "growth"], "quick")
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
    assert max(default.growth_t) >= 1024 and default.growth_fixed
    assert default.steps == SIZES["full"].steps  # the same frames as the docs' full run: ratios comparable


def test_bench_table_states_the_grid_targets_on_the_joints_measured():
    from benchmarks import dynamics_grid
    rows = [_grid_row("24 (smpl_like)", 24, f, "float32", jvp=1.7 if f == 256 else 2.4)
            for f in (256, 1024, 4096)]
    grid = {"window": 64, "frames": [256, 1024, 4096], "dtypes": ["float32"], "rows": rows,
            "not_run": [{"J": "52 (random_tree)", "frames": 4096, "dtype": "float32"}],
            "grid_budget_s": 180.0, "targets": dynamics_grid.check_targets(rows)}
    part = {"results": grid, "markdown": dynamics_grid.markdown(grid), "met": True}
    table = report.markdown({"quick": False, "mode": "default", "command": "python -m benchmarks.bench",
                             "date": "", "wall_s": 1.0, "parts": {"dynamics": part},
                             "machine": report.machine()})
    assert ("| dynamics loss + gradient, dense `jax.jacfwd` ÷ blocked (J = 24, 4,096 frames) | **60.0×** "
            "| ≥ 50× | yes |") in table
    assert "4,096 frames (worst of J = 24) | 2.40× | ≥ 1.5× | yes |" in table
    assert "| the same at 256 frames (worst of J = 24) | 1.70× | ≥ 1× | yes |" in table
    assert "Not run (grid budget of 180 s spent): J = 52 × 4096 (float32)." in table


def test_input_pool_reads_the_rounds_of_every_run_as_one_set(tmp_path):
    """benchmarks/input.py --pool: a figure pooled over runs is timing.overhead over their rounds
    concatenated; each run's own figure is beside it; a row missing from one run is left out."""
    from benchmarks import input as inp
    from motionjax import timing

    rng = np.random.default_rng(0)
    runs = []
    for r, cost in enumerate((1.02, 1.04)):  # fed 2% / 4% slower than fixed in each run
        fixed = rng.uniform(0.2, 0.3, 10 + 5 * r)
        seconds = {"fixed": fixed.tolist(), "fixed_again": (fixed * 1.001).tolist(),
                   "fed": (fixed * cost).tolist()}
        rows = {"autoencoder/device": {"seconds": seconds, "design": {"design": "interleaved"}}}
        if r == 0:
            rows["denoiser/device"] = {"seconds": seconds}
        path = tmp_path / f"run{r}.json"
        path.write_text(json.dumps({"rows": rows}))
        runs.append((path, seconds))
    pooled = inp.pool([p for p, _ in runs])
    assert set(pooled) == {"autoencoder/device"}
    fig = pooled["autoencoder/device"]["input_overhead"]
    both = {k: runs[0][1][k] + runs[1][1][k] for k in ("fed", "fixed")}
    assert fig["pooled"] == timing.overhead(both, "fed")
    assert fig["pooled"]["rounds"] == 25 and [c["rounds"] for c in fig["runs"]] == [10, 15]
    assert [round(c["value"], 4) for c in fig["runs"]] == [round(1 - 1 / 1.02, 4), round(1 - 1 / 1.04, 4)]
    assert fig["runs"][0]["value"] < fig["pooled"]["value"] < fig["runs"][1]["value"]
    assert "null" in pooled["autoencoder/device"] and "other" not in pooled["autoencoder/device"]
    table = inp._pool_table(pooled, [p for p, _ in runs])
    assert "**" in table and "(10 rounds, interleaved)" in table  # each run's design beside its figure
