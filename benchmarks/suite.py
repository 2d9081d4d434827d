"""One command, one table: motionjax optimized vs baseline vs a PyTorch eager peer, MFU, cost growth.

    python scripts/bench.py [--quick] [--out results/bench] [--parts train,dynamics,torch,mfu,growth]

Every number comes from this one run, on the same data and model size, so ratios are meaningful
even on a shared machine:

a. ``train``: end-to-end training frames/s of ``experiments/deepmimic_denoise.py`` (optimized) vs
   ``experiments/baseline.py`` (dense ``jax.jacfwd`` dynamics loss, main-thread numpy loader, fp32,
   no prefetch), both with the model and loss pinned by :func:`_experiment` (the residual
   transformer with the dynamics loss on, not the default experiment's conv denoiser), both through
   :func:`motionjax.train.train_and_evaluate` for the same number of frames, and their held-out
   MPJPE afterwards (mean of 3 seeds; 1 with ``--quick``; and one run of each on the same batches);
b. step-time breakdown of both: data wait (the trainer's own timing), compute split into model and
   loss (fwd + bwd, separately jitted), communication (collectives in the compiled step's HLO);
c. ``dynamics``: the dynamics loss + gradient, blocked vs jvp/vjp vs dense at J = 13, 24, 52, 100 ×
   256 to 65,536 frames per batch, float32 and bfloat16 (:mod:`benchmarks.dynamics_grid`, the one
   implementation; ``--quick``: J = 13, 24 at 256 and 1,024 frames, float32);
d. ``torch``: the PyTorch eager twin (:mod:`benchmarks.torch_peer`: same model, loss with the dense
   ``torch.autograd.functional.jacobian`` or the blocked products, a ``DataLoader`` over the same
   transforms). torch is the optional extra ``bench`` (``pip install 'motionjax[bench]'``); without it
   this part is skipped and says so;
e. ``mfu``: XLA ``cost_analysis()`` FLOPs per step / step time / peak FLOP/s of a large matmul;
f. ``growth``: step time vs window length T and vs joints J (random trees), fitted exponents.

Writes ``bench.json``, ``bench.md`` (the table) and PNG plots to ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import measure
from benchmarks.report import MPJPE_TOLERANCE, TARGETS, machine, markdown, plots
from experiments import baseline, deepmimic_denoise
from motionjax import diagnostics, parallel, train
from motionjax import rotations as rot
from motionjax.data import pipeline
from motionjax.data.info import stand_in
from motionjax.features import encode
from motionjax.skeleton import random_tree

PARTS = ("train", "dynamics", "torch", "mfu", "growth")
SEEDS = (0, 1, 2)  # part a trains each config once per seed (data order, noise, initial weights)


def _experiment(module, steps: int):
    """An experiment config trimmed to ``steps`` steps: one held-out evaluation at the end, no references.

    The model and loss are pinned to the workload these benchmarks (and docs/benchmarks.md) measure:
    the residual transformer with the dynamics loss on (the default experiment now trains a conv
    denoiser without it, #13, which would leave the blocked-vs-dense Jacobian nothing to do)."""
    c = module.get_config()
    c.model.update(name="transformer", dim=128, depth=1, heads=4, mlp_ratio=2, halo=4, stride=2,
                   latent_dim=64, residual=True, highpass=0, stages=1)
    c.loss.dynamics_weight = 0.005
    c.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, references=())
    return c


# ---------------------------------------------------------------------------------------------
# A jitted train step built from the trainer's own pieces (for FLOPs, breakdowns, cost growth)


def compiled_step(config, info):
    """The trainer's step (:func:`motionjax.train.lower_train_step`, compiled ahead of time) with a
    fresh train state and one batch of :func:`_batch`.

    Returns ``(step, state, batch, mesh, (graphdef, loss_fn))`` with ``step(state, batch) -> (state,
    metrics)`` a ``jax.stages.Compiled`` (its ``cost_analysis()`` and HLO text are the step's).
    """
    mesh = parallel.make_mesh(config.mesh)
    lowered, _ = train.lower_train_step(config, info, mesh)
    (graphdef, _, _), _, state, _ = train.init_state(config, info, mesh)
    batch = _batch(config, info, parallel.window_sharding(mesh))
    abstract = train.abstract_batch(config, info, mesh)
    if "offsets" in abstract:  # data.bones = "clip": every window on the body's own bones
        spec = abstract["offsets"]
        offsets = np.broadcast_to(info.skeleton.offsets, spec.shape).astype(np.float32)
        batch["offsets"] = jax.device_put(offsets, spec.sharding)
    return lowered.compile(), state, batch, mesh, (graphdef, train.make_loss_fn(config, info, mesh))


