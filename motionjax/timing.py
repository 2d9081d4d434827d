"""Timing a call: the median wall time of repeated calls, with JAX's asynchronous results waited for.

The package's own measurements use it (the batch finder's ``throughput`` mode, the efficiency
scorecard's latency, the trainer's input check), and so does the checkout's benchmark code
(``benchmarks/measure.py``, ``benchmarks/input.py``).
:func:`time_call` takes a median, not a mean: on a shared machine a few calls take the hit of another
process. :func:`overhead` compares two ways of running a step from blocks timed round-robin
(:func:`time_blocks`): the mean over rounds, with an interval over rounds, since there every round's
pair of blocks shares that round's load.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

from motionjax.evaluation import intervals


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


def time_blocks(calls: dict, state, block: int, rounds: int, cpu: dict | None = None) -> dict:
    """Seconds per step of each of ``calls`` (``call(state) -> (state, *what it read)``), timed in
    blocks of ``block`` steps, round-robin ``rounds`` times (a load change on a shared host hits every
    call alike), each call warmed first; ``{name: [seconds per step of each block]}``. ``state`` is
    donated: pass a copy. ``cpu``: a dict that gets this process's CPU seconds per step the same way
    (on a CPU backend the device's work too; unlike wall time, not stretched by other processes)."""
    for call in calls.values():
        state = jax.block_until_ready(call(state)[0])
    seconds, cpu = {name: [] for name in calls}, {} if cpu is None else cpu
    for _ in range(rounds):
        for name, call in calls.items():
            keep, t, c = [], time.perf_counter(), time.process_time()
            for _ in range(block):
                state, *rest = call(state)
                keep.append(rest)  # every input lives until its step has run (XLA:CPU)
            jax.block_until_ready((state, keep))
            seconds[name].append((time.perf_counter() - t) / block)
            cpu.setdefault(name, []).append((time.process_time() - c) / block)
    return seconds


def overhead(seconds: dict, arm: str, base: str = "fixed") -> dict:
    """What ``arm`` costs over ``base`` (:func:`time_blocks`' seconds per step, same rounds):
    ``1 - base's steps/s / arm's``, from the mean of each over the rounds, with a 95% bootstrap
    interval over rounds (each round's two blocks resampled together, so a load change that hits
    one round moves both). On a shared 2-core VM a block's time moves +-15% from round to round:
    the best of a few blocks (``best``, also returned) is one lucky block's, the mean is steadier.
    ``{"value", "lo", "hi", "best", "rounds"}``."""
    a, b = np.asarray(seconds[arm], np.float64), np.asarray(seconds[base], np.float64)
    ratio = intervals.ratio_interval(b, a, clips=np.arange(a.size))  # mean(base) / mean(arm)
    return {"value": 1 - ratio["value"], "lo": 1 - ratio["hi"], "hi": 1 - ratio["lo"],
            "best": float(1 - b.min() / a.min()), "rounds": int(a.size)}
