"""Joint-dynamics loss + gradient: blocked Jacobian vs jax.jvp/vjp of FK vs dense jax.jacfwd.

For each skeleton size the three backends of :func:`motionjax.dynamics.dynamics_loss` are jitted,
their compiled temp memory read from ``compiled.memory_analysis()``, and the loss + gradient
(w.r.t. predicted root and rotations) timed as the median of interleaved rounds, so the ratios
within one run are comparable on a shared machine. Prints a table and writes JSON.

    .venv/bin/python scripts/bench_dynamics.py [--quick] [--out results/bench_dynamics.json]

``run(quick)`` is importable by the combined benchmark.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from motionjax import dynamics, rotations
from motionjax.skeleton import deepmimic_humanoid, random_tree, smpl_like

WEIGHTS = {"velocity": 1.0, "force": 1e-3, "jerk": 1e-7}
FPS = 30.0


def skeletons():
    """(label, skeleton): J = 13 is the DeepMimic humanoid (15 joints, 12 that rotate)."""
    return [("13 (deepmimic, 15 joints)", deepmimic_humanoid()), ("24 (smpl_like)", smpl_like()),
            ("52 (random_tree)", random_tree(52, seed=0)), ("100 (random_tree)", random_tree(100, seed=0))]


def _motion(skeleton, batch, frames, seed):
    """A smooth random motion ``(root [B, T, 3], rotations [B, T, J, 4])`` plus a noisy copy."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 2 * np.pi, frames)[None, :, None, None]
    phase, amp = rng.uniform(0, 6, (batch, 1, skeleton.num_joints, 3)), rng.uniform(0, 0.6, (batch, 1, 1, 3))
    target = rotations.axis_angle_to_quat(jnp.asarray(amp * np.sin(t + phase), jnp.float32))
    root = jnp.asarray(np.cumsum(rng.normal(0, 0.01, (batch, frames, 3)), axis=1), jnp.float32)
    noisy = rotations.quat_normalize(target + 0.02 * jnp.asarray(rng.normal(size=target.shape), jnp.float32))
    return root, target, root + 0.005, noisy


def _loss_and_grad(skeleton, jacobian):
    def loss(pred_root, pred_rot, target_root, target_rot):
        return dynamics.dynamics_loss(skeleton, pred_root, pred_rot, target_root, target_rot, FPS, WEIGHTS,
                                      jacobian=jacobian)[0]
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def run(quick: bool = False, rounds: int | None = None, max_temp_mb: float = 6000) -> dict:
    """Time loss + gradient per backend and skeleton; returns the JSON-able results.

    A backend whose compiled temp memory exceeds ``max_temp_mb`` is compiled but not run (its time
    is reported as None).
    """
    batch, frames = (8, 32) if quick else (64, 120)
    rounds = rounds or (3 if quick else 5)
    rows = []
    for label, skeleton in skeletons():
        args = _motion(skeleton, batch, frames, seed=0)
        target_root, target_rot, pred_root, pred_rot = args
        call_args = (pred_root, pred_rot, target_root, target_rot)
        row = {"J": label, "joints": skeleton.num_joints, "depth": len(skeleton.levels),
               "dof": skeleton.num_dof}
        fns = {}
        for jacobian in dynamics.JACOBIANS:
            start = time.perf_counter()
            compiled = _loss_and_grad(skeleton, jacobian).lower(*call_args).compile()
            memory = compiled.memory_analysis()
            row[f"{jacobian}_temp_mb"] = memory.temp_size_in_bytes / 2**20 if memory is not None else None
            if (row[f"{jacobian}_temp_mb"] or 0) > max_temp_mb:  # the dense J of 7680 frames at J = 100
                row[f"{jacobian}_ms"] = None
                continue
            jax.block_until_ready(compiled(*call_args))
            row[f"{jacobian}_compile_s"] = time.perf_counter() - start
            fns[jacobian] = compiled
        times = {name: [] for name in fns}
        for _ in range(rounds):  # interleaved, so load changes hit every backend alike
            for name, fn in fns.items():
                start = time.perf_counter()
                jax.block_until_ready(fn(*call_args))
                times[name].append(time.perf_counter() - start)
        for name in fns:
            row[f"{name}_ms"] = 1e3 * float(np.median(times[name]))
        for name in ("dense", "jvp"):
            row[f"{name}_over_blocked"] = row[f"{name}_ms"] / row["blocked_ms"] if row[f"{name}_ms"] else None
        rows.append(row)
        print(_format_row(row), flush=True)
    return {"batch": batch, "frames": frames, "rounds": rounds, "backend": jax.default_backend(),
            "devices": jax.device_count(), "rows": rows}


HEADER = (f"{'J':>26} {'depth':>5} {'dof':>4} | {'blocked ms':>10} {'jvp ms':>9} {'dense ms':>10} | "
          f"{'dense/blk':>9} {'jvp/blk':>7} | {'temp MB blk/jvp/dense':>23}")


def _format_row(row):
    temps = "/".join(f"{row[f'{n}_temp_mb']:.0f}" if row[f"{n}_temp_mb"] is not None else "?"
                     for n in dynamics.JACOBIANS)
    num = lambda x, spec: "skipped" if x is None else format(x, spec)
    return (f"{row['J']:>26} {row['depth']:>5} {row['dof']:>4} | {row['blocked_ms']:>10.1f} "
            f"{num(row['jvp_ms'], '9.1f'):>9} {num(row['dense_ms'], '10.1f'):>10} | "
            f"{num(row['dense_over_blocked'], '8.1f'):>8}x {num(row['jvp_over_blocked'], '6.2f'):>6}x | "
            f"{temps:>23}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8x32 frames, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3 quick, 5 full)")
    parser.add_argument("--out", default="results/bench_dynamics.json")
    args = parser.parse_args()
    print(f"dynamics loss + grad, {'8x32' if args.quick else '64x120'} frames, {jax.default_backend()}")
    print(HEADER, flush=True)
    results = run(args.quick, args.rounds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
