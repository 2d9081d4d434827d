"""The parts of ``benchmarks/bench.py`` and the sizes each mode runs them at: motionjax optimized vs
baseline, MFU, cost growth.

Every number comes from one run, on the same data and model size, so ratios are meaningful even on a
shared machine:

a. ``train``: end-to-end training frames/s of ``experiments/deepmimic_denoise.py`` (optimized) vs
   ``experiments/baseline.py`` (dense ``jax.jacfwd`` dynamics loss, main-thread numpy loader, fp32,
   no prefetch), both with the model and loss pinned by :func:`experiment` (the residual transformer
   with the dynamics loss on, not the default experiment's conv denoiser), both through
   :func:`motionjax.train.train_and_evaluate` for the same number of frames, and their held-out
   MPJPE afterwards: the configs alternate seed by seed, and one more run of each from the same
   initial weights on the same batches isolates what the implementation changes;
b. step-time breakdown of both: data wait (the trainer's own timing), compute split into model and
   loss (fwd + bwd, separately jitted), communication (collectives in the compiled step's HLO);
c. ``dynamics``: the dynamics loss + gradient, blocked vs jvp/vjp vs dense, J × frames per batch ×
   dtype (:mod:`benchmarks.dynamics_grid`), within a grid budget;
d. (the PyTorch eager twin, removed with #63; its figures and command: docs/history.md);
e. ``mfu``: XLA ``cost_analysis()`` FLOPs per step / step time / peak FLOP/s of a large matmul;
f. ``growth``: step time vs window length T (and vs joints J, random trees), fitted exponents;
g. ``input``: the input overhead, fed vs fixed batch, of the headline autoencoder, the DeepMimic
   denoiser and a ~5 ms-step stand-in (the input inside the step, as its own program, as the loop
   before #61 ran it), the input program alone and the host's ms per step (:mod:`benchmarks.input`).

:data:`SIZES` says what each mode (``quick``, ``default``, ``full``) measures; :func:`run` runs
parts in order and writes ``bench.json`` and ``bench.md`` after each one, so a run stopped part way
keeps every finished part.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from benchmarks import dynamics_grid, measure
from benchmarks.report import MPJPE_TOLERANCE, TARGETS, machine, markdown, plots
from experiments import baseline, deepmimic_denoise
from motionjax import malloc, parallel, train
from motionjax.core import rotations as rot
from motionjax.core.features import pack
from motionjax.core.skeleton import random_tree
from motionjax.data import pipeline
from motionjax.data.info import stand_in
from motionjax.train import diagnostics

PARTS = ("input", "train", "dynamics", "mfu", "growth")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one mode measures: the knobs of every part."""

    steps: int                      # a: steps of each end-to-end training run (32 windows × 32 frames)
    seeds: tuple[int, ...]          # a: runs of each config, one per seed (data order, noise, weights)
    splits: tuple[str, ...]         # a: held-out splits evaluated after each run
    repeats: int                    # b, e, f: timed calls (or interleaved rounds) of a program alone
    split_compute: bool             # b: also time the model and the loss alone (two more compiles each;
                                    #    the baseline's dense-Jacobian loss is the slowest compile of a run)
    loader_batches: int             # b: batches timed of the input iterator alone
    mfu_variants: bool              # e: also the baseline and the optimized step in the other dtype
    growth_t: tuple[int, ...]       # f: window lengths T at batch 8
    growth_fixed: tuple[int, ...]   # f: T at B·T = 1,024 frames (the control: flat = no T² term)
    growth_j: tuple[int, ...]       # f: joints J of random trees
    grid: dict                      # c: dynamics_grid.run arguments (joints, frames, dtypes, budgets)
    input_steps: int | None = None  # g: steps of each fed / fixed trainer run (None: each case's own)