def _batch(config, info, window, seed=0):
    """A batch of real-looking windows: smooth random joint rotations encoded and standardized."""
    b, t, c = config.data.batch_size, config.data.window, config.data.chunk
    rng = np.random.default_rng(seed)
    root, angles = measure.smooth_motion(rng, b, t, info.skeleton.num_joints)
    x = (np.asarray(encode(info.skeleton, root, rot.axis_angle_to_quat(angles))) - info.mean) / info.std
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


def time_step(step, state, batch, repeats: int) -> float:
    """Median seconds per training step."""
    return measure.time_call(stepper(step, state, batch), repeats=repeats, warmup=1)


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
    out["step_s"] = time_step(step, state, batch, repeats)
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
    from motionjax import evaluation
    first = next(iter(configs.values()))
    info = pipeline.dataset_info(first.data)
    mesh = parallel.make_mesh(first.mesh)
    iterator = train.make_iterator(first, info, mesh)
    batches = [{k: b[k] for k in ("noisy", "clean")} for b in (next(iterator) for _ in range(steps))]
    iterator.close()
    held_out = {level: pipeline.make_eval_batches(first.data, info, "validation", level, seed=first.seed)
                for level in (0.0, first.train.eval_noise_level)}
    out = {}
    for name, config in configs.items():
        step, state, shardings, eval_graphdef = train.build_train_step(config, info, mesh)
        for batch in batches:
            state, _ = step(state, batch)
        predict = functools.partial(train.make_predict(eval_graphdef, mesh, shardings), state)
        args = (info.skeleton, float(info.fps), info.mean, info.std, config.loss.contact_speed)
        out[name] = {f"validation/{'clean' if level == 0 else 'noisy'}":
                     evaluation.evaluate(predict, b, *args)["mpjpe"] for level, b in held_out.items()}
    return out


