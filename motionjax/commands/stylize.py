"""``motionjax stylize``: a motion file rendered in another style by a trained generator.

``motionjax stylize --workdir runs/generate --style elderly walk.bvh [more.bvh ...] [--content walk]
[--strength 0.65] [--seed 0] [--out stylized/]``: each file's windows are noised to flow time
``1 - strength`` in the generator's latent and denoised toward the style
(:func:`motionjax.generation.sampling.stylize_files`), blended back into a clip of the file's length and
written with the file's own hierarchy, units and frame rate.
"""

from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="motionjax stylize", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="motion files (BVH) on the run's skeleton")
    p.add_argument("--workdir", required=True, help="a finished run of experiments/generate.py")
    p.add_argument("--style", required=True, help="the target style label, e.g. elderly")
    p.add_argument("--content", default=None,
                   help="the content label kept (default: each window's, as the run's evaluator sees it)")
    # edit.STYLE_STRENGTH, written out so that --help imports no jax (a test keeps the two equal)
    p.add_argument("--strength", type=float, default=0.65,
                   help="how much is made anew, 0..1 (flow time noised away; more: more style, less source)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--guidance", default=None,
                   help="label guidance scales 'CONTENT,STYLE' (default: the run's)")
    p.add_argument("--out", default="stylized", help="output folder")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from motionjax.generation import sampling

    if not 0.0 < args.strength <= 1.0:
        print(f"error: --strength {args.strength}: expected a value in (0, 1]", file=sys.stderr)
        return 2
    guidance = tuple(float(v) for v in args.guidance.split(",")) if args.guidance else None
    try:
        _, errors = sampling.stylize_files(args.workdir, args.files, args.style, args.out,
                                           content=args.content, strength=args.strength, seed=args.seed,
                                           guidance=guidance)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
