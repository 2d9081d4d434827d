"""Forward+backward step time of the motion models: {transformer, tconv} x {float32, bfloat16} compute.

    .venv/bin/python benchmarks/bench_models.py [--batch 32 --window 64 --out results/bench_models.json]

Model sizes come from ``experiments/base.py`` (the ``model`` section); the feature size is the
DeepMimic humanoid's. Prints a table (ms/step, frames/s, ratio to the fp32 transformer) and writes it
as JSON. Times are medians of jitted steps after compilation, taken round-robin over the four
variants so that load from other processes hits all alike: compare ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from benchmarks import measure
from motionjax.configs.base import get_config
from motionjax.core.features import feature_dim
from motionjax.core.skeleton import deepmimic_humanoid
from motionjax.models import make_model


def make_step(config, batch, window, chunk):
    """A jitted adamw step on an MSE reconstruction loss, as ``run() -> loss``, and the parameter count."""
    features = feature_dim(deepmimic_humanoid())
    model = make_model(config, features, chunk, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(0), (batch, window // chunk, chunk, features))

    @nnx.jit
    def step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    step(model, optimizer, x).block_until_ready()  # compile
    params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return lambda: step(model, optimizer, x).block_until_ready(), int(params)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="results/bench_models.json")
    args = parser.parse_args()
    base = get_config()
    rows, runs = [], []
    for name in ("transformer", "tconv"):
        for dtype in ("float32", "bfloat16"):
            config = base.model.copy_and_resolve_references()
            config.update(name=name, dtype=dtype)
            run, params = make_step(config, args.batch, args.window, base.data.chunk)
            rows.append(dict(model=name, dtype=dtype, params=params))
            runs.append(run)
    # Round-robin (load changes on a shared machine hit all four alike), one call per round.
    times = measure.interleaved(dict(enumerate(runs)), rounds=args.repeats, repeats=1)
    for row, seconds in zip(rows, times.values(), strict=True):
        row.update(ms=1e3 * seconds, frames_per_s=args.batch * args.window / seconds)
    ref = rows[0]["ms"]
    print(f"{jax.devices()[0].device_kind}, B={args.batch}, T={args.window}, C={base.data.chunk}")
    print(f"{'model':12} {'dtype':9} {'params':>8} {'ms/step':>8} {'frames/s':>9} {'ratio':>6}")
    for r in rows:
        r["ratio"] = r["ms"] / ref
        print(f"{r['model']:12} {r['dtype']:9} {r['params']:8d} {r['ms']:8.1f} {r['frames_per_s']:9.0f} "
              f"{r['ratio']:6.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(device=jax.devices()[0].device_kind, batch=args.batch, window=args.window,
                       model=base.model.to_dict(), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
