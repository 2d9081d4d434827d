"""One command, one table: motionjax optimized vs baseline, the input path, the dynamics loss across
J, MFU, cost growth (the parts and what each mode measures: :mod:`benchmarks.suite`). From the
checkout's root (benchmarks/ is not installed with the package):

    make bench                                     # the default: every part, ~12 min on 2 cores
    python -m benchmarks.bench --quick             # a smoke check, ~2 min (no dynamics grid)
    python -m benchmarks.bench --full              # everything docs/benchmarks.md reports: hours
    python -m benchmarks.bench --parts growth,mfu [--grid-budget 600] [--out results/bench]

Writes ``bench.json``, ``bench.md`` (the table) and PNG plots to ``--out`` after every part and
prints the table at the end; each part's time is in the log (``[bench] train: 251 s``).
"""
import argparse
import shlex
import signal
import sys
from pathlib import Path

from benchmarks.suite import PARTS, run


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, no dynamics grid (~2 min, 2 cores)")
    mode.add_argument("--full", action="store_true", help="3 seeds, J growth, the whole dynamics grid with "
                      "bfloat16 and 65,536 frames (hours on 2 cores)")
    parser.add_argument("--parts", default=None, help=f"comma-separated subset of {','.join(PARTS)} "
                        "(default: all; with --quick all but dynamics)")
    parser.add_argument("--grid-budget", type=float, default=None, metavar="SECONDS",
                        help="the dynamics grid starts no row after this long (default 180 s; --full: none; "
                        "0: none)")
    parser.add_argument("--out", default="results/bench", help="results folder")
    args = parser.parse_args(argv)
    default = [p for p in PARTS if not (args.quick and p == "dynamics")]
    parts = args.parts.split(",") if args.parts else default
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}; expected a subset of {','.join(PARTS)}")
    command = shlex.join(["python", "-m", "benchmarks.bench", *(sys.argv[1:] if argv is None else argv)])
    return run(parts, "quick" if args.quick else "full" if args.full else "default", Path(args.out), command,
               grid_budget_s=args.grid_budget)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill`, `timeout`: keep what was measured
    failed = [name for name, part in main()["parts"].items() if "error" in part]
    sys.exit(f"[bench] parts that failed: {', '.join(failed)}" if failed else 0)
