"""The ``motionjax`` command (``python -m motionjax`` too): one subcommand per task, each a module of
:mod:`motionjax.commands` with ``main(argv)``.

Only the chosen command's module is imported, and nothing before it, so a training process still sets
its allocator up first (:mod:`motionjax.malloc`, the first thing :mod:`motionjax.commands.train`
does; its re-execution repeats this same command line). ``--help`` exits 0 (absl's exits 1).
"""
from __future__ import annotations

import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    does: str
    example: str


COMMANDS = {
    "train": Command("train an experiment; the same command resumes it",
                     "motionjax train --config autoencoder:deepmimic"),
    "prepare": Command("motion files (BVH, DeepMimic) -> a prepared dataset",
                       "motionjax prepare --source 'my_bvh/*.bvh' --out data_cache/mine"),
    "evaluate": Command("score a run on any corpus: its metrics table",
                        "motionjax evaluate --workdir runs/autoencoder_deepmimic --data my_bvh/"),
    "apply": Command("a run's model over motion files, written as BVH",
                     "motionjax apply --workdir runs/autoencoder_deepmimic my_bvh/ --out out/"),
    "render": Command("skeletons side by side as a video (files or a run)",
                      "motionjax render my_bvh/walk.bvh out/walk.bvh --out walk.mp4"),
    "export": Command("a run as StableHLO and ONNX (fp32, int8), checked",
                      "motionjax export --workdir runs/autoencoder_deepmimic"),
    "sample": Command("motion of given labels from a trained generator: BVH files and a video",
                      "motionjax sample --workdir runs/generate --content walk --style elderly"),
    "stylize": Command("a motion file rendered in another style by a trained generator",
                       "motionjax stylize --workdir runs/generate --style elderly walk.bvh --out stylized/"),
}


def usage() -> str:
    """``motionjax --help``: every subcommand with what it does and an example (one screen)."""
    lines = ["usage: motionjax COMMAND [flags]      (or: python -m motionjax COMMAND [flags])", "",
             "commands (motionjax COMMAND --help: its flags):"]
    for name, c in COMMANDS.items():
        lines += [f"  {name:9s}{c.does}", f"  {'':9s}  {c.example}"]
    from motionjax import configs  # light: no jax

    shipped = ", ".join(configs.names())
    lines += ["", "--config: an experiment file (path.py[:VARIANT]) or the name of one that ships:",
              f"  {shipped}",
              "In a checkout: scripts/launch_local.sh (several processes), scripts/slurm/ (a cluster)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv[0]`` with the rest of ``argv`` (default ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; expected one of {', '.join(COMMANDS)} (motionjax --help)",
              file=sys.stderr)
        return 2
    sys.argv = [f"motionjax {name}", *rest]  # the script's usage lines and absl's --help name the command
    try:
        status = importlib.import_module(f"motionjax.commands.{name}").main(rest)
    except SystemExit as e:
        if e.code == 1 and {"-h", "--help", "--helpshort", "--helpfull"} & set(rest):
            return 0  # absl exits 1 after printing the help asked for
        return e.code if isinstance(e.code, int) or e.code is None else _message(e.code)
    return status or 0


def _message(text) -> int:
    print(text, file=sys.stderr)
    return 1
