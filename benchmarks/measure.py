"""Measurement primitives shared by every benchmark part: timing, compile seconds, peak FLOP/s, MFU,
power-law fits, smooth random motion to feed a step.

Speed numbers on a shared machine are noisy, so every helper reports the *median* of repeated
calls and every claim in the benchmark is a ratio of numbers taken in the same run.
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from motionjax.timing import block, time_call  # noqa: F401  (the package's own; used here and by the parts)

_CACHE_HITS = [0]  # persistent-cache hits so far in this process (jax.monitoring counts them)


def _count_cache_hit(event: str, **_) -> None:
    _CACHE_HITS[0] += event == "/jax/compilation_cache/cache_hits"


jax.monitoring.register_event_listener(_count_cache_hit)


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def lower_and_compile(lower: Callable[[], jax.stages.Lowered]) -> tuple[jax.stages.Compiled, dict]:
    """``lower().compile()`` with the seconds of each stage: ``(compiled, {"lower_s", "compile_s",
    "lower_cpu_s", "compile_cpu_s", "cache_hit"})``. ``lower``: e.g. ``lambda: jitted.lower(*args)``
    (tracing and lowering to StableHLO); ``compile`` is XLA's compile. CPU seconds are the process's
    (XLA compiles with several threads; on a loaded machine they move less than wall seconds);
    ``cache_hit``: the executable came from a persistent compilation cache (compile_s is then a load)."""
    wall, cpu, hits = time.perf_counter(), _cpu_s(), _CACHE_HITS[0]
    lowered = lower()
    wall_lowered, cpu_lowered = time.perf_counter(), _cpu_s()
    compiled = lowered.compile()
    return compiled, {"lower_s": wall_lowered - wall, "compile_s": time.perf_counter() - wall_lowered,
                      "lower_cpu_s": cpu_lowered - cpu, "compile_cpu_s": _cpu_s() - cpu_lowered,
                      "cache_hit": _CACHE_HITS[0] > hits}


def interleaved_rounds(calls: dict[str, Callable[[], object]], rounds: int = 5, repeats: int = 2,
                       warmup: int = 0, sync: Callable[[object], object] = block) -> dict[str, list[float]]:
    """Per-round wall times (s) of each of ``calls``, timed round-robin: every round times each call
    (the median of ``repeats`` calls after ``warmup`` untimed ones), so a load change on a shared
    machine hits every candidate alike, which sequential timing (all of one, then all of the next)
    does not give.

    ``warmup=1`` measures each program in steady state, as a training loop runs it: on a small VM a
    short program's time depends on what ran just before it (the dynamics grid at J = 24, 1,024
    frames: 15–19 ms back to back, 29–61 ms right after another program, 55–89 ms after 0.5 s idle).
    """
    for fn in calls.values():
        sync(fn())  # compile / first-call costs
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(time_call(fn, repeats=repeats, warmup=warmup, sync=sync))
    return times


def interleaved(calls: dict[str, Callable[[], object]], rounds: int = 5, repeats: int = 2, warmup: int = 0,
                sync: Callable[[object], object] = block) -> dict[str, float]:
    """Median over rounds of :func:`interleaved_rounds`: one wall time (s) per call."""
    times = interleaved_rounds(calls, rounds, repeats, warmup, sync)
    return {name: statistics.median(t) for name, t in times.items()}


def matmul(n: int = 2048, dtype=jnp.float32) -> tuple[Callable[[], jax.Array], float]:
    """The peak probe: a jitted ``[n, n] @ [n, n]`` matmul as a zero-argument call, and its FLOPs
    (2n³). Time it next to the steps it normalises (:func:`interleaved`), or :func:`peak_flops`."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    return functools.partial(jax.jit(jnp.matmul), a, a), 2.0 * n**3


def peak_flops(n: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
    """Achievable FLOP/s of this backend: :func:`matmul`, best of ``repeats`` runs.

    Measured in the same run as the steps it normalises, so MFU is not skewed by a load
    difference between a published peak and this machine now (shared CPUs, clocks).
    """
    call, flops = matmul(n, dtype)
    block(call())
    return flops / min(_wall(lambda: block(call())) for _ in range(repeats))


def _wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compiled_flops(compiled) -> float:
    """XLA's FLOP count of one call of a ``jax.stages.Compiled`` (``jitted.lower(*args).compile()``).

    XLA counts a loop body once regardless of its trip count, so a step with ``lax.scan`` or
    ``fori_loop`` is under-counted; the steps benchmarked here are unrolled.
    """
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0]
    return float(analysis.get("flops", float("nan")))


def mfu(flops_per_step: float, step_time: float, peak: float) -> float:
    """Model FLOP utilisation: achieved FLOP/s (``flops_per_step / step_time``) over ``peak``."""
    return flops_per_step / step_time / peak


def smooth_motion(rng: np.random.Generator, batch: int, frames: int, joints: int, angle_std: float = 0.05,
                  root_std: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Smooth random motion, ``(root [B, T, 3] m, axis-angle rotations [B, T, J, 3] rad)`` float32:
    random walks of ``angle_std`` rad and ``root_std`` m Gaussian steps per frame (rotations first,
    both drawn from ``rng``)."""
    angles = np.cumsum(rng.normal(0, angle_std, (batch, frames, joints, 3)), axis=1).astype(np.float32)
    root = np.cumsum(rng.normal(0, root_std, (batch, frames, 3)), axis=1).astype(np.float32)
    return root, angles


def fit_power_law(x, y) -> tuple[float, float, float]:
    """Least-squares fit of ``y = c · x^k`` in log-log space: returns ``(k, c, r²)``."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    k, logc = np.polyfit(lx, ly, 1)
    residual = ly - (k * lx + logc)
    total = ly - ly.mean()
    r2 = 1.0 - float(residual @ residual) / float(total @ total) if total.any() else 1.0
    return float(k), float(np.exp(logc)), r2
