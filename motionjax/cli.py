"""The ``motionjax`` command (``python -m motionjax`` too): one subcommand per task.

Each subcommand runs its script of the source checkout (``scripts/``, ``benchmarks/``) as if it were
started itself: the same flags, ``--help``, messages and exit codes (but 0 after a ``--help``, where
absl's scripts exit 1). This module imports nothing
else, so a training process still sets its allocator up first (:mod:`motionjax.malloc`, the first
thing ``scripts/train.py`` does; its re-execution repeats this same command line).
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Command(NamedTuple):
    script: str      # relative to the checkout
    does: str
    example: str


COMMANDS = {
    "train": Command("scripts/train.py", "train an experiment; the same command resumes it",
                     "motionjax train --config experiments/autoencoder.py:deepmimic"),
    "prepare": Command("scripts/prepare_data.py", "motion files (BVH, DeepMimic) -> a prepared dataset",
                       "motionjax prepare --source 'my_bvh/*.bvh' --out data_cache/mine"),
    "evaluate": Command("scripts/evaluate.py", "score a run on any corpus: its metrics table",
                        "motionjax evaluate --workdir runs/autoencoder_deepmimic --data my_bvh/"),
    "apply": Command("scripts/apply.py", "a run's model over motion files, written as BVH",
                     "motionjax apply --workdir runs/autoencoder_deepmimic my_bvh/ --out out/"),
    "render": Command("scripts/render.py", "skeletons side by side as a video (files or a run)",
                      "motionjax render my_bvh/walk.bvh out/walk.bvh --out walk.mp4"),
    "export": Command("scripts/export.py", "a run as StableHLO and ONNX (fp32, int8), checked",
                      "motionjax export --workdir runs/autoencoder_deepmimic"),
    "bench": Command("benchmarks/bench.py", "the benchmark table (motionjax vs baseline vs PyTorch)",
                     "motionjax bench --quick"),
}


def usage() -> str:
    """``motionjax --help``: every subcommand with what it does and an example (one screen)."""
    lines = ["usage: motionjax COMMAND [flags]      (or: python -m motionjax COMMAND [flags])", "",
             "commands (motionjax COMMAND --help: its flags):"]
    for name, c in COMMANDS.items():
        lines += [f"  {name:9s}{c.does}", f"  {'':9s}  {c.example}"]
    lines += ["", "More: scripts/launch_local.sh (several processes), scripts/slurm/ (a cluster),",
              "scripts/find_batch.py (the largest batch that fits); benchmarks/ (measurements, reports)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``argv[0]``'s script with the rest of ``argv`` (default ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; expected one of {', '.join(COMMANDS)} (motionjax --help)",
              file=sys.stderr)
        return 2
    script = ROOT / COMMANDS[name].script
    if not script.is_file():
        print(f"error: motionjax {name} runs {COMMANDS[name].script} of the source checkout motionjax is "
              f"installed from, and {script} is not there: install the checkout with pip install -e .",
              file=sys.stderr)
        return 2
    sys.argv = [f"motionjax {name}", *rest]  # the script's usage lines and absl's --help name the command
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code == 1 and {"-h", "--help", "--helpshort", "--helpfull"} & set(rest):
            return 0  # absl exits 1 after printing the help asked for
        return e.code if isinstance(e.code, int) or e.code is None else _message(e.code)
    return 0


def _message(text) -> int:
    print(text, file=sys.stderr)
    return 1
