"""The frozen autoencoder stage of a generation run: trained first, or taken from a run directory."""

from __future__ import annotations

import copy
from pathlib import Path

import ml_collections


def autoencoder_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The experiment's autoencoder stage: ``config`` without its ``generation`` section (a plain
    ``experiments/autoencoder.py``-style config, what ``WORKDIR/autoencoder/config.json`` holds)."""
    ae = copy.deepcopy(config)
    with ae.unlocked():
        del ae["generation"]
    return ae


def autoencoder_dir(config: ml_collections.ConfigDict, workdir) -> Path:
    """Where the frozen autoencoder lives: ``generation.autoencoder`` or ``WORKDIR/autoencoder``."""
    return Path(config.generation.autoencoder or Path(workdir) / "autoencoder")


def train_autoencoder(config: ml_collections.ConfigDict, workdir) -> Path:
    """Train (or resume, or find finished) the autoencoder stage in ``WORKDIR/autoencoder`` with the
    trainer of every experiment; a given ``generation.autoencoder`` run is used as it is."""
    from motionjax import train

    path = autoencoder_dir(config, workdir)
    if config.generation.autoencoder:
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"generation.autoencoder={path}: no config.json; expected a run "
                "directory of experiments/autoencoder.py"
            )
        return path
    from motionjax.train import checks

    checks.check_resume(autoencoder_config(config), path)  # another config's autoencoder is an error
    if (path / "summary.json").exists():  # finished: its table was printed when it was
        return path
    print(f"autoencoder stage: training in {path} ({config.train.steps} steps)", flush=True)
    train.run_experiment(autoencoder_config(config), path)
    return path