def part_train(quick: bool, out: Path, done: dict) -> dict:
    steps, seeds = (20, SEEDS[:1]) if quick else (100, SEEDS)
    configs = {"optimized": _experiment(deepmimic_denoise, steps), "baseline": _experiment(baseline, steps)}
    for config in configs.values():
        splits = ("validation",) if quick else ("test", "validation")
        config.train.eval_splits = config.train.final_splits = splits
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
    rows = {}
    for name, config in configs.items():
        runs, start = all_runs[name], time.perf_counter()
        info = pipeline.dataset_info(config.data)
        per_seed = [{f"{split}/{cond}": r["results"][split][cond]["model"]["mpjpe"]
                     for split in config.train.eval_splits for cond in ("clean", "noisy")} for r in runs]
        mpjpe = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
        median = lambda key, runs=runs: float(np.median([r[key] for r in runs]))
        breakdown = compute_split(config, info, repeats=3 if quick else 5, split=not quick)
        breakdown["loader_s"] = loader_seconds(config, info, 5 if quick else 10)
        rows[name] = {
            "frames_per_s": median("frames_per_s"), "step_s": 1.0 / median("steps_per_s"),
            "data_wait_fraction": median("data_wait_fraction"), "compile_s": runs[0]["compile_s"],
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
    paired = same_stream(configs, steps)
    mean = {name: float(np.mean(list(m.values()))) for name, m in paired.items()}
    mpjpe_ok = mean["optimized"] <= mean["baseline"] * (1 + MPJPE_TOLERANCE)
    return {"steps": steps, "rows": rows, "speedup": speedup, "same_stream_mpjpe_cm": paired,
            "same_stream_mpjpe_mean_cm": mean, "mpjpe_equal_or_better": bool(mpjpe_ok),
            "met": bool(speedup >= TARGETS["speedup"] and mpjpe_ok)}


# ---------------------------------------------------------------------------------------------
# (c) dynamics loss across J: benchmarks/dynamics_grid.py (also scripts/bench_dynamics.py)


def part_dynamics(quick: bool, out: Path, done: dict) -> dict:
    from benchmarks import dynamics_grid

    results = dynamics_grid.run(quick=quick)
    dynamics_grid.plot(results, out / "dynamics.png")
    return {"results": results, "markdown": dynamics_grid.markdown(results), "met": results["targets"]["met"]}


# ---------------------------------------------------------------------------------------------
# (d) the PyTorch eager peer


def part_torch(quick: bool, out: Path, done: dict) -> dict:
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"torch is not installed ({e}); pip install 'motionjax[bench]' "
                           "(the CPU build: pip install torch==2.13.0)"}
    from flax import nnx

    from benchmarks import torch_peer
    from motionjax import models

    steps = 20 if quick else 100
    config = _experiment(deepmimic_denoise, steps)
    config.model.dtype = "float32"  # torch eager trains in fp32
    info = pipeline.dataset_info(config.data)
    init = nnx.state(models.make_model(config.model, info.feature_dim, config.data.chunk,
                                       nnx.Rngs(config.seed)), nnx.Param)  # motionjax's initial weights

    def run(jacobian, steps, **kwargs):
        c = config.copy_and_resolve_references()
        c.loss.jacobian = jacobian
        return torch_peer.train(c, info, steps, params=init, **kwargs)

    # The peer's best setting on this machine: (torch threads, DataLoader workers). On a busy
    # machine OpenMP threads spin and one thread can beat all cores; a worker overlaps the data.
    settings = sorted({(torch.get_num_threads(), 0), (1, 0), (1, 1)})
    probe = {s: run("blocked", 3, threads=s[0], workers=s[1])["frames_per_s"] for s in settings}
    threads, workers = max(probe, key=probe.get)
    rows, ours = {}, []
    if quick:
        rows["blocked"] = run("blocked", 6, threads=threads, workers=workers)
    else:  # as long as part (a), then held-out MPJPE: the twin learns what motionjax learns
        batches = pipeline.make_eval_batches(config.data, info, "validation", config.train.eval_noise_level,
                                             seed=config.seed)
        rows["blocked"] = run("blocked", steps, threads=threads, workers=workers, eval_batches=batches)
        # End to end, torch and motionjax runs alternate (T M T M): load changes hit both alike.
        torch_fps = [rows["blocked"]["frames_per_s"]]
        mj = _experiment(deepmimic_denoise, steps)
        mj.train.eval_splits = mj.train.final_splits = ("validation",)
        for i in range(2):
            if i:
                torch_fps.append(run("blocked", steps, threads=threads, workers=workers)["frames_per_s"])
            shutil.rmtree(out / "runs" / "next_to_torch", ignore_errors=True)
            ours.append(train.train_and_evaluate(mj, out / "runs" / "next_to_torch")["frames_per_s"])
        rows["blocked"]["frames_per_s_runs"] = torch_fps
        rows["blocked"]["frames_per_s"] = float(np.median(torch_fps))
    rows["dense"] = run("dense", 3 if quick else 4, threads=threads, workers=workers)
    result = {"rows": rows,
              "probe_frames_per_s": {f"{t} threads, {w} workers": v for (t, w), v in probe.items()},
              "compute_alone_ms": {}}
    # Compute alone, one fixed batch, the two frameworks timed round by round so that a change of
    # load on a shared machine hits both alike.
    for jacobian, module in (("blocked", deepmimic_denoise), ("dense", baseline)):
        jax_config = _experiment(module, steps)
        step, state, batch, _, _ = compiled_step(jax_config, info)  # part (b)'s program: cached
        c = config.copy_and_resolve_references()
        c.loss.jacobian = jacobian
        _, torch_step = torch_peer.make_train_step(c, info, init)
        torch_batch = [torch.tensor(np.asarray(batch[k])) for k in ("noisy", "clean")]
        torch_call = functools.partial(torch_step, *torch_batch)
        # torch is synchronous; measure.block waits for the jax step and passes torch's loss through.
        times = measure.interleaved({"motionjax": stepper(step, state, batch), "torch": torch_call},
                                    rounds=3 if quick or jacobian == "dense" else 5)
        result["compute_alone_ms"][jacobian] = {k: 1e3 * v for k, v in times.items()}
    if ours:
        result["motionjax_frames_per_s_runs"] = ours
        result["ratio_optimized_vs_torch_blocked"] = float(np.median(ours)) / rows["blocked"]["frames_per_s"]
    if "rows" in done.get("train", {}):
        part_a = done["train"]["rows"]
        ratio = lambda name, theirs: part_a[name]["frames_per_s"] / theirs["frames_per_s"]
        result.setdefault("ratio_optimized_vs_torch_blocked", ratio("optimized", rows["blocked"]))
        result["ratio_baseline_vs_torch_dense"] = ratio("baseline", rows["dense"])
    if "ratio_optimized_vs_torch_blocked" in result:
        result["met"] = bool(result["ratio_optimized_vs_torch_blocked"] >= TARGETS["torch_ratio"])
    return result


# ---------------------------------------------------------------------------------------------
# (e) MFU and (f) cost growth