SIZES = {
    # A smoke check of every part but the grid (~2 min on 2 cores).
    "quick": Sizes(steps=20, seeds=(0,), splits=("validation",), repeats=3, split_compute=False,
                   loader_batches=5, mfu_variants=False,
                   growth_t=(32, 128), growth_fixed=(), growth_j=(),
                   grid=dict(joints=(13,), frames=(256,), dtypes=("float32",), budget_s=4.0),
                   input_steps=20),
    # `make bench`: every claim of the README's speed table that fits in ~12 minutes on 2 cores. The
    # grid is the SMPL-like body (J = 24) at the sizes the #15 targets name; its XLA compiles
    # (~1–2 min per row) are what bounds it, hence the grid budget.
    "default": Sizes(steps=100, seeds=(0,), splits=("validation",), repeats=5, split_compute=False,
                     loader_batches=10, mfu_variants=True,
                     growth_t=(32, 64, 128, 256, 512, 1024), growth_fixed=(32, 128, 512), growth_j=(),
                     grid=dict(joints=(24,), frames=(256, 1024, 4096), dtypes=("float32",), budget_s=8.0,
                               grid_budget_s=180.0)),
    # Everything docs/benchmarks.md reports: 3 seeds, both splits, J growth and the whole grid
    # (4 J × 256–65,536 frames × float32 and bfloat16): hours on 2 cores, most of it the grid.
    "full": Sizes(steps=100, seeds=(0, 1, 2), splits=("test", "validation"), repeats=5, split_compute=True,
                  loader_batches=10, mfu_variants=True,
                  growth_t=(32, 64, 128, 256, 512, 1024), growth_fixed=(32, 128, 512),
                  growth_j=(15, 30, 60, 120), grid=dict(budget_s=8.0)),
}


def experiment(module, steps: int):
    """An experiment config trimmed to ``steps`` steps: one held-out evaluation at the end, no references.

    The model and loss are pinned to the workload these benchmarks (and docs/benchmarks.md) measure:
    the residual transformer with the dynamics loss on (the default experiment now trains a conv
    denoiser without it, #13, which would leave the blocked-vs-dense Jacobian nothing to do)."""
    c = module.get_config()
    c.model.update(name="transformer", dim=128, depth=1, heads=4, mlp_ratio=2, halo=4, stride=2,
                   latent_dim=64, residual=True, highpass=0, stages=1)
    c.loss.dynamics_weight = 0.005
    c.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, references=())
    # The model's own held-out error only: no PCA reference (a fit on the train split), no per-label
    # plots, no skeleton figure or BVH; none of them is timed, but each run would wait for them.
    c.evals.final.update(references=(), by_label=False)
    del c.evals["clip"]
    return c


