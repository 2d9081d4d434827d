"""Input pipeline throughput: Grain loader (0/1/2 workers, with/without prefetch) vs the naive loader.

    python benchmarks/bench_data.py [--quick] [--out results/bench_data.json] [--data-dir DIR]

Rows: per-window costs (record read + window draw; the noise draw and transforms batched as the
Grain pipeline runs them and one window at a time as the naive loader does), then loader frames/s
measured after warm-up batches (until every worker delivered: start-up excluded), the median of
``--rounds`` interleaved rounds. All numbers come from one run on a shared machine: compare them as ratios.
``--data-dir`` points at any prepared directory, e.g. the synthetic shards of
``prepare_data.py --synthetic 128000``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiments.base import get_config
from motionjax.data import load_info, pipeline, transforms


def _per_window_costs(cfg, info, n: int) -> dict:
    sample = pipeline.SampleWindow(pipeline.ClipSource(info), info, cfg)
    make = pipeline.MakeExample(info, cfg, transforms.Noise.from_config(cfg))
    slots = pipeline.train_slots(info, cfg.window, cfg.dynamics_sampling)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    windows = [sample(slots[i % len(slots)], rng) for i in range(n)]
    sample_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for w in windows:
        make(w, rng)
    single_us = (time.perf_counter() - t) / n * 1e6
    b = cfg.batch_size
    batches = [{k: np.stack([w[k] for w in windows[i:i + b]]) for k in windows[0]}
               for i in range(0, n - b + 1, b)]
    t = time.perf_counter()
    for batch in batches:
        make(batch, rng)
    batched_us = (time.perf_counter() - t) / (len(batches) * b) * 1e6
    return {"read_and_draw_us": sample_us, "transform_single_us": single_us,
            "transform_batched_us": batched_us}


def _throughput(make_iter, cfg, batches: int, warmup: int) -> float:
    it = make_iter()
    try:
        for _ in range(warmup):  # every worker must have started (each imports jax) and delivered
            next(it)
        t = time.perf_counter()
        for _ in range(batches):
            next(it)
        dt = time.perf_counter() - t
    finally:
        if hasattr(it, "close"):
            it.close()
    return batches * cfg.batch_size * cfg.window / dt


def run(quick: bool = False, data_dir: str | None = None, out: str | None = None, rounds: int = 3) -> dict:
    cfg = get_config().data
    if data_dir:
        cfg.dir = data_dir
    info = load_info(cfg.dir) if data_dir else pipeline.dataset_info(cfg)
    n_batches = 5 if quick else 30
    costs = _per_window_costs(cfg, info, 64 if quick else 512)

    def grain_iter(workers, prefetch):
        c = cfg.copy_and_resolve_references()
        c.worker_count, c.prefetch = workers, prefetch
        return (lambda: pipeline.make_train_iterator(c, info, seed=0)), 2 * workers * c.worker_buffer + 1

    naive_iter = lambda: pipeline.make_naive_train_iterator(cfg, info, seed=0)
    loaders = {"naive (numpy, main thread)": (naive_iter, 1),
               "grain, 0 workers, no prefetch": grain_iter(0, 0),
               "grain, 0 workers, prefetch 2": grain_iter(0, 2),
               "grain, 1 worker, prefetch 2": grain_iter(1, 2),
               "grain, 2 workers, prefetch 2": grain_iter(2, 2)}
    samples = {name: [] for name in loaders}
    for _ in range(1 if quick else rounds):  # interleaved, so load from other jobs hits every row alike
        for name, (make, warmup) in loaders.items():
            samples[name].append(_throughput(make, cfg, n_batches, warmup))
    rates = {name: float(np.median(s)) for name, s in samples.items()}
    naive = rates["naive (numpy, main thread)"]

    print(f"data: {cfg.dir}  batch {cfg.batch_size} x window {cfg.window} frames, "
          f"feature dim {info.feature_dim}")
    print(f"{'per-window cost':<40}{'us':>10}")
    for k, v in costs.items():
        print(f"  {k:<38}{v:>10.1f}")
    print(f"{'loader':<40}{'frames/s':>12}{'vs naive':>10}")
    for name, r in rates.items():
        print(f"  {name:<38}{r:>12,.0f}{r / naive:>9.1f}x")
    result = {"batch_size": cfg.batch_size, "window": cfg.window, "data_dir": cfg.dir, "quick": quick,
              "per_window_us": costs, "frames_per_s": rates, "frames_per_s_rounds": samples}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few batches (a smoke run)")
    p.add_argument("--data-dir", default=None, help="a prepared directory (default: config.data.dir)")
    p.add_argument("--out", default="results/bench_data.json", help="JSON output path")
    p.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds (median)")
    args = p.parse_args()
    run(args.quick, args.data_dir, args.out, args.rounds)


if __name__ == "__main__":
    main()
