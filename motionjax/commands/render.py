"""Watch motion: skeletons side by side as an MP4 (or GIF).

    motionjax render A.bvh [B.bvh ...] --out clip.mp4          motion files, one panel each
    motionjax render --workdir RUN [--split test] [--clip NAME] [--seconds 10] --out clip.mp4
    (or python -m motionjax render, the same)
                                                                a run's held-out clip: input / output / truth

Files are read in their own units (detected from the bone lengths) and drawn at the first file's
frame rate, cut to the shortest, one panel each, titled by file stem (by path where stems collide:
``clip.bvh out/clip.bvh`` draws ``clip`` and ``out/clip``); e.g. an input and ``motionjax apply``'s
output of it. With
``--workdir``, the run's model (its best checkpoint) is applied to a whole clip of ``--split``
(default: the one that moves most), the input noised as the run's clip evaluator does, and drawn next
to the truth. The frames come from :func:`motionjax.evaluation.artifacts.render_video`, as the trainer's
``heldout_clip.mp4``.
"""
import sys

from absl import app, flags, logging

from motionjax.commands import run_absl

_OUT = flags.DEFINE_string("out", None, "video file to write (.mp4 or .gif)")
_NAMES = flags.DEFINE_list("names", None, "panel titles (default: the file stems; paths where they collide)")
_WORKDIR = flags.DEFINE_string("workdir", None, "a run directory: render one of its held-out clips")
_SPLIT = flags.DEFINE_string("split", "test", "with --workdir: the split to take the clip from")
_CLIP = flags.DEFINE_string("clip", None, "with --workdir: clip name (default: the one with most motion)")
_STEP = flags.DEFINE_string("step", "best", "with --workdir: checkpoint step, 'best' or 'latest'")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "with --workdir: at most this much of the clip")
flags.mark_flag_as_required("out")


def _run(argv):
    logging.set_verbosity(logging.WARNING)
    paths = argv[1:]
    if bool(paths) == bool(_WORKDIR.value):
        raise app.UsageError("give motion files or --workdir (one of them)")
    from motionjax.formats import MotionFormatError

    try:
        if paths:
            from motionjax.evaluation import artifacts

            n = artifacts.render_files(paths, _OUT.value, _NAMES.value)
        else:
            from motionjax.efficiency import trained
            from motionjax.evaluation import artifacts, runs

            run = trained.load(_WORKDIR.value, int(_STEP.value) if _STEP.value.isdigit() else _STEP.value)
            motions = runs.heldout_motions(run, _SPLIT.value, _CLIP.value, _SECONDS.value)
            title = f"{motions['truth'].name}, noise level {run.config.evals.clip.noise_level}"
            n = artifacts.render_video(run.info.skeleton, {k: m.positions() for k, m in motions.items()},
                                       _OUT.value, run.info.fps, title=title)
    except (MotionFormatError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{_OUT.value}: {n} frames")


def main(argv: list[str] | None = None) -> int:
    """``motionjax render [flags]``."""
    return run_absl(_run, argv)
