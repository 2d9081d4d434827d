"""Load the DeepMimic clips, run forward kinematics, print a summary and plot poses and root paths.

    python scripts/fk_demo.py [--out runs/fk_demo]          # summary table + fk_demo.png
    python scripts/fk_demo.py --bench [--batch 4096]         # FK throughput, J=24, jit float32

The benchmark writes ``fk_bench.json`` next to the plot.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from motionjax.formats import Motion, deepmimic_clip_paths, load  # noqa: E402
from motionjax.kinematics import forward_kinematics  # noqa: E402
from motionjax.skeleton import smpl_like  # noqa: E402


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


def bench(batch: int, repeats: int = 20) -> dict:
    """Frames/s of jitted float32 FK on the 24-joint SMPL-like body, ``batch`` frames per call."""
    sk = smpl_like()
    rng = np.random.default_rng(0)
    q = rng.normal(size=(batch, sk.num_joints, 4))
    q = jnp.asarray(q / np.linalg.norm(q, axis=-1, keepdims=True), jnp.float32)
    root = jnp.asarray(rng.normal(size=(batch, 3)), jnp.float32)
    fk = jax.jit(forward_kinematics, static_argnums=0)
    start = time.perf_counter()
    jax.block_until_ready(fk(sk, q, root))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fk(sk, q, root))
        times.append(time.perf_counter() - start)
    best, median = min(times), float(np.median(times))
    return {"joints": sk.num_joints, "levels": len(sk.levels), "batch_frames": batch, "dtype": "float32",
            "backend": jax.default_backend(), "compile_s": compile_s, "median_call_s": median,
            "frames_per_s_median": batch / median, "frames_per_s_best": batch / best}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/fk_demo"), help="output directory")
    parser.add_argument("--bench", action="store_true", help="measure FK throughput instead")
    parser.add_argument("--batch", type=int, default=4096, help="frames per FK call in --bench")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.bench:
        result = bench(args.batch)
        print(f"FK J={result['joints']} ({result['levels']} levels), batch {result['batch_frames']}, "
              f"{result['dtype']}, {result['backend']}: {result['frames_per_s_median']:,.0f} frames/s median "
              f"({result['frames_per_s_best']:,.0f} best; {result['median_call_s'] * 1e3:.2f} ms/call, "
              f"compile {result['compile_s']:.2f} s)")
        (args.out / "fk_bench.json").write_text(json.dumps(result, indent=2))
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
