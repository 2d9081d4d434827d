"""Cleaning quality on Bandai-1 (benchmarks/clean_quality.py): flagged frames on the untouched clips,
recall and precision per injected kind x magnitude, FK error of the repaired frames.

    python benchmarks/bench_clean.py [--trials 40] [--min-frames 120] [--out results/bench_clean.json]

Prints a table and writes JSON (docs/data.md "Cleaning" quotes it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import clean_quality  # noqa: E402
from motionjax.data import prepare  # noqa: E402

BANDAI = ROOT.parent / "shared" / "data" / "bandai-namco-1" / "data"


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=40, help="injections per kind x magnitude")
    p.add_argument("--min-frames", type=int, default=120, help="clips at least this long receive injections")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bench_clean.json")
    args = p.parse_args()
    paths = prepare.resolve_sources(str(BANDAI))
    if not paths:
        raise SystemExit(f"error: {BANDAI} not found (the Bandai-1 corpus of ../shared/data)")
    settings = clean_quality.settings_for()
    th = settings.thresholds
    clips = clean_quality.load_clips(paths, settings.fps)
    # The defaults are set from what real motion does: everyday capture (Bandai-1) and acrobatics
    # (pybullet's DeepMimic clips: backflips, rolls, get-ups).
    deepmimic = clean_quality.load_clips(prepare.resolve_sources(None), settings.fps)
    maxima, clean_runs = {}, {}
    for name, corpus in (("bandai-1", clips), ("deepmimic", deepmimic)):
        maxima[name] = clean_quality.measure_maxima(corpus, th)
        clean_runs[name] = clean_quality.untouched(corpus, th, settings.window)
    print(f"{'measure on the untouched corpora':<34}{'Bandai-1 max':>13}{'DeepMimic max':>14}{'default':>10}"
          "   clips")
    for k, v in maxima["bandai-1"].items():
        w = maxima["deepmimic"].get(k, {"max": None, "clip": "-"})
        print(f"{k:<34}{v['max']:>13.4g}{_fmt(w['max'], '.4g'):>14}{_fmt(v['default'], '.4g'):>10}   "
              f"{v['clip']}, {w['clip']}")
    for name, run in clean_runs.items():
        print(f"untouched {name}: {run['flagged_frames']} of {run['frames']} frames flagged "
              f"({100 * run['flagged_fraction']:.3f}%) in {len(run['flagged_clips'])} clips "
              f"{run['per_kind_frames']}")
        for c in run["flagged_clips"]:
            print(f"  {c['clip']} ({c['frames']} frames): {c['defects']}")
    clean_run = clean_runs
    rows = clean_quality.injected(clips, settings, args.trials, args.min_frames, args.seed)
    print(f"{'kind':<10}{'magnitude':>10}{'recall':>8}{'any':>6}{'precision':>10}{'repaired':>9}{'cut':>6}"
          f"{'MPJPE cm':>9}{'p95 max cm':>11}{'<1 cm':>7}")
    for r in rows.values():
        print(f"{r['kind']:<10}{r['magnitude']:>10g}{r['recall']:>8.2f}{r['recall_any_kind']:>6.2f}{_fmt(r['precision']):>10}"
              f"{r['gt_repaired']:>9.2f}{r['gt_cut']:>6.2f}{_fmt(r['repair_mpjpe_cm']):>9}"
              f"{_fmt(r['repair_max_cm_p95']):>11}{_fmt(r['repair_frames_within_1cm']):>7}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"thresholds": th.__dict__, "trials": args.trials,
                               "min_frames": args.min_frames,
                               "maxima": maxima, "untouched": clean_run, "injected": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
