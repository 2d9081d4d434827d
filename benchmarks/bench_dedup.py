"""Scale check of near-duplicate detection (motionjax.data.dedup): a synthetic corpus with planted
copies (exact, noised 3 mm, trimmed by 5 frames), and optionally a real BVH corpus.

    python benchmarks/bench_dedup.py [--clips 3000] [--frames 133] [--copies 20] [--bandai DIR]
"""
import argparse
import glob
import resource
import time

import numpy as np

from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import deepmimic_humanoid
from motionjax.data import dedup
from motionjax.data.synthetic import synthetic_clip
from motionjax.formats import read_bvh


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=3000)
    parser.add_argument("--frames", type=int, default=133, help="per synthetic clip (3000 x 133 ~ 400k)")
    parser.add_argument("--copies", type=int, default=20, help="planted copies of each kind")
    parser.add_argument("--bandai", default=None, help="a BVH corpus directory (centimetres) to run on too")
    parser.add_argument("--copy-threshold", type=float, default=dedup.COPY_M,
                        help="m RMS of the moving windows of copies (dedup.COPY_M)")
    args = parser.parse_args(argv)

    def run(name, descs, body):
        t = time.perf_counter()
        hashes = {k: dedup.exact_hash(d, body) for k, d in descs.items()}
        t_hash = time.perf_counter() - t
        t = time.perf_counter()
        report = dedup.find_duplicates(descs, hashes, body=body, copy_m=args.copy_threshold)
        t_find = time.perf_counter() - t
        print(f"{name}: {report.stats['clips']} clips, {report.stats['frames']} frames: "
              f"hashes {t_hash:.1f} s, "
              f"find_duplicates {t_find:.1f} s; {len(report.drop)} dropped, {len(report.groups)} groups; "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; {report.stats}")
        return report

    skeleton = deepmimic_humanoid()
    body = dedup.body_frame(skeleton)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    descs = {}
    for i in range(args.clips):
        root, rots = synthetic_clip(skeleton, i, frames=args.frames)
        descs[f"clip{i:05d}"] = dedup.clip_descriptor(forward_kinematics(skeleton, rots, root)[0], body)
    planted = {}
    for i in range(args.copies):  # exact (float noise), noised 3 mm, trimmed by 5 frames
        src = [f"clip{rng.integers(args.clips):05d}" for _ in range(3)]
        planted[f"exact{i}"] = descs[src[0]] + rng.normal(0, 1e-6, descs[src[0]].shape).astype(np.float32)
        planted[f"noisy{i}"] = descs[src[1]] + rng.normal(0, 3e-3, descs[src[1]].shape).astype(np.float32)
        planted[f"trim{i}"] = descs[src[2]][5:]
    descs.update(planted)
    print(f"synthetic corpus built in {time.perf_counter() - t:.1f} s")
    report = run("synthetic", descs, body)
    found = sum(name in report.drop for name in planted)
    print(f"planted copies dropped: {found}/{len(planted)}")

    if args.bandai:
        descs = {}
        for path in sorted(glob.glob(f"{args.bandai}/*.bvh")):
            motion = read_bvh(path, scale=0.01)
            body = dedup.body_frame(motion.skeleton)
            descs[motion.name] = dedup.clip_descriptor(motion.positions(), body)
        report = run("bandai", descs, body)
        for name, reason in report.drop.items():
            print(f"  drop {name}: {reason}")


if __name__ == "__main__":
    main()
