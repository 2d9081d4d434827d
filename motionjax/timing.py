"""Timing a call: the median wall time of repeated calls, with JAX's asynchronous results waited for.

The package's own measurements use it (the batch finder's ``throughput`` mode, the efficiency
scorecard's latency, the trainer's input check), and so does the checkout's benchmark code
(``benchmarks/measure.py``, ``benchmarks/input.py``).
:func:`time_call` takes a median, not a mean: on a shared machine a few calls take the hit of another
process. :func:`overhead` compares two ways of running a step from rounds of them, timed in blocks
round-robin (:func:`time_blocks`) or interleaved step by step (:func:`time_interleaved`, where each
way's work is all in the step's programs): the mean over rounds, with an interval over rounds, since
there every round's ways share that round's load.
"""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

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


def time_blocks(calls: dict, state, block: int, rounds: int, cpu: dict | None = None,
                threads: dict | None = None, steps: dict | None = None, shuffle: int | None = None,
                lag: int = 2) -> dict:
    """Seconds per step of each of ``calls`` (``call(state) -> (state, *what it read)``), timed in
    blocks of ``block`` steps, round-robin ``rounds`` times (a load change on a shared host hits every
    call alike), each call warmed first; ``{name: [seconds per step of each block]}``. ``state`` is
    donated: pass a copy. A block starts on an idle device and ends when its last step is done; inside
    it each step's outputs are waited for ``lag`` steps after its dispatch (as the trainer reads its
    metrics), so the device has that many steps queued, and the wait's end marks the step done
    (exact while the host dispatches faster than the device runs steps).
    ``cpu``: a dict that gets this process's CPU seconds per step the same way (on a CPU backend the
    device's work too; unlike wall time, not stretched by other processes).
    ``threads``: a dict that gets ``{name: {thread kind: CPU seconds per step, mean over rounds}}``
    (:func:`thread_cpu`: XLA's compute threads, the main thread, an input pipeline's threads).
    ``steps``: a dict that gets ``{name: [[seconds of each step] of each block]}``, from one step's
    mark to the next's (the first from the block's start).
    ``shuffle``: a seed; each round then runs the calls in its own random order (no call always
    follows the same one), else in ``calls``' order."""
    state = _warm(calls, state)
    seconds, cpu = {name: [] for name in calls}, {} if cpu is None else cpu
    rng = None if shuffle is None else np.random.default_rng(shuffle)
    for _ in range(rounds):
        for name in list(calls) if rng is None else [str(n) for n in rng.permutation(list(calls))]:
            before = thread_cpu() if threads is not None else None
            t, c = time.perf_counter(), time.process_time()
            state, marks, _ = _run(state, [calls[name]] * block, lag)
            seconds[name].append((time.perf_counter() - t) / block)
            cpu.setdefault(name, []).append((time.process_time() - c) / block)
            if steps is not None:
                steps.setdefault(name, []).append(np.diff([t, *marks]).tolist())
            if threads is not None:
                kinds = threads.setdefault(name, {})
                for tid, (kind, used) in thread_cpu().items():
                    spent = used - before.get(tid, (kind, 0.0))[1]
                    kinds[kind] = kinds.get(kind, 0.0) + spent / block / rounds
    return seconds


