"""``motionjax sample``: motion of given labels from a trained generator, as BVH files and a video.

``motionjax sample --workdir runs/generate --content walk --style elderly [--count 4] [--seed 0]
[--length FRAMES] [--guidance 1,1] [--physics 0.5] [--out samples/] [--no-video]``: a finished run of
``experiments/generate.py`` (nothing is trained), ``--count`` samples written in the corpus's units and
hierarchy (:func:`motionjax.generation.sampling.sample_files`).
"""

from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="motionjax sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a finished run of experiments/generate.py")
    p.add_argument("--content", required=True, help="the content label, e.g. walk")
    p.add_argument("--style", required=True, help="the style label, e.g. elderly")
    p.add_argument("--count", type=int, default=4, help="samples to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length", type=int, default=None,
                   help="frames (default the run's window; longer: continued window after window)")
    p.add_argument("--guidance", default=None,
                   help="label guidance scales 'CONTENT,STYLE' (default: the run's choice on validation)")
    p.add_argument("--physics", type=float, default=None,
                   help="physics guidance scale (default: the run's; 0 = off)")
    p.add_argument("--out", default="samples", help="folder the BVH files and samples.mp4 go to")
    p.add_argument("--no-video", action="store_true", help="BVH files only")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from motionjax.generation import sampling

    guidance = tuple(float(v) for v in args.guidance.split(",")) if args.guidance else None
    try:
        sampling.sample_files(args.workdir, {"content": args.content, "style": args.style}, args.out,
                              count=args.count, seed=args.seed, length=args.length, guidance=guidance,
                              physics=args.physics, video=not args.no_video)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
