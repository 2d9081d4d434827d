"""Experiment configs: where they are and how they load.

An experiment is a Python file defining ``get_config(arg=None)`` (an ml_collections ConfigDict), most
often a few overrides of :func:`motionjax.configs.base.get_config`. ``--config`` of every command
takes ``path/to/file.py[:ARG]`` (a file anywhere: the user's own experiment) or ``NAME[:ARG]``, the
name of an experiment that ships with the package (``motionjax train --config autoencoder:bandai``).

The shipped experiments are the repository's top-level ``experiments/`` folder, which the wheel
installs as ``motionjax/experiments/`` (setup.py): they are loaded by path, never imported as a
top-level package, so nothing but ``motionjax`` lands at the top of site-packages and a user's own
``experiments`` folder shadows nothing (docs/architecture.md, "Commands and configs").
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
# From a wheel: motionjax/experiments/ beside this package. From a source checkout (editable install or
# PYTHONPATH): the repository's experiments/ folder, which setup.py maps there.
EXPERIMENTS = next((p for p in (_PACKAGE / "experiments", _PACKAGE.parent / "experiments") if p.is_dir()),
                   _PACKAGE / "experiments")


def names() -> list[str]:
    """The shipped experiments' names (``--config NAME``)."""
    return sorted(p.stem for p in EXPERIMENTS.glob("*.py") if not p.stem.startswith("_"))


def resolve(spec: str) -> str:
    """``path.py[:ARG]`` as given when that file exists; ``NAME[:ARG]`` -> the shipped
    ``experiments/NAME.py[:ARG]``; anything else unchanged (its loader then names the missing file)."""
    path, sep, arg = spec.partition(":")
    if Path(path).is_file() or not path.removesuffix(".py").isidentifier():
        return spec
    shipped = EXPERIMENTS / f"{path.removesuffix('.py')}.py"
    return f"{shipped}{sep}{arg}" if shipped.is_file() else spec


def experiment(name: str):
    """The shipped experiment module ``NAME`` (``experiments/NAME.py``), loaded by path: what one
    experiment file uses to build on another (``experiments/generate.py`` on ``autoencoder``)."""
    file = EXPERIMENTS / f"{name}.py"
    if not name.isidentifier() or not file.is_file():
        raise ValueError(f"{name!r} is not a shipped experiment; expected one of {', '.join(names())}")
    return _module(file)


def load(spec: str):
    """``path/to/experiment.py[:ARG]`` or ``NAME[:ARG]`` -> its ``get_config(ARG)`` (``get_config()``
    without ``:ARG``).

    Raises ``FileNotFoundError`` naming the path when there is no such file."""
    path, _, arg = resolve(spec).partition(":")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"experiment config {path}: no such file")
    return _module(file).get_config(arg or None)


def run_name(spec: str) -> str:
    """``path/to/NAME.py[:A,B]`` (or ``NAME[:A,B]``) -> ``NAME[_A_B]``, the default run directory
    ``runs/<it>`` of ``motionjax train`` and ``make train``: one directory per experiment and variant."""
    path, _, arg = spec.partition(":")
    parts = [Path(path).stem, *(p for p in re.split(r"[,\s]+", arg) if p)]
    return "_".join(re.sub(r"[^\w.-]+", "-", p) for p in parts)


def _module(file: Path):
    """``file`` executed as a module of its own (afresh each call: an edited file is read again)."""
    spec = importlib.util.spec_from_file_location(f"experiment_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