def time_interleaved(calls: dict, state, cycles: int, rounds: int, cpu: dict | None = None,
                     steps: dict | None = None, shuffle: int = 0, lag: int = 2) -> dict:
    """Seconds per step of each of ``calls`` (as :func:`time_blocks`), the calls interleaved step by
    step: a round is ``cycles`` cycles, each one step of every call in its own random order, run as one
    queue (``lag`` steps deep); a step's time is from the mark of the step before it to its own (the
    wait for its outputs to be done), so it is that step's device time while the device is never idle,
    and the host's when the host is the slower. ``{name: [mean seconds of its steps in each round]}``:
    every call's steps of a round share that round's load, step by step, which blocks of one call
    each cannot (on a shared VM the load drifts between blocks: :func:`spread`). Each round starts
    with one more step, not counted (timed from an idle device).
    For calls that run all their work in the step's programs and take the state on (each step then
    waits for the one before it); a call with work off the main thread (an input pipeline's thread), or
    one whose program does not take the state (it may run beside the step before it), would overlap
    the other calls' steps here: time it in blocks. ``cpu``: this process's CPU seconds between the
    same marks, put on the step that ended there (approximate: the main thread is then dispatching a
    later step). ``steps``: ``{name: [[seconds of each of its steps] of each round]}``."""
    state = _warm(calls, state)
    names = list(calls)
    seconds, cpu = {name: [] for name in names}, {} if cpu is None else cpu
    rng = np.random.default_rng(shuffle)
    for _ in range(rounds):
        order = [names[i] for _ in range(cycles) for i in rng.permutation(len(names))]
        # A lead-in step first (the round's first call once more), timed from an idle device: not counted.
        state, marks, cpu_marks = _run(state, [calls[n] for n in order[:1] + order], lag)
        wall, used = np.diff(marks), np.diff(cpu_marks)  # [i]: the step of order[i]
        for name in names:
            mine = [i for i, n in enumerate(order) if n == name]
            seconds[name].append(float(wall[mine].mean()))
            cpu.setdefault(name, []).append(float(used[mine].mean()))
            if steps is not None:
                steps.setdefault(name, []).append(wall[mine].tolist())
    return seconds


def _warm(calls: dict, state):
    """Each call run once and waited for (its compile and first run out of the timing)."""
    for call in calls.values():
        state = jax.block_until_ready(call(state)[0])
    return state


def _run(state, sequence: list, lag: int):
    """``state`` through each call of ``sequence`` in turn, each step's outputs waited for ``lag`` steps
    after its dispatch; returns ``(state, wall marks, CPU marks)``, one mark a step, when it was seen
    done (``time.perf_counter``, ``time.process_time``)."""
    keep, marks, cpu_marks = [], [], []
    for i, call in enumerate(sequence):
        state, *rest = call(state)
        keep.append(rest)  # every input lives until its step has run (XLA:CPU)
        if i >= lag:
            jax.block_until_ready(keep[i - lag])
            marks.append(time.perf_counter())
            cpu_marks.append(time.process_time())
    for rest in keep[len(marks):]:
        jax.block_until_ready(rest)
        marks.append(time.perf_counter())
        cpu_marks.append(time.process_time())
    jax.block_until_ready((state, keep))
    return state, marks, cpu_marks


def thread_cpu() -> dict:
    """``{thread id: (kind, CPU seconds so far)}`` for this process's threads (Linux's ``/proc``; empty
    elsewhere). ``kind``: ``"main"``, a Python thread's name or else the OS thread's (XLA's compute
    pool is ``tf_XLAEigen``), up to its first ``-`` (``Thread-3 (run)`` -> ``Thread``). Ticks of
    ``SC_CLK_TCK`` (10 ms): read over blocks of steps, not one step. A thread that starts and ends
    between two reads is in neither (its CPU is in ``time.process_time`` only)."""
    task = Path("/proc/self/task")
    if not task.is_dir():
        return {}
    named = {t.native_id: t.name for t in threading.enumerate()}
    tick, main = os.sysconf("SC_CLK_TCK"), os.getpid()
    out = {}
    for entry in task.iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the thread ended
            continue
        tid = int(entry.name)
        fields = stat[stat.rindex(")") + 2:].split()  # after the name, which may hold spaces
        kind = "main" if tid == main else named.get(tid, stat[stat.index("(") + 1:stat.rindex(")")])
        out[tid] = (kind.split("-")[0].strip() or kind, (int(fields[11]) + int(fields[12])) / tick)
    return out


