"""Load the DeepMimic clips, run forward kinematics, print a summary and plot poses and root paths.

    python benchmarks/fk_demo.py [--out runs/fk_demo]          # summary table + fk_demo.png
    python benchmarks/fk_demo.py --bench [--batch 4096]         # FK throughput table (J=24 and 100)

The benchmark writes ``fk_bench.json`` next to the plot.
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from motionjax.core import rotations as rot  # noqa: E402
from motionjax.core.kinematics import forward_kinematics  # noqa: E402
from motionjax.core.skeleton import random_tree, smpl_like  # noqa: E402
from motionjax.formats import Motion, deepmimic_clip_paths, load  # noqa: E402


def summarize(motion: Motion, positions: np.ndarray) -> dict:
    """Per-clip numbers from world positions ``[T, J, 3]``."""
    up = positions[..., motion.skeleton.up_axis]
    speed = np.linalg.norm(np.diff(positions, axis=0), axis=-1) * motion.fps  # [T-1, J] m/s
    return {"clip": motion.name, "frames": motion.num_frames, "fps": motion.fps,
            "duration_s": motion.num_frames / motion.fps, "height_min_m": float(up.min()),
            "height_max_m": float(up.max()), "max_joint_speed_m_s": float(speed.max())}


def print_table(rows: list[dict]):
    print(f"{'clip':<28}{'frames':>7}{'fps':>6}{'dur s':>7}{'height m':>15}{'max speed m/s':>15}")
    for r in rows:
        print(f"{r['clip']:<28}{r['frames']:>7}{r['fps']:>6.0f}{r['duration_s']:>7.2f}"
              f"{r['height_min_m']:>7.2f}..{r['height_max_m']:<6.2f}{r['max_joint_speed_m_s']:>15.2f}")


def plot(motions: list[Motion], positions: list[np.ndarray], path: Path, pose_clip: str = "humanoid3d_walk"):
    """Left: six poses of one clip seen from the side. Right: root paths of all clips from above."""
    fig, (ax_pose, ax_root) = plt.subplots(1, 2, figsize=(13, 5))
    k = next((i for i, m in enumerate(motions) if m.name == pose_clip), 0)
    sk, pos = motions[k].skeleton, positions[k]
    for t in np.linspace(0, len(pos) - 1, 6).astype(int):
        for j, parent in enumerate(sk.parents):
            if parent >= 0:
                ax_pose.plot(pos[t, [parent, j], 0], pos[t, [parent, j], 1], "-o", ms=2,
                             color=plt.cm.viridis(t / len(pos)))
    ax_pose.set(title=f"{motions[k].name}: 6 poses (side view)", xlabel="x (m)", ylabel="y, up (m)",
                aspect="equal")
    ax_root.set_prop_cycle(color=plt.cm.tab20.colors)  # 15 clips: distinct colours
    for m, p in zip(motions, positions, strict=True):
        ax_root.plot(p[:, 0, 0], p[:, 0, 2], label=m.name.removeprefix("humanoid3d_"))
    ax_root.set(title="root trajectories (top view)", xlabel="x (m)", ylabel="z (m)", aspect="equal")
    ax_root.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def per_joint_fk(skeleton, rotations, root_position):
    """Baseline for the benchmark only: the textbook loop, one traced op chain per joint."""
    world_rot, world_pos = [rotations[..., 0, :]], [root_position]
    for j in range(1, skeleton.num_joints):
        parent = skeleton.parents[j]
        world_pos.append(world_pos[parent] + rot.quat_rotate(world_rot[parent], skeleton.offsets[j]))
        world_rot.append(rot.quat_mul(world_rot[parent], rotations[..., j, :]))
    return jnp.stack(world_pos, axis=-2), jnp.stack(world_rot, axis=-2)


def _time(fn, *args, repeats: int) -> tuple[float, float, float]:
    """(first call incl. compile, median, fastest later call) in seconds."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)), min(times)


def bench(batch: int, repeats: int = 20) -> list[dict]:
    """Frames/s of FK, ``batch`` frames per call; the first row (J=24, jit float32) is the headline.

    Compares the level-batched FK with a per-joint loop (same maths, one op chain per joint) and
    with FK's numpy float64 path (what the data workers run), all measured in this one run.
    """
    rng = np.random.default_rng(0)
    rows = []
    for sk in (smpl_like(), random_tree(100, seed=0)):
        q = rng.normal(size=(batch, sk.num_joints, 4))
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        root = rng.normal(size=(batch, 3))
        q32, root32 = jnp.asarray(q, jnp.float32), jnp.asarray(root, jnp.float32)
        variants = {
            "levels, jit f32": (jax.jit(functools.partial(forward_kinematics, sk)), q32, root32),
            "per-joint loop, jit f32": (jax.jit(functools.partial(per_joint_fk, sk)), q32, root32),
            "levels, numpy f64": (functools.partial(forward_kinematics, sk), q, root),
        }
        for name, (fn, *args) in variants.items():
            first, median, best = _time(fn, *args, repeats=repeats)
            rows.append({"fk": name, "joints": sk.num_joints, "levels": len(sk.levels), "batch_frames": batch,
                         "backend": jax.default_backend(), "first_call_s": first, "median_call_s": median,
                         "best_call_s": best, "frames_per_s": batch / median,
                         "frames_per_s_best": batch / best})
    return rows


def print_bench(rows: list[dict]):
    base = {(r["joints"]): r["frames_per_s"] for r in rows if r["fk"] == "levels, jit f32"}
    print(f"{'fk':<26}{'J':>4}{'levels':>7}{'batch':>7}{'first call s':>14}{'ms/call':>9}{'frames/s':>13}"
          f"{'best frames/s':>15}{'vs levels':>11}")
    for r in rows:
        print(f"{r['fk']:<26}{r['joints']:>4}{r['levels']:>7}{r['batch_frames']:>7}{r['first_call_s']:>14.2f}"
              f"{r['median_call_s'] * 1e3:>9.2f}{r['frames_per_s']:>13,.0f}{r['frames_per_s_best']:>15,.0f}"
              f"{r['frames_per_s'] / base[r['joints']]:>10.2f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/fk_demo"), help="output directory")
    parser.add_argument("--bench", action="store_true", help="measure FK throughput instead")
    parser.add_argument("--batch", type=int, default=4096, help="frames per FK call in --bench")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.bench:
        rows = bench(args.batch)
        print_bench(rows)
        (args.out / "fk_bench.json").write_text(json.dumps(rows, indent=2))
        return

    motions = [load(path) for path in deepmimic_clip_paths()]
    positions = [m.positions() for m in motions]  # numpy in → FK's float64 numpy path
    rows = [summarize(m, p) for m, p in zip(motions, positions, strict=True)]
    print_table(rows)
    plot(motions, positions, args.out / "fk_demo.png")
    (args.out / "fk_summary.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out / 'fk_demo.png'} and {args.out / 'fk_summary.json'}")


if __name__ == "__main__":
    main()