def part_mfu(quick: bool, out: Path, done: dict) -> dict:
    """MFU of the optimized and baseline steps (compute only, one fixed batch; the programs of part
    b come from the compilation cache). Steps and the peak matmuls are timed round-robin; the peak
    is the best of fp32 and bf16, so MFU is against what this machine can do in either precision."""
    configs = {"optimized": _experiment(deepmimic_denoise, 1)}
    if not quick:  # the baseline, and the optimized step with the other activation dtype
        configs["baseline"] = _experiment(baseline, 1)
        other = "bfloat16" if configs["optimized"].model.dtype == "float32" else "float32"
        configs[f"optimized, {other}"] = _experiment(deepmimic_denoise, 1)
        configs[f"optimized, {other}"].model.dtype = other
    calls, flops = {}, {}
    for name, config in configs.items():
        step, state, batch, _, _ = compiled_step(config, pipeline.dataset_info(config.data))
        calls[name], flops[name] = stepper(step, state, batch), measure.compiled_flops(step)
    n = 2048 if jax.default_backend() == "cpu" else 8192
    matmul_flops = {}
    for dtype in ("float32", "bfloat16"):
        calls[dtype], matmul_flops[dtype] = measure.matmul(n, jnp.dtype(dtype))
    times = measure.interleaved(calls, rounds=3 if quick else 5)
    peaks = {k: matmul_flops[k] / times[k] for k in matmul_flops}
    peak = max(peaks.values())
    rows = {name: {"flops_per_step": flops[name], "step_s": times[name], "model_dtype": config.model.dtype,
                   "achieved_flops": flops[name] / times[name],
                   "mfu": measure.mfu(flops[name], times[name], peak)} for name, config in configs.items()}
    return {"peak_flops": peaks, "rows": rows, "mfu": rows["optimized"]["mfu"]}


def part_growth(quick: bool, out: Path, done: dict) -> dict:
    """Step time of the optimized step vs T (DeepMimic body) and vs J (random trees), batch 8."""
    base = _experiment(deepmimic_denoise, 1)
    base.data.batch_size = 8
    info = pipeline.dataset_info(base.data)
    calls = {}
    for t in (32, 128) if quick else (32, 64, 128, 256, 512, 1024):
        config = copy.deepcopy(base)
        config.data.window = t
        calls["T", t] = stepper(*compiled_step(config, info)[:3])
    # Control: B·T fixed at 1024 frames. Flat means the cost is per frame, i.e. no T² term.
    for t in () if quick else (32, 128, 512):
        config = copy.deepcopy(base)
        config.data.update(window=t, batch_size=1024 // t)
        calls["BT", t] = stepper(*compiled_step(config, info)[:3])
    for j in () if quick else (15, 30, 60, 120):  # --quick: T only (the target), to fit in 2 min
        tree = stand_in(random_tree(j, seed=0), float(info.fps))
        calls["J", j] = stepper(*compiled_step(base, tree)[:3])
    times = measure.interleaved(calls, rounds=3 if quick else 5)
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (<= 2 min on 2 cores)")
    parser.add_argument("--out", default="results/bench", help="results folder")
    parser.add_argument("--parts", default=None, help=f"comma-separated subset of {PARTS} (default: all; "
                        "with --quick all but dynamics, whose 12 compiles alone take ~3 min)")
    args = parser.parse_args(argv)
    default = [p for p in PARTS if not (args.quick and p == "dynamics")]
    parts = args.parts.split(",") if args.parts else default
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}; expected a subset of {PARTS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # A compilation cache for this run only: a program compiled twice (the trainer's step and its
    # re-measurement in part b) compiles once, and every compile time reported is a cold one.
    cache = tempfile.mkdtemp(prefix="bench_jax_cache_")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    parallel.retain_host_memory()  # as the trainer does: every part, torch's too, gets the same allocator
    start = time.perf_counter()
    results = {"quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
               "parts": {}}
    runners = {"train": part_train, "dynamics": part_dynamics, "torch": part_torch, "mfu": part_mfu,
               "growth": part_growth}
    for name in sorted(parts, key=PARTS.index):  # torch and mfu reuse the train part's numbers
        t = time.perf_counter()
        results["parts"][name] = runners[name](args.quick, out, results["parts"])
        results["parts"][name]["wall_s"] = time.perf_counter() - t
        print(f"[bench] {name}: {time.perf_counter() - t:.0f} s", flush=True)
        results["wall_s"] = time.perf_counter() - start
        (out / "bench.json").write_text(json.dumps(results, indent=2, default=str))  # after every part
    shutil.rmtree(cache, ignore_errors=True)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["plots"] = plots(results, out)
    table = markdown(results)
    (out / "bench.md").write_text(table)
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    print(table)
    return results


if __name__ == "__main__":
    main()
