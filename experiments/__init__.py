"""Experiment configs: ``experiments/NAME.py`` defines ``get_config(arg=None)`` (an ml_collections
ConfigDict). ``scripts/train.py --config experiments/NAME.py[:ARG]`` loads one through ml_collections'
``config_flags`` (with ``--config.x=y`` overrides); :func:`load` is the same for other scripts."""
import importlib.util
import re
from pathlib import Path


def load(spec: str):
    """``path/to/experiment.py[:ARG]`` -> its ``get_config(ARG)`` (``get_config()`` without ``:ARG``).

    Raises ``FileNotFoundError`` naming the path when there is no such file."""
    path, _, arg = spec.partition(":")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"experiment config {path}: no such file")
    module_spec = importlib.util.spec_from_file_location(f"experiment_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def run_name(spec: str) -> str:
    """``path/to/NAME.py[:A,B]`` -> ``NAME[_A_B]``, the default run directory ``runs/<it>`` of
    ``scripts/train.py`` and ``make train``: one directory per experiment and variant."""
    path, _, arg = spec.partition(":")
    parts = [Path(path).stem, *(p for p in re.split(r"[,\s]+", arg) if p)]
    return "_".join(re.sub(r"[^\w.-]+", "-", p) for p in parts)
