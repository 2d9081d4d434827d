"""What an efficiency variant is judged by: test-split MPJPE, parameter bytes, latency per window.

Latencies are medians of many calls after a warm-up, measured in one process so that variants can
be compared as ratios (the absolute numbers move with the machine's load).
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from motionjax import timing
from motionjax.data import pipeline
from motionjax.evaluation import metrics


def jit_predict(model: nnx.Module):
    """``predict(x [B, N, C, F] numpy) -> numpy``: ``model`` jitted (weights as constants)."""
    graphdef, state = nnx.split(model)
    apply = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    return lambda x: np.asarray(apply(state, x))


def eval_batches(config, info, split: str = "test", noise_level: float | None = None) -> list[dict]:
    """The trainer's evaluation windows of ``split`` (noise ``evals.final.noise_level`` unless given)."""
    level = config.evals.final.noise_level if noise_level is None else noise_level
    return pipeline.make_eval_batches(config.data, info, split, level, seed=config.seed)


def mpjpe(predict, config, info, batches) -> float:
    """Root-relative MPJPE (cm) of ``predict`` over ``batches`` (:func:`.metrics.evaluate`)."""
    m = metrics.evaluate(predict, batches, info.skeleton, float(info.fps), info.mean, info.std,
                         config.loss.contact_speed)
    return float(m["mpjpe"])


def param_bytes(model: nnx.Module) -> int:
    """Bytes of the model's parameters as stored (int8 values + their scales for a quantized model)."""
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def param_count(model: nnx.Module) -> int:
    return int(sum(np.size(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def latency(fn, x, repeats: int = 100, warmup: int = 5) -> float:
    """Median seconds per call of ``fn(x)`` (a JAX result is waited for)."""
    return timing.time_call(lambda: fn(x), repeats, warmup)


def window(shape, batch: int = 1, seed: int = 0) -> np.ndarray:
    """A standard-normal input ``[batch, N, C, F]`` float32 (the features are standardized)."""
    return np.random.default_rng(seed).standard_normal((batch, *shape)).astype(np.float32)


