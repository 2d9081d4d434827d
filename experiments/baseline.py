"""The honest straightforward setup of any experiment, for speed comparisons against it.

Same data, model and loss, done the plain way: the main-thread numpy loader (no Grain, no
prefetch), fp32 compute, and the dense ``jax.jacfwd`` Jacobian in the dynamics loss. The default
experiment has the dynamics loss off, so there the Jacobian changes nothing: ``benchmarks/bench.py``
turns it on in both configs it compares.

``get_config()`` is the plain ``deepmimic_denoise``; ``get_config("NAME")`` or
``get_config("NAME:VARIANT")`` is the plain ``experiments/NAME.py`` (e.g. ``"autoencoder:bandai"``,
``"deepmimic_denoise:runlocal"``; plain ``"runlocal"`` is the latter); :func:`plain` makes any config plain.
"""
import ml_collections

from motionjax import configs


def plain(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``c`` done the plain way (in place; returns it). Everything that decides accuracy stays."""
    c.loss.jacobian = "dense"
    c.data.loader = "naive"
    c.data.prefetch = 0
    c.model.dtype = "float32"
    c.train.references = ()
    return c


def get_config(arg: str | None = None):
    name, _, variant = (arg or "deepmimic_denoise").partition(":")
    if name == "runlocal":  # the old spelling: the default experiment's tiny variant
        name, variant = "deepmimic_denoise", "runlocal"
    if not name.isidentifier() or name == "baseline":
        raise ValueError(f"baseline: {arg!r} is not an experiment name (experiments/NAME.py[:VARIANT])")
    module = configs.experiment(name)
    return plain(module.get_config(variant or None))
