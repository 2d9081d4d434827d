"""Timing a call: the median wall time of repeated calls, with JAX's asynchronous results waited for.

The package's own measurements use it (the batch finder's ``throughput`` mode, the efficiency
scorecard's latency), and so does the checkout's benchmark code (``benchmarks/measure.py``).
A median, not a mean: on a shared machine a few calls take the hit of another process.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax


def block(tree):
    """Wait for every array in ``tree`` (JAX dispatch is asynchronous); returns ``tree``."""
    return jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
              sync: Callable[[object], object] = block) -> float:
    """Median wall time (s) of ``fn()`` over ``repeats`` calls, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        sync(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)
