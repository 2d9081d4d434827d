"""Convert motion files into ArrayRecord shards + index.json + feature stats (motionjax.data.prepare).

    motionjax prepare                         # DeepMimic clips -> data_cache/deepmimic_clean
    motionjax prepare --source '../shared/data/bandai-namco-1/data/*.bvh' \\
        --out data_cache/bandai1 \\
        --split train=rest --split validation=stratified:content:0.1 --split test=stratified:content:0.1
    motionjax prepare --config experiments/autoencoder.py  # a config's data settings
    motionjax prepare --synthetic 128000 --out data_cache/synthetic   # I/O benchmarks

Units are detected from the bone lengths (``--units`` overrides), a placeholder root joint is
folded, label sidecars (``clip.json``) are read, duplicates are dropped. Re-running with the same
inputs does nothing (the index records the settings and the sources); changed sources rebuild, and
the old directory stays until the new one is complete; other settings on a complete directory are
refused (``--force`` rebuilds). Bad files are skipped and listed (``--strict`` aborts instead).
"""
from __future__ import annotations

import argparse
import logging
import sys

from motionjax import configs
from motionjax.data import corpus, prepare, synthetic


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="take source, dir and every preparation setting from this experiment "
                                    "config (path.py[:variant]); the flags below override it")
    p.add_argument("--source", default=None,
                   help="directory or glob of .bvh/.txt files (default: pybullet's DeepMimic clips)")
    p.add_argument("--out", default=None, help="output directory (default: data_cache/deepmimic_clean)")
    p.add_argument("--fps", type=float, default=None, help="every clip is resampled to this rate (30)")
    p.add_argument("--window", type=int, default=None, help="window length of the feature statistics (32)")
    p.add_argument("--units", choices=["auto", *corpus.UNITS], default=None,
                   help="length unit of the files (default auto: detected from the bone lengths)")
    p.add_argument("--up-axis", choices=["auto", *corpus.AXES], default=None, help="vertical axis (auto)")
    p.add_argument("--split", action="append", metavar="NAME=RULE",
                   help="a split rule (repeat; see motionjax.data.corpus): train=rest, validation=tail:0.2, "
                        "test=clips:a,b, test=stratified:content:0.1, ... (default: DeepMimic's)")
    p.add_argument("--no-dedup", action="store_true", help="keep duplicate clips")
    p.add_argument("--dedup-policy", choices=["copies", "prune"], default=None,
                   help="drop copies of a take only (default), or also similar takes (redundancy pruning)")
    p.add_argument("--clean", choices=["off", "report", "repair"], default=None,
                   help="corrupted frames (motionjax.data.clean): repair short defects and cut long ones "
                        "(default), only report them, or skip the detectors")
    p.add_argument("--workers", type=int, default=None, help="conversion processes (default: CPU count)")
    p.add_argument("--strict", action="store_true", help="abort on the first bad file")
    p.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")
    p.add_argument("--records-per-shard", type=int, default=4096)
    p.add_argument("--synthetic", type=int, default=0, metavar="N", help="write N synthetic clips instead")
    p.add_argument("--synthetic-frames", type=int, default=240)
    p.add_argument("--seed", type=int, default=0, help="synthetic corpus seed")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")

    settings, source, out = prepare.Settings(), None, "data_cache/deepmimic_clean"
    if args.config:
        try:
            data = configs.load(args.config).data
        except FileNotFoundError as e:
            raise SystemExit(f"error: --config: {e}") from None
        settings, source, out = prepare.Settings.from_config(data), data.source, data.dir
    changes = {k: v for k, v in (("fps", args.fps), ("window", args.window), ("units", args.units),
                                 ("up_axis", args.up_axis)) if v is not None}
    if args.split:
        rules = dict(s.split("=", 1) for s in args.split if "=" in s)
        if len(rules) != len(args.split):
            p.error("--split takes NAME=RULE, e.g. --split validation=tail:0.2")
        changes["splits"] = tuple(rules.items())
    if args.no_dedup:
        changes["dedup"] = False
    if args.clean:
        changes["clean"] = args.clean
    if args.dedup_policy:
        changes["dedup_policy"] = args.dedup_policy
    settings = prepare.Settings(**{**settings.__dict__, **changes})
    source, out = args.source or source, args.out or out
    try:
        if args.synthetic:
            motions = synthetic.synthetic_motions(args.synthetic, frames=args.synthetic_frames,
                                                  fps=settings.fps,
                                                  seed=args.seed)
            info = prepare.write_dataset(motions, out, settings=settings, strict=args.strict,
                                         records_per_shard=args.records_per_shard, total=args.synthetic)
        else:
            info = prepare.prepare(source, out, settings=settings, strict=args.strict, workers=args.workers,
                                   records_per_shard=args.records_per_shard, force=args.force)
    except (prepare.PreparedElsewhere, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # a failed write: a full disk, a lost mount
        print(f"error: {e.strerror}: {e.filename}", file=sys.stderr)
        raise SystemExit(1) from None
    kept = prepare.kept_clips(info)
    dropped = len(info.names) - len(kept)
    print(f"{info.data_dir}: {len(kept)} clips kept" + (f" ({dropped} more converted but not kept, below)"
                                                         if dropped else "")
          + f", {sum(info.frames[c] for c in kept)} frames at {info.fps:g} fps, {len(info.shards)} shard(s), "
          f"skeleton {info.skeleton}, feature dim {info.feature_dim}")
    print(prepare.summary_table(info))
    for s in info.skipped:
        print(f"  not kept {s['path']}: {s['reason']}")


if __name__ == "__main__":
    main()
