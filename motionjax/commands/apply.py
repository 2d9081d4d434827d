"""Apply a trained run to motion files of any length: denoise a capture, or encode and decode it.

    motionjax apply --workdir RUN INPUT.bvh|DIR [...] --out DIR [--step best] [--overlap FRAMES]
    (or python -m motionjax apply, the same)

Each file is read in the run's units, frame rate and joint order (the same tree in any order), cut
into the run's windows overlapping by ``--overlap`` frames (default a quarter window), run through the
model in batches (one progress bar) and blended back without seams, then written to
``--out/<name>.bvh`` with the input's own hierarchy, channel order and frame rate. A file that does
not read or whose skeleton is not the run's is named with the reason and skipped; the others are
still processed (exit status 1 when any was skipped).
"""
import sys

from absl import app, flags, logging

from motionjax.commands import run_absl

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (config.json, checkpoints)")
_OUT = flags.DEFINE_string("out", None, "output directory for the BVH files")
_STEP = flags.DEFINE_string("step", "best", "checkpoint step: an integer, 'best' or 'latest'")
_OVERLAP = flags.DEFINE_integer("overlap", None, "frames neighbouring windows share (default window / 4)")
_BATCH = flags.DEFINE_integer("batch", 32, "windows per model call")
flags.mark_flags_as_required(["workdir", "out"])


def _run(argv):
    if len(argv) < 2:
        raise app.UsageError("give motion files or directories to apply the run to")
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    from motionjax.data import prepare
    from motionjax.efficiency import trained
    from motionjax.evaluation import inference

    paths = [p for arg in argv[1:] for p in prepare.resolve_sources(arg)]
    if not paths:
        print(f"error: no motion files in {' '.join(argv[1:])}", file=sys.stderr)
        sys.exit(2)
    step = int(_STEP.value) if _STEP.value.isdigit() else _STEP.value
    try:
        run = trained.load(_WORKDIR.value, step)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    spec = inference.ModelSpec.from_run(run.config, run.info)
    written, errors = inference.apply_files(run.predict, spec, paths, _OUT.value, overlap=_OVERLAP.value,
                                            batch_size=_BATCH.value, log=lambda m: print(m, file=sys.stderr))
    print(f"{len(written)} of {len(paths)} files written to {_OUT.value}"
          + (f"; {len(errors)} skipped" if errors else ""))
    sys.exit(1 if errors else 0)


def main(argv: list[str] | None = None) -> int:
    """``motionjax apply [flags]``."""
    return run_absl(_run, argv)
