"""The honest straightforward setup, for speed comparisons against ``deepmimic_denoise``.

Same data, model and loss, done the plain way: the dense ``jax.jacfwd`` Jacobian in the dynamics
loss, the main-thread numpy loader (no Grain, no prefetch), fp32 compute.
"""
from experiments import deepmimic_denoise


def get_config(arg: str | None = None):
    c = deepmimic_denoise.get_config(arg)
    c.loss.jacobian = "dense"
    c.data.loader = "naive"
    c.data.prefetch = 0
    c.model.dtype = "float32"
    c.train.references = ()
    return c
