"""Evaluate a trained run on another corpus: the trainer's metrics table, and its JSON.

    motionjax evaluate --workdir RUN --data PREPARED_DIR|MOTION_FILES [--split test] [--step best]
    (or python -m motionjax evaluate, the same)

``--data``: a prepared directory (``index.json``; its skeleton must be the run's, its split
``--split``), or motion files (a file, a directory or a quoted glob such as ``'capture/*.bvh'``),
prepared on first use with the run's settings (frame rate, window, units, joint order) into
``data_cache/eval/`` with every clip in ``--split``, none dropped as a copy of another (``--dedup``
drops copies, as training data is). Every file left out (it does not read, another skeleton) and
every clip scored on less (shorter than the window: fewer frames, a forecaster's fewer horizons) is
named on the console with its reason. The model is the run's checkpoint ``--step`` (default: the best
on validation), its input standardized with the run's own statistics; the table has the model, the
reference models trained beside it (``RUN/NAME``: ``train.reference_models``, ``no_dynamics``), its
input and the per-frame PCA reference (fitted on the run's training data), as the trainer prints; a
forecasting run's (``experiments/predict.py``) is its horizon table beside the zero- and
constant-velocity baselines and the truth, with how many clips each horizon averages.
The JSON goes to ``--out`` (default ``RUN/eval/<corpus>_<split>.json``).
"""
import json
import sys
from pathlib import Path

from absl import app, flags, logging

from motionjax.commands import run_absl

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (config.json, checkpoints)")
_DATA = flags.DEFINE_string("data", None, "prepared directory, or motion files (file, directory, glob)")
_SPLIT = flags.DEFINE_string("split", "test", "split to evaluate (motion files all go into it)")
_STEP = flags.DEFINE_string("step", "best", "checkpoint step: an integer, 'best' or 'latest'")
_OUT = flags.DEFINE_string("out", None, "JSON path (default RUN/eval/<corpus>_<split>.json)")
_CACHE = flags.DEFINE_string("cache", "data_cache/eval", "where motion files are prepared")
_DEDUP = flags.DEFINE_bool("dedup", False, "drop copies among the motion files, as training data does")
flags.mark_flags_as_required(["workdir", "data"])


def _run(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    from motionjax.efficiency import trained
    from motionjax.evaluation import evaluators, inference, runs
    from motionjax.formats import MotionFormatError

    step = int(_STEP.value) if _STEP.value.isdigit() else _STEP.value
    try:
        run = trained.load(_WORKDIR.value, step)
        info = runs.corpus_for(run, _DATA.value, _SPLIT.value, _CACHE.value, dedup=_DEDUP.value)
        results = runs.evaluate(run, info, _SPLIT.value, trained.references(run.config, _WORKDIR.value))
    except (FileNotFoundError, ValueError, MotionFormatError, inference.SkeletonMismatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    name = Path(info.data_dir).name
    table = evaluators.forecast_table(results) or evaluators.results_table(results)
    segments = info.splits[_SPLIT.value]
    print(f"{_WORKDIR.value} step {run.step} on {info.data_dir} ({_SPLIT.value}: "
          f"{len({c for c, _, _ in segments})} clips, {len(segments)} segments, "
          f"{info.split_frames(_SPLIT.value)} frames; files left out: {len(info.skipped)})")
    print("\n".join(table))
    out = Path(_OUT.value or Path(_WORKDIR.value) / "eval" / f"{name}_{_SPLIT.value}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workdir": _WORKDIR.value, "step": run.step, "data": _DATA.value,
                               "prepared": info.data_dir, "split": _SPLIT.value, "results": results,
                               "table": table}, indent=2))
    print(f"written: {out}")


def main(argv: list[str] | None = None) -> int:
    """``motionjax evaluate [flags]``."""
    return run_absl(_run, argv)