def log(message: str) -> None:
    """A progress line of the benchmark (stdout, flushed: the log of a long run shows where it is)."""
    print(f"[bench] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# A jitted train step built from the trainer's own pieces (for FLOPs, breakdowns, cost growth)


# The seconds of every program compiled_step compiled during the current part (:func:`_run_parts`
# moves them into the part's ``compile`` field).
COMPILES: list[dict] = []


def compiled_step(config, info):
    """The trainer's step (:func:`motionjax.train.lower_train_step`, compiled ahead of time) with a
    fresh train state and one batch of :func:`_batch`; its lowering and compile seconds go to
    :data:`COMPILES` (:func:`benchmarks.measure.lower_and_compile`).

    Returns ``(step, state, batch, mesh, (graphdef, loss_fn))`` with ``step(state, batch) -> (state,
    metrics)`` a ``jax.stages.Compiled`` (its ``cost_analysis()`` and HLO text are the step's).
    """
    mesh = parallel.make_mesh(config.mesh)
    compiled, seconds = measure.lower_and_compile(lambda: train.lower_train_step(config, info, mesh)[0])
    dynamics = config.loss.jacobian if config.loss.dynamics_weight > 0 else "off"
    model, data = config.model, config.data
    COMPILES.append({"program": f"train step: {model.name}, dynamics {dynamics}, {model.dtype}, B="
                                f"{data.batch_size} T={data.window} J={info.skeleton.num_joints}", **seconds})
    (graphdef, _, _), _, state, _ = train.init_state(config, info, mesh)
    batch = _batch(config, info, parallel.window_sharding(mesh))
    abstract = train.abstract_batch(config, info, mesh)
    batch["valid"] = jax.device_put(np.ones(abstract["valid"].shape, np.float32), abstract["valid"].sharding)
    if "offsets" in abstract:  # data.bones = "clip": every window on the body's own bones
        spec = abstract["offsets"]
        offsets = np.broadcast_to(info.skeleton.offsets, spec.shape).astype(np.float32)
        batch["offsets"] = jax.device_put(offsets, spec.sharding)
    return compiled, state, batch, mesh, (graphdef, train.make_loss_fn(config, info, mesh))


def _batch(config, info, window, seed=0):
    """A batch of real-looking windows: smooth random joint rotations encoded and standardized."""
    b, t, c = config.data.batch_size, config.data.window, config.data.chunk
    rng = np.random.default_rng(seed)
    root, angles = measure.smooth_motion(rng, b, t, info.skeleton.num_joints)
    x = (np.asarray(pack(info.skeleton, root, rot.axis_angle_to_quat(angles))) - info.mean) / info.std
    clean = x.reshape(b, t // c, c, -1).astype(np.float32)
    noisy = clean + rng.normal(0, 0.1, clean.shape).astype(np.float32)
    return {k: jax.device_put(v, window) for k, v in (("noisy", noisy), ("clean", clean))}


def stepper(step, state, batch):
    """A zero-argument call running one training step, the (donated) state threaded through."""
    holder = {"state": state}

    def call():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics

    return call


def train_step_cost(config, info, rounds: int = 5, weight: float = 0.005) -> dict:
    """What the dynamics loss costs a task's train step: milliseconds per step of ``config`` with the
    loss off and on (``weight``) with each Jacobian of :data:`motionjax.core.dynamics.JACOBIANS`,
    timed round-robin (:func:`measure.interleaved_rounds`, so load changes hit every variant alike),
    and each one's time over the step without the loss."""
    from motionjax.core import dynamics
    calls = {}
    for name in ("off", *dynamics.JACOBIANS):
        c = copy.deepcopy(config)
        c.loss.dynamics_weight = 0.0 if name == "off" else weight
        c.loss.jacobian = "blocked" if name == "off" else name
        step, state, batch, _, _ = compiled_step(c, info)
        calls[name] = stepper(step, state, batch)
        log(f"train step compiled: dynamics {name}")
    times = measure.interleaved_rounds(calls, rounds=rounds, repeats=3, warmup=1)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    return {"ms": ms, "vs_off": {k: v / ms["off"] for k, v in ms.items()},
            "rounds_ms": {k: [1e3 * t for t in v] for k, v in times.items()}}


# ---------------------------------------------------------------------------------------------
# (a) + (b): end to end, optimized vs baseline


def compute_split(config, info, repeats: int, split: bool = True) -> dict:
    """Seconds per step of the whole jitted step and (``split``) of the model alone and of the loss
    alone (forward + backward each); the step's XLA FLOPs and collectives."""
    from flax import nnx
    step, state, batch, mesh, (graphdef, loss_fn) = compiled_step(config, info)
    comm = diagnostics.collectives(step.as_text(), mesh)
    out = {"flops_per_step": measure.compiled_flops(step), "collectives": len(comm),
           "comm_bytes_per_step": float(sum(c.wire_bytes for c in comm))}
    params, rest = jax.tree.map(jnp.copy, (state["params"], state["rest"]))  # the step donates state
    out["step_s"] = measure.time_call(stepper(step, state, batch), repeats=repeats, warmup=1)
    if not split:
        return out

    @jax.jit
    def model_grad(params, noisy, cotangent):
        pred, pullback = jax.vjp(lambda p: nnx.merge(graphdef, p, rest)(noisy), params)
        return pullback(cotangent)

    pred = jax.jit(lambda p, x: nnx.merge(graphdef, p, rest)(x))(params, batch["noisy"])
    loss_grad = jax.jit(jax.grad(lambda p, c: loss_fn(p, c)[0]))
    cotangent = jax.random.normal(jax.random.key(0), pred.shape)  # an argument, not a foldable constant
    out["model_s"] = measure.time_call(lambda: model_grad(params, batch["noisy"], cotangent), repeats)
    out["loss_s"] = measure.time_call(lambda: loss_grad(pred, batch["clean"]), repeats)
    return out


def loader_seconds(config, info, batches: int) -> float:
    """Seconds per batch of the trainer's input iterator alone (no training step competing for the
    cores), after a warm-up that empties the prefetch buffers."""
    iterator = train.make_iterator(config, info, parallel.make_mesh(config.mesh))
    for _ in range(config.data.prefetch + 1):
        jax.block_until_ready(next(iterator))
    start = time.perf_counter()
    for _ in range(batches):
        jax.block_until_ready(next(iterator))
    seconds = (time.perf_counter() - start) / batches
    if hasattr(iterator, "close"):
        iterator.close()
    return seconds


def same_stream(configs: dict, steps: int) -> dict:
    """Held-out MPJPE (cm) of each config's train step run from the same initial state on the same
    ``steps`` batches (the first config's Grain stream). The configs differ in implementation only
    (Jacobian, loader), so this isolates what the implementation changes from data-order noise."""
    from motionjax.evaluation import metrics
    first = next(iter(configs.values()))
    info = pipeline.dataset_info(first.data)
    mesh = parallel.make_mesh(first.mesh)
    iterator = train.make_iterator(first, info, mesh)
    batches = [{k: b[k] for k in train.batch_keys(first)} for b in (next(iterator) for _ in range(steps))]
    iterator.close()
    held_out = {level: pipeline.make_eval_batches(first.data, info, "validation", level, seed=first.seed)
                for level in (0.0, first.evals.final.noise_level)}
    out = {}
    for name, config in configs.items():
        step, state, shardings, eval_graphdef = train.build_train_step(config, info, mesh)
        for batch in batches:
            state, _ = step(state, batch)
        predict = functools.partial(train.make_predict(eval_graphdef, mesh, shardings), state)
        args = (info.skeleton, float(info.fps), info.mean, info.std, config.loss.contact_speed)
        out[name] = {f"validation/{'clean' if level == 0 else 'noisy'}":
                     metrics.evaluate(predict, b, *args)["mpjpe"] for level, b in held_out.items()}
    return out


def part_train(sizes: Sizes, out: Path, done: dict) -> dict:
    steps, seeds = sizes.steps, sizes.seeds
    configs = {"optimized": experiment(deepmimic_denoise, steps), "baseline": experiment(baseline, steps)}
    for config in configs.values():
        config.evals.heldout.splits = config.evals.final.splits = sizes.splits
    all_runs, wall = {name: [] for name in configs}, dict.fromkeys(configs, 0.0)
    # Seed by seed the configs alternate, so a change of load on a shared machine hits both alike;
    # each config compiles once (later seeds hit this run's compilation cache).
    for seed in seeds:
        for name, config in configs.items():
            config.seed = seed
            workdir = out / "runs" / name / f"seed{seed}"
            shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, never a resumed one
            start = time.perf_counter()
            all_runs[name].append(train.train_and_evaluate(config, workdir))
            wall[name] += time.perf_counter() - start
            log(f"train: {name}, seed {seed}: {all_runs[name][-1]['frames_per_s']:.0f} frames/s, "
                f"{time.perf_counter() - start:.0f} s with compile and evaluation")
    rows = {}
    for name, config in configs.items():
        runs, start = all_runs[name], time.perf_counter()
        info = pipeline.dataset_info(config.data)
        per_seed = [{f"{split}/{cond}": r["results"][split][cond]["model"]["mpjpe"]
                     for split in config.evals.final.splits for cond in ("clean", "noisy")} for r in runs]
        mpjpe = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
        median = lambda key, runs=runs: float(np.median([r[key] for r in runs]))
        breakdown = compute_split(config, info, repeats=sizes.repeats, split=sizes.split_compute)
        breakdown["loader_s"] = loader_seconds(config, info, sizes.loader_batches)
        log(f"train: {name} breakdown, {time.perf_counter() - start:.0f} s")
        rows[name] = {
            "frames_per_s": median("frames_per_s"), "step_s": 1.0 / median("steps_per_s"),
            "data_wait_fraction": median("host_wait_fraction"), "compile_s": runs[0]["compile_s"],
            "wall_s": wall[name] + time.perf_counter() - start, "seeds": list(seeds),
            "frames": steps * config.data.batch_size * config.data.window,
            "heldout_mpjpe_cm": mpjpe, "heldout_mpjpe_mean_cm": float(np.mean(list(mpjpe.values()))),
            "heldout_mpjpe_mean_cm_per_seed": [float(np.mean(list(m.values()))) for m in per_seed],
            "breakdown": breakdown,
            "config": {"jacobian": config.loss.jacobian, "loader": config.data.loader,
                       "dtype": config.model.dtype, "prefetch": config.data.prefetch,
                       "batch": config.data.batch_size, "window": config.data.window},
        }
    opt, base = rows["optimized"], rows["baseline"]
    speedup = opt["frames_per_s"] / base["frames_per_s"]
    # Accuracy: the seed means carry data-order noise (the loaders differ); the same-stream run does not.
    start = time.perf_counter()
    paired = same_stream(configs, steps)
    log(f"train: same-stream runs, {time.perf_counter() - start:.0f} s")
    mean = {name: float(np.mean(list(m.values()))) for name, m in paired.items()}
    mpjpe_ok = mean["optimized"] <= mean["baseline"] * (1 + MPJPE_TOLERANCE)
    return {"steps": steps, "rows": rows, "speedup": speedup, "same_stream_mpjpe_cm": paired,
            "same_stream_mpjpe_mean_cm": mean, "mpjpe_equal_or_better": bool(mpjpe_ok),
            "met": bool(speedup >= TARGETS["speedup"] and mpjpe_ok)}


# ---------------------------------------------------------------------------------------------
# (g) the input path per residency tier: benchmarks/input.py


def part_input(sizes: Sizes, out: Path, done: dict) -> dict:
    from benchmarks import input as input_bench
    result = input_bench.run(out=out, log=log, steps=sizes.input_steps)
    return {**result, "markdown": input_bench.markdown(result)}


# ---------------------------------------------------------------------------------------------
# (c) dynamics loss across J: benchmarks/dynamics_grid.py (also benchmarks/bench_dynamics.py)


def part_dynamics(sizes: Sizes, out: Path, done: dict) -> dict:
    results = dynamics_grid.run(**sizes.grid, partial=out / "dynamics.partial.json")
    dynamics_grid.plot(results, out / "dynamics.png")
    return {"results": results, "markdown": dynamics_grid.markdown(results), "met": results["targets"]["met"]}


# ---------------------------------------------------------------------------------------------
# (e) MFU and (f) cost growth


def part_mfu(sizes: Sizes, out: Path, done: dict) -> dict:
    """MFU of the optimized and baseline steps (compute only, one fixed batch; the programs of part
    b come from the compilation cache). Steps and the peak matmuls are timed round-robin; the peak
    is the best of fp32 and bf16, so MFU is against what this machine can do in either precision."""
    configs = {"optimized": experiment(deepmimic_denoise, sizes.steps)}
    if sizes.mfu_variants:  # the baseline, and the optimized step with the other activation dtype
        configs["baseline"] = experiment(baseline, sizes.steps)
        other = "bfloat16" if configs["optimized"].model.dtype == "float32" else "float32"
        configs[f"optimized, {other}"] = experiment(deepmimic_denoise, sizes.steps)
        configs[f"optimized, {other}"].model.dtype = other
    calls, flops = {}, {}
    for name, config in configs.items():
        step, state, batch, _, _ = compiled_step(config, pipeline.dataset_info(config.data))
        calls[name], flops[name] = stepper(step, state, batch), measure.compiled_flops(step)
    n = 2048 if jax.default_backend() == "cpu" else 8192
    matmul_flops = {}
    for dtype in ("float32", "bfloat16"):
        calls[dtype], matmul_flops[dtype] = measure.matmul(n, jnp.dtype(dtype))
    times = measure.interleaved(calls, rounds=sizes.repeats)
    peaks = {k: matmul_flops[k] / times[k] for k in matmul_flops}
    peak = max(peaks.values())
    rows = {name: {"flops_per_step": flops[name], "step_s": times[name], "model_dtype": config.model.dtype,
                   "achieved_flops": flops[name] / times[name],
                   "mfu": measure.mfu(flops[name], times[name], peak)} for name, config in configs.items()}
    return {"peak_flops": peaks, "rows": rows, "mfu": rows["optimized"]["mfu"]}


def part_growth(sizes: Sizes, out: Path, done: dict) -> dict:
    """Step time of the optimized step vs T (DeepMimic body) and vs J (random trees), batch 8."""
    base = experiment(deepmimic_denoise, sizes.steps)
    base.data.batch_size = 8
    info = pipeline.dataset_info(base.data)
    calls = {}
    for t in sizes.growth_t:
        config = copy.deepcopy(base)
        config.data.window = t
        calls["T", t] = stepper(*compiled_step(config, info)[:3])
    # Control: B·T fixed at 1024 frames. Flat means the cost is per frame, i.e. no T² term.
    for t in sizes.growth_fixed:
        config = copy.deepcopy(base)
        config.data.update(window=t, batch_size=1024 // t)
        calls["BT", t] = stepper(*compiled_step(config, info)[:3])
    for j in sizes.growth_j:
        tree = stand_in(random_tree(j, seed=0), float(info.fps))
        calls["J", j] = stepper(*compiled_step(base, tree)[:3])
    log(f"growth: {len(calls)} steps compiled")
    times = measure.interleaved(calls, rounds=sizes.repeats)
    by_t = {t: s for (axis, t), s in times.items() if axis == "T"}
    by_j = {j: s for (axis, j), s in times.items() if axis == "J"}
    fixed_frames = {t: s for (axis, t), s in times.items() if axis == "BT"}

    def fit(times):
        k, c, r2 = measure.fit_power_law(list(times), list(times.values()))
        return {"exponent": k, "coefficient": c, "r2": r2}

    # The tail fit drops the smallest size, where fixed per-step costs hide the slope.
    result = {"batch": base.data.batch_size, "by_T": by_t, "by_J": by_j, "by_T_at_1024_frames": fixed_frames,
              "fit_T": fit(by_t),
              "fit_T_tail": fit(dict(list(by_t.items())[len(by_t) > 2:]))}
    if by_j:
        result["fit_J"] = fit(by_j)
    result["met"] = bool(result["fit_T_tail"]["exponent"] <= TARGETS["t_exponent"])
    return result


RUNNERS = {"input": part_input, "train": part_train, "dynamics": part_dynamics, "mfu": part_mfu,
           "growth": part_growth}


# ---------------------------------------------------------------------------------------------
# The run


def _write(results: dict, out: Path) -> str:
    """``bench.json`` and ``bench.md`` (the table) of the parts so far; returns the table."""
    table = markdown(results)
    (out / "bench.md").write_text(table)
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    return table


def run(parts, mode: str, out: Path, command: str, grid_budget_s: float | None = None) -> dict:
    """Run ``parts`` (a subset of :data:`PARTS`, in that order: mfu reuses the train part's
    numbers and compiled programs) at :data:`SIZES` ``[mode]``; returns the results.

    ``bench.json`` and ``bench.md`` are rewritten after every part (the grid also after every row,
    ``dynamics.partial.json``), so a run stopped part way (Ctrl-C, SIGTERM, a crash) keeps what it
    measured; a part that raises is recorded with its error and the run goes on to the next one.
    ``grid_budget_s`` overrides the mode's grid budget (0: none).
    """
    sizes = SIZES[mode]
    if grid_budget_s is not None:
        sizes = dataclasses.replace(sizes, grid={**sizes.grid, "grid_budget_s": grid_budget_s or None})
    out.mkdir(parents=True, exist_ok=True)
    malloc.keep_freed_memory()  # one_arena, late, as its figures were measured
    start = time.perf_counter()
    results = {"wall_s": 0.0, "mode": mode, "quick": mode == "quick", "command": command,
               "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "parts": {},
               "part_wall_s": {}, "sizes": dataclasses.asdict(sizes)}
    with _run_cache():
        _run_parts(parts, sizes, out, results, start)
    return results


def _run_parts(parts, sizes: Sizes, out: Path, results: dict, start: float) -> None:
    try:
        for name in sorted(parts, key=PARTS.index):
            log(f"{name}: started ({time.perf_counter() - start:.0f} s into the run)")
            t = time.perf_counter()
            try:
                results["parts"][name] = RUNNERS[name](sizes, out, results["parts"])
            except Exception as e:  # noqa: BLE001 - one part's failure must not lose the others
                traceback.print_exc()
                results["parts"][name] = {"error": f"{type(e).__name__}: {e}"}
            except KeyboardInterrupt:
                results["parts"][name] = {"error": "interrupted"}
                raise
            finally:
                part = results["parts"].setdefault(name, {"error": "stopped"})
                part["compile"] = COMPILES[:]  # seconds per train-step program (the grid's are in its rows)
                COMPILES.clear()
                results["part_wall_s"][name] = part["wall_s"] = time.perf_counter() - t
                results["wall_s"] = time.perf_counter() - start
                _write(results, out)
                log(f"{name}: {results['part_wall_s'][name]:.0f} s")
    finally:
        results["machine"]["load_average_end"] = os.getloadavg()
        results["plots"] = plots(results, out)
        table = _write(results, out)
        print(table, flush=True)
        log(f"wrote {out}/bench.json, bench.md and the plots; {time.perf_counter() - start:.0f} s in all")


@contextlib.contextmanager
def _run_cache():
    """A compilation cache for this run only: a program compiled twice (the trainer's step and its
    re-measurement in part b) compiles once, and every compile time reported is a cold one. A
    process that has a cache already (``JAX_COMPILATION_CACHE_DIR``, as the test suite sets) keeps
    it: compile times are then warm on a second run."""
    if jax.config.jax_compilation_cache_dir:
        yield
        return
    path = tempfile.mkdtemp(prefix="bench_jax_cache_")
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
        compilation_cache.reset_cache()
        shutil.rmtree(path, ignore_errors=True)