@contextlib.contextmanager
def gc_frozen():
    """Python's cyclic garbage collector kept off the objects that exist on entry (``gc.freeze``). A
    full collection scans every object the process holds: ~375k once a train step is built, 140-230 ms
    on a 2-core host (2026-12-07), a pause that lands on whichever step is running (on several
    processes, every process waits for the one that paused). Frozen, a collection scans only the
    objects made since (~1 ms). Unfrozen on exit, so what became garbage in between is collected."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# XLA:CPU's threads that run a program: its compute pool and the executor that drives it (thread_cpu's kinds).
XLA_COMPUTE = ("tf_XLAEigen", "tf_XLAExecute")


def split_cores(device_kinds=XLA_COMPUTE) -> dict | None:
    """A CPU stand-in for an accelerator host: this process's cores split in two, XLA's threads that
    run programs (``device_kinds``) on the last core (the "device"), every other thread (the main
    thread's dispatch, an input pipeline's threads; threads started later inherit their starter's
    cores) on the others (the "host"). On a GPU host the model's work does not run on the cores
    that prepare and dispatch its input; on shared CPU cores every millisecond of host work is taken
    from the step, which an accelerator would not see. Linux only. Returns ``{"device": [cores],
    "host": [cores], "undo": function that puts every thread back}``, or None where it cannot be done
    (fewer than 2 cores, no ``/proc``)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or not Path("/proc/self/task").is_dir():
        return None
    device, host = {cores[-1]}, set(cores[:-1])
    for tid, (kind, _) in thread_cpu().items():
        with contextlib.suppress(OSError):  # the thread ended
            os.sched_setaffinity(tid, device if kind in device_kinds else host)

    def undo():
        for tid in thread_cpu():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, set(cores))

    return {"device": sorted(device), "host": sorted(host), "undo": undo}


def host_cpu() -> dict | None:
    """This host's CPU seconds so far, all cores together, from ``/proc/stat`` (None elsewhere):
    ``{"total", "idle", "steal", "process"}``, ``process`` this process's own (user + system, its
    waited-for children not included). Two reads give :func:`host_share`."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    ticks = [int(v) for v in fields[1:9]]
    times = os.times()
    return {"total": sum(ticks) / tick, "idle": (ticks[3] + ticks[4]) / tick, "steal": ticks[7] / tick,
            "process": times.user + times.system}


def host_share(before: dict | None, after: dict | None) -> dict | None:
    """Where the host's CPU went between two :func:`host_cpu` reads, as shares of all cores' time:
    ``steal`` (taken by the hypervisor: on a VM, what a neighbour on the same machine took),
    ``others`` (busy in other processes of this host) and ``this`` (this process). A quiet run has
    ``others`` near 0; ``steal`` is the VM's own noise, which no one on the host can stop."""
    if before is None or after is None:
        return None
    total = after["total"] - before["total"]
    if total <= 0:
        return None
    this = after["process"] - before["process"]
    busy = total - (after["idle"] - before["idle"]) - (after["steal"] - before["steal"])
    return {"steal": (after["steal"] - before["steal"]) / total, "others": max(busy - this, 0.0) / total,
            "this": this / total, "seconds": total / os.cpu_count()}


def spread(blocks) -> dict:
    """Where the spread of a block's time comes from, from :func:`time_blocks`' ``steps`` of one call
    (``[[seconds of each step] of each block]``, blocks of equal length ``n``):
    ``step_cv`` (all steps' std / mean), ``within_cv`` (the pooled std of steps about their block's
    mean, / mean), ``block_cv`` (the blocks' means' std / mean) and ``independent_block_cv =
    within_cv / sqrt(n)``, what ``block_cv`` would be if steps were independent: ``block_cv`` well
    above it says the load moves between blocks (drift; pairing adjacent blocks helps), near it that
    each step's jitter dominates (only more steps help); ``lag1``, the correlation of consecutive
    steps' deviations from their block's mean; ``p50`` / ``p99`` of the steps (s); ``tail_share``, the
    share of the time spent in steps above twice the median. Stds with ``ddof=1``."""
    x = np.asarray(blocks, np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"spread needs >= 2 blocks of >= 2 steps each, got shape {x.shape}")
    mean, means = x.mean(), x.mean(axis=1)
    dev = x - means[:, None]
    within = np.sqrt((dev ** 2).sum() / (x.size - x.shape[0]))
    lag1 = float((dev[:, 1:] * dev[:, :-1]).sum() / (dev ** 2).sum()) if (dev ** 2).sum() > 0 else 0.0
    return {"step_cv": float(x.std(ddof=1) / mean), "within_cv": float(within / mean),
            "block_cv": float(means.std(ddof=1) / mean),
            "independent_block_cv": float(within / mean / np.sqrt(x.shape[1])), "lag1": lag1,
            "p50": float(np.median(x)), "p99": float(np.percentile(x, 99)),
            "tail_share": float(x[x > 2 * np.median(x)].sum() / x.sum()), "blocks": int(x.shape[0]),
            "steps": int(x.shape[1])}


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
