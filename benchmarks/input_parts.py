"""The input program alone, taken apart: each transform of ``config.data`` turned off in turn (#61).

    python -m benchmarks.input_parts [--config experiments/deepmimic_denoise.py] [--rounds 10]

For the config's resident feed (:class:`motionjax.data.feed.Feed`, ``data.residency = "device"``), the
compiled input program of each variant in :data:`KNOCKOUTS` (the config with one transform off, and the
clean window alone), its batches timed in blocks round-robin in one process
(:func:`motionjax.timing.time_blocks`): this process's CPU ms a batch (on a CPU backend the program's
work; other processes on a shared host do not stretch it) and its ratio to the whole program, median
over rounds [min, max]. ``1 - ratio`` is what the transform costs. Prints a table; ratios inside one
run are what count on a shared machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from motionjax import configs, timing
from motionjax.data import feed, pipeline

# name: the config.data fields set (the transform turned off)
KNOCKOUTS = {
    "whole program": {},
    "no rotation noise": dict(rot_noise=0.0),
    "no root-position noise": dict(pos_noise=0.0),
    "no time warp": dict(time_warp=0.0),
    "no mirror": dict(mirror_prob=0.0),
    "no masks": dict(joint_mask_prob=0.0, frame_mask_prob=0.0),
    "no clean share": dict(clean_prob=0.0),
    "no floor (FK)": dict(floor_align=False),
    "clean window alone": dict(rot_noise=0.0, pos_noise=0.0, time_warp=0.0, mirror_prob=0.0,
                               joint_mask_prob=0.0, frame_mask_prob=0.0, clean_prob=0.0),
}


def program_call(cfg, info, fields: dict):
    """``call(state) -> (state, batch)``: the next batch of the resident feed for ``config.data``
    (``cfg``) with ``fields`` set, one run of its compiled input program (as benchmarks/input.py's
    ``input`` way)."""
    c = cfg.copy_and_resolve_references()
    c.update(residency="device", **fields)
    it = feed.Feed(c, info, seed=0, mode="device", keys=("noisy", "clean", "valid"))
    return lambda state: (state, next(it))


def run(spec: str, rounds: int, block: int = 40) -> dict:
    config = configs.load(spec)
    info = pipeline.dataset_info(config.data)
    calls = {name: program_call(config.data, info, fields) for name, fields in KNOCKOUTS.items()}
    cpu = {}
    timing.time_blocks(calls, 0, block, rounds, cpu=cpu)
    whole = cpu["whole program"]
    rows = {}
    for name, times in cpu.items():
        ratio = [t / w for t, w in zip(times, whole, strict=True)]
        rows[name] = {"cpu_ms": 1e3 * statistics.median(times), "ratio": statistics.median(ratio),
                      "ratio_range": [min(ratio), max(ratio)]}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/deepmimic_denoise.py")
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    rows = run(args.config, args.rounds)
    print(f"The input program of {args.config}, CPU ms a batch (median of {args.rounds} rounds) and its "
          "ratio to the whole program [min, max over rounds]\n")
    print("| variant | CPU ms a batch | ratio to the whole program |\n|---|---|---|")
    for name, r in rows.items():
        lo, hi = r["ratio_range"]
        print(f"| {name} | {r['cpu_ms']:.3f} | {r['ratio']:.2f} [{lo:.2f}, {hi:.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
