"""A trained run's model, restored from its orbax checkpoint (as ``notebooks/03`` does).

The trainer's model carries the mesh (halo exchange by ``shard_map``); inference and export want a
mesh-free copy, so the restored parameters are put into a fresh ``mesh=None`` model in eval mode.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from motionjax import models, parallel, train
from motionjax.core.features import feature_dim
from motionjax.data import clean, pipeline, prepare


@dataclasses.dataclass
class Trained:
    """``config`` (the run's), ``info`` (its dataset), ``model`` (eval mode, no mesh), ``step``."""

    config: ml_collections.ConfigDict
    info: pipeline.DatasetInfo
    model: nnx.Module
    step: int

    @functools.cached_property
    def predict(self):
        """``predict(x [B, N, C, F] numpy) -> numpy``: the model jitted (standardized features)."""
        from motionjax.efficiency.scorecard import jit_predict

        return jit_predict(self.model)

    @property
    def window_shape(self) -> tuple[int, int, int]:
        """``(N, C, F)`` of one window: chunks, frames per chunk, features per frame."""
        d = self.config.data
        return d.window // d.chunk, d.chunk, feature_dim(self.info.skeleton)


def build_model(config: ml_collections.ConfigDict, info, seed: int | None = None) -> nnx.Module:
    """A fresh mesh-free model of ``config.model`` for ``info``'s features, in eval mode."""
    model = models.make_model(config.model, feature_dim(info.skeleton), config.data.chunk,
                              nnx.Rngs(config.seed if seed is None else seed), info=info,
                              observed=config.data.observed)
    model.eval()
    return model


def _keys_added_since() -> dict:
    """``{section: {key: value}}``: config keys added after runs were written, each with what those runs
    did before it existed (not today's default): in ``data``, forecasting (#28), cleaning and the
    copies-only dedup (#31), the std floor (#34); in ``train``, the optimizer's name (#32) and the
    ordered fp32 sum (#27)."""
    return {"data": {"observed": 0, "clean": "off", "clean_limits": dataclasses.asdict(clean.Thresholds()),
                     "copy_threshold": prepare.Settings.copy_threshold,
                     "dedup_policy": prepare.Settings.dedup_policy, "std_floor": 0.0},
            "train": {"optimizer": "adamw", "grad_reduce_ordered": False, "micro_batches": 1}}


def load_config(workdir) -> ml_collections.ConfigDict:
    """A run's ``config.json``, with the keys later code added (:func:`_keys_added_since`) filled in,
    so library code reads every key plainly."""
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no config.json; expected a run directory written by "
                                "motionjax train")
    config = ml_collections.ConfigDict(json.loads(path.read_text()))
    for section, keys in _keys_added_since().items():
        for key, value in keys.items():
            if key not in config[section]:
                config[section][key] = value
    return config


def load(workdir, step: int | str = "best") -> Trained:
    """The model of run ``workdir`` at ``step``: an int, ``"best"`` (by validation MPJPE; the latest
    when no checkpoint has the metric) or ``"latest"``."""
    workdir = Path(workdir)
    config = load_config(workdir)
    mesh = parallel.make_mesh(config.mesh)
    info = pipeline.dataset_info(config.data)
    _, _, state, _ = train.init_state(config, info, mesh)  # shapes and shardings to restore into
    manager = train.make_checkpoint_manager(workdir, config.train)
    try:
        steps = manager.all_steps()
        if not steps:
            raise FileNotFoundError(f"{workdir / 'checkpoints'}: no checkpoints")
        if step == "best":
            step = manager.best_step() if manager.best_step() is not None else manager.latest_step()
        elif step == "latest":
            step = manager.latest_step()
        elif step not in steps:
            raise FileNotFoundError(f"{workdir / 'checkpoints'}: no step {step}; have {sorted(steps)}")
        state, _ = train.restore_checkpoint(manager, int(step), state)
    finally:
        manager.close()
    model = build_model(config, info)
    # immutable, one device; the parameters the run evaluated (its moving average, if it kept one)
    nnx.update(model, jax.tree.map(jnp.asarray, jax.device_get(train.evaluated_params(state))))
    return Trained(config, info, model, int(step))


def reference_runs(config, workdir) -> dict:
    """``{name: run directory}`` of the reference models trained beside the run in ``workdir``
    (:func:`motionjax.train.loop.run_experiment`: ``train.reference_models``, and ``no_dynamics`` where
    ``train.references`` names it and the run has the dynamics loss), whether or not they exist yet."""
    names = list(config.train.reference_models.keys())
    if "no_dynamics" in config.train.references and config.loss.dynamics_weight > 0:
        names.insert(0, "no_dynamics")
    return {name: Path(workdir) / name for name in names}


def references(config, workdir, log=print) -> dict[str, Trained]:
    """``{name: Trained}``: the reference models trained beside the run in ``workdir``
    (:func:`reference_runs`) at their best checkpoints; one not trained is named by ``log`` and left out."""
    loaded = {}
    for name, path in reference_runs(config, workdir).items():
        if not (path / "checkpoints").is_dir():
            log(f"reference {name}: {path} holds no trained run; not in the table")
            continue
        loaded[name] = load(path)
    return loaded
