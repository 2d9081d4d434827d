"""Convert motion files into ArrayRecord shards + index.json + feature stats (motionjax.data.prepare).

    python scripts/prepare_data.py                                  # DeepMimic clips -> data_cache/deepmimic
    python scripts/prepare_data.py --source 'mocap/**/*.bvh' --out data_cache/mocap --strict
    python scripts/prepare_data.py --synthetic 128000 --out data_cache/synthetic   # I/O benchmarks

Re-running with the same inputs does nothing (the index records a fingerprint); ``--force``
rewrites. Bad files are skipped and listed (``--strict`` aborts on the first one).
"""
from __future__ import annotations

import argparse
import logging

from motionjax.data import prepare, synthetic


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=None,
                   help="directory or glob of .bvh/.txt/.json files (default: pybullet's DeepMimic clips)")
    p.add_argument("--out", default="data_cache/deepmimic", help="output directory")
    p.add_argument("--fps", type=float, default=30.0, help="every clip is resampled to this rate")
    p.add_argument("--window", type=int, default=32, help="window length of the feature statistics")
    p.add_argument("--strict", action="store_true", help="abort on the first bad file")
    p.add_argument("--force", action="store_true", help="rewrite even if the index is up to date")
    p.add_argument("--records-per-shard", type=int, default=4096)
    p.add_argument("--synthetic", type=int, default=0, metavar="N", help="write N synthetic clips instead")
    p.add_argument("--synthetic-frames", type=int, default=240)
    p.add_argument("--seed", type=int, default=0, help="synthetic corpus seed")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    if args.synthetic:
        motions = synthetic.synthetic_motions(args.synthetic, frames=args.synthetic_frames, fps=args.fps,
                                              seed=args.seed)
        info = prepare.write_dataset(motions, args.out, fps=args.fps, window=args.window, strict=args.strict,
                                     records_per_shard=args.records_per_shard, total=args.synthetic)
    else:
        info = prepare.prepare(args.source, args.out, fps=args.fps, window=args.window, strict=args.strict,
                               records_per_shard=args.records_per_shard, force=args.force)
    print(f"{info.data_dir}: {len(info.names)} clips, {sum(info.frames)} frames at {info.fps:g} fps, "
          f"{len(info.shards)} shard(s), feature dim {info.feature_dim}")
    for split in prepare.SPLITS:
        print(f"  {split:<14} {len(info.splits[split]):>6} segments {info.split_frames(split):>9} frames")
    for s in info.skipped:
        print(f"  skipped {s['path']}: {s['reason']}")


if __name__ == "__main__":
    main()
