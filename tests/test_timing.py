"""motionjax.timing.overhead: what one way of feeding a step costs over another, from blocks timed
round-robin, with an interval over rounds that covers the true cost."""
import os
import time

import numpy as np
import pytest

from motionjax import timing


def test_overhead_is_one_minus_the_ratio_of_mean_rates_and_best_is_the_best_blocks():
    seconds = {"fed": [0.21, 0.22, 0.20], "fixed": [0.20, 0.19, 0.21]}
    cost = timing.overhead(seconds, "fed")
    assert np.isclose(cost["value"], 1 - np.mean(seconds["fixed"]) / np.mean(seconds["fed"]))
    assert np.isclose(cost["best"], 1 - 0.19 / 0.20) and cost["rounds"] == 3
    assert cost["lo"] <= cost["value"] <= cost["hi"]


def test_interval_over_rounds_covers_a_known_cost_under_round_to_round_load():
    """A 3% cost under +-15% load that moves both blocks of a round alike plus 2% block noise: the
    95% interval over 10 rounds covers 3% in most of 200 simulated runs, and excludes 0 in most."""
    rng, true, covered, excludes_zero = np.random.default_rng(0), 0.03, 0, 0
    for _ in range(200):
        load = rng.uniform(0.85, 1.15, size=10)
        fixed = 0.2 * load * rng.normal(1, 0.02, size=10)
        fed = 0.2 / (1 - true) * load * rng.normal(1, 0.02, size=10)
        cost = timing.overhead({"fed": fed, "fixed": fixed}, "fed")
        covered += cost["lo"] <= true <= cost["hi"]
        excludes_zero += cost["lo"] > 0
    assert covered >= 0.85 * 200 and excludes_zero >= 0.6 * 200



def test_thread_cpu_names_the_thread_that_spent_it():
    """A thread that spins 0.3 s of its CPU reads ~0.3 s under its name (up to the first "-"), one
    that sleeps as long reads ~0; the main thread is "main". Linux only (``/proc``)."""
    import sys
    import threading
    import time

    if not sys.platform.startswith("linux"):
        assert timing.thread_cpu() == {}
        return
    seen = {}

    def spin():
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    def run(work):
        work()
        seen[threading.current_thread().name] = timing.thread_cpu()[threading.get_native_id()]

    threads = [threading.Thread(target=run, args=(spin,), name="spinner-1"),
               threading.Thread(target=run, args=(lambda: time.sleep(0.3),), name="sleeper-1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kind, used = seen["spinner-1"]
    assert kind == "spinner" and 0.25 <= used <= 1.0
    kind, used = seen["sleeper-1"]
    assert kind == "sleeper" and used <= 0.05
    assert "main" in {kind for kind, _ in timing.thread_cpu().values()}



def test_split_cores_puts_xlas_program_threads_on_a_core_of_their_own_and_undo_puts_them_back():
    """The stand-in for an accelerator host (benchmarks/input.py): after :func:`timing.split_cores`,
    XLA's compute and execute threads run on the last core only, the main thread, a Python thread and
    one started later on the others; a program still runs, its CPU in XLA's threads; ``undo`` gives
    every thread all the cores again."""
    import threading

    import jax
    import jax.numpy as jnp

    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if len(cores) < 2 or not os.path.isdir("/proc/self/task"):
        pytest.skip(f"needs Linux and 2 cores ({len(cores)} here)")
    x = jnp.ones((256, 256))
    jax.block_until_ready(x @ x)  # XLA's threads exist once a program ran
    stop = threading.Event()
    before = threading.Thread(target=stop.wait, name="early-1")
    before.start()
    split = timing.split_cores()
    after = threading.Thread(target=stop.wait, name="late-1")
    after.start()
    try:
        device, host = set(split["device"]), set(split["host"])
        assert device == {max(cores)} and host == cores - device
        kinds = {tid: kind for tid, (kind, _) in timing.thread_cpu().items()}
        xla = [tid for tid, kind in kinds.items() if kind in timing.XLA_COMPUTE]
        assert xla and all(os.sched_getaffinity(tid) == device for tid in xla), kinds
        for thread in (before, after):
            assert os.sched_getaffinity(thread.native_id) == host
        assert os.sched_getaffinity(threading.get_native_id()) == host
        spent = {tid: used for tid, (_, used) in timing.thread_cpu().items()}
        a = np.random.default_rng(0).normal(size=(512, 512)).astype(np.float32)
        y = jax.jit(lambda a: jnp.tanh(a @ a / 23))
        for _ in range(40):
            out = y(a)
        np.testing.assert_allclose(np.asarray(out), np.tanh(a @ a / 23), atol=1e-4)
        grew = {kinds.get(tid, "new") for tid, (_, used) in timing.thread_cpu().items()
                if used - spent.get(tid, 0.0) > 0}
        assert grew & set(timing.XLA_COMPUTE), grew
    finally:
        split["undo"]()
        stop.set()
        before.join()
        after.join()
    assert all(os.sched_getaffinity(tid) == cores for tid in xla)
    assert os.sched_getaffinity(threading.get_native_id()) == cores


def test_time_blocks_puts_each_ways_cpu_on_the_thread_that_spent_it():
    """One way hands each step's work to a long-lived named thread (as an input pipeline's prefetch
    thread), the other does it on the main thread: the per-way breakdown shows the helper's CPU on
    the first way only, and about its work (20 ms a step)."""
    import queue
    import sys
    import threading
    import time

    if not sys.platform.startswith("linux"):
        return

    def spin(seconds=0.02):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    jobs, done = queue.Queue(), queue.Queue()

    def serve():
        while jobs.get() is not None:
            spin()
            done.put(True)

    helper = threading.Thread(target=serve, name="helper-0", daemon=True)
    helper.start()

    def helped(state):
        jobs.put(True)
        done.get()
        return (state + 1,)

    threads, cpu = {}, {}
    try:
        seconds = timing.time_blocks({"helped": helped, "main": lambda s: (spin() or s + 1,)}, 0, 10, 2,
                                     cpu=cpu, threads=threads)
    finally:
        jobs.put(None)
    assert set(seconds) == set(threads) == {"helped", "main"}
    assert 0.01 <= threads["helped"]["helper"] <= 0.05 and threads["main"].get("helper", 0) < 0.005
    assert 0.01 <= threads["main"]["main"] <= 0.05 and threads["helped"]["main"] < 0.01
    assert min(cpu["helped"]) >= 0.015 and min(cpu["main"]) >= 0.015  # the process's CPU counts both


def test_spread_matches_numpy_on_a_small_array():
    """Each figure against its numpy formula: pooled within-block std as the mean of the blocks' own
    variances (equal blocks), block cv from the blocks' means, lag-1 from the deviations' products."""
    rng = np.random.default_rng(1)
    x = rng.gamma(4.0, 0.05, size=(7, 5))
    s = timing.spread(x.tolist())
    mean = x.mean()
    assert np.isclose(s["step_cv"], np.std(x, ddof=1) / mean)
    assert np.isclose(s["within_cv"], np.sqrt(np.mean(np.var(x, axis=1, ddof=1))) / mean)
    assert np.isclose(s["block_cv"], np.std(x.mean(axis=1), ddof=1) / mean)
    assert np.isclose(s["independent_block_cv"], s["within_cv"] / np.sqrt(5))
    d = x - x.mean(axis=1, keepdims=True)
    assert np.isclose(s["lag1"], np.sum(d[:, 1:] * d[:, :-1]) / np.sum(d * d))
    assert np.isclose(s["p50"], np.median(x)) and np.isclose(s["p99"], np.percentile(x, 99))
    assert np.isclose(s["tail_share"], x[x > 2 * np.median(x)].sum() / x.sum())
    assert (s["blocks"], s["steps"]) == (7, 5)


def test_spread_tells_per_step_jitter_from_drift_between_blocks():
    """Independent steps: the blocks' cv is what the steps' jitter predicts (within 20%), lag-1 ~0.
    The same steps with a load that moves between blocks (+-10%): the blocks' cv well above it. Steps
    that follow each other (AR(1), 0.6): lag-1 clearly positive."""
    rng = np.random.default_rng(2)
    steps = 0.25 * (1 + 0.1 * rng.standard_normal((400, 10)))
    s = timing.spread(steps)
    assert abs(s["block_cv"] / s["independent_block_cv"] - 1) < 0.2 and abs(s["lag1"]) < 0.1
    drift = steps * rng.uniform(0.9, 1.1, size=(400, 1))
    d = timing.spread(drift)
    assert d["block_cv"] > 1.5 * d["independent_block_cv"]
    e = np.zeros((400, 10))
    for i in range(1, 10):
        e[:, i] = 0.6 * e[:, i - 1] + rng.standard_normal(400)
    assert timing.spread(1 + 0.05 * e)["lag1"] > 0.3


def test_spread_names_a_bad_shape():
    with pytest.raises(ValueError, match="shape"):
        timing.spread([[0.1, 0.2]])


def test_time_blocks_shuffles_the_order_each_round_and_records_each_step():
    """With ``shuffle`` the calls run in another order each round (each call first in some round), without
    it in ``calls``' order; ``steps`` holds each block's steps, which add up to the block's time. These
    calls finish before they return (no device queue), so with ``lag=0`` each step's time is its own."""
    import time

    ran = []

    def sleeper(name, seconds):
        def call(state):
            ran.append(name)
            time.sleep(seconds)
            return (state + 1, name)
        return call

    calls = {"a": sleeper("a", 0.004), "b": sleeper("b", 0.002), "c": sleeper("c", 0.002)}
    steps = {}
    seconds = timing.time_blocks(calls, 0, 3, 12, steps=steps, shuffle=0)
    timed = ran[3:]  # after the warm-up call of each
    firsts = {timed[9 * r] for r in range(12)}
    assert firsts == {"a", "b", "c"}
    for name in calls:
        assert len(steps[name]) == 12 and all(len(b) == 3 for b in steps[name])
        marked = np.array([sum(b) for b in steps[name]])  # from the block's start to its last mark
        assert np.all(marked <= 3 * np.array(seconds[name]) + 1e-9)
        assert marked.sum() >= 0.95 * 3 * sum(seconds[name])
    steps = {}
    timing.time_blocks(calls, 0, 3, 2, steps=steps, lag=0)
    assert min(min(b) for b in steps["a"]) >= 0.004
    assert np.median(steps["a"]) > 1.5 * np.median(steps["b"])  # 4 ms a step against 2 (a loaded host
    # stretches a sleep now and then: the median)
    ran.clear()
    timing.time_blocks(calls, 0, 2, 3)
    assert ran[3:] == ["a", "a", "b", "b", "c", "c"] * 3


def test_time_interleaved_runs_one_step_of_each_call_a_cycle_and_sees_through_drift():
    """Every cycle runs each call once (in its own order), a round is ``cycles`` cycles, and each call's
    steps are timed apart. The reference: sleepers (they finish before they return, so with ``lag=0``
    a step's time is its own) whose known ratio (b sleeps 1.25x a) rides on a load that drifts 2.5x
    from round to round: the interleaved rounds recover the ratio with a narrow interval, while blocks
    of one call each, whose load changes from one block to the next, cannot."""
    import time

    ran, rounds, cycles = [], 8, 4
    period = [3 * cycles + 1]  # calls between two changes of the load: here a round (its lead-in step too)

    def sleeper(name, seconds):
        def call(state):
            ran.append(name)
            timed = len(ran) - 4  # this call's index after the warm-up call of each
            load = 1.0 + 1.5 * ((max(timed, 0) // period[0]) % 2)  # every other period 2.5x slower
            time.sleep(seconds * load)
            return (state + 1, name)
        return call

    # 8-10 ms sleeps: a loaded host's scheduling jitter (~0.5 ms a wake-up) widened the interval of
    # 4-5 ms sleepers to 0.1005 once (the fresh clone of fdafef2, 2 pytest workers on 2 cores).
    calls = {"a": sleeper("a", 0.008), "b": sleeper("b", 0.010), "c": sleeper("c", 0.008)}
    steps = {}
    seconds = timing.time_interleaved(calls, 0, cycles, rounds, steps=steps, shuffle=1, lag=0)
    timed = [ran[3 + r * (3 * cycles + 1) + 1:3 + (r + 1) * (3 * cycles + 1)] for r in range(rounds)]
    assert len(ran) == 3 + rounds * (3 * cycles + 1)  # each round: a lead-in step, then its cycles
    for r in timed:
        for i in range(0, len(r), 3):
            assert sorted(r[i:i + 3]) == ["a", "b", "c"]  # one step of each a cycle
    assert len({tuple(r[i:i + 3]) for r in timed for i in range(0, len(r), 3)}) > 1  # in more than one order
    for name in calls:
        assert len(seconds[name]) == rounds and all(len(r) == cycles for r in steps[name])
    cost = timing.overhead(seconds, "b", "a")
    assert 0.12 < cost["value"] < 0.28  # 1 - 1 / 1.25 = 0.2
    assert cost["hi"] - cost["lo"] < 0.1
    ran.clear()
    period[0] = cycles  # blocks of one call each: the load changes between blocks
    blocks = timing.time_blocks(calls, 0, cycles, rounds, lag=0)
    assert np.ptp(np.array(blocks["b"]) / np.array(blocks["a"])) > 1.0  # 1.25 x 2.5 or / 2.5
    wide = timing.overhead(blocks, "b", "a")
    assert wide["hi"] - wide["lo"] > 2 * (cost["hi"] - cost["lo"])


def test_host_share_counts_this_process_and_sees_a_busy_neighbour():
    """Against the process's own clock and a child that spins: the shares add up, this process's share
    is its CPU over the cores' time, and a spinning child (another process) lands in ``others``."""
    import subprocess
    import sys

    first = timing.host_cpu()
    if first is None:
        pytest.skip("no /proc/stat on this system")
    end = time.process_time() + 0.5
    while time.process_time() < end:  # this process: ~0.5 CPU s
        pass
    mine = timing.host_share(first, timing.host_cpu())
    assert 0 <= mine["steal"] < 1 and 0 <= mine["others"] < 1
    assert mine["this"] == pytest.approx(0.5 / (mine["seconds"] * os.cpu_count()), rel=0.3)
    assert mine["this"] + mine["others"] + mine["steal"] <= 1 + 1e-9

    before = timing.host_cpu()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time() + 1.0\n"
                    "while time.process_time() < t: pass"], check=True)
    spun = timing.host_share(before, timing.host_cpu())
    # The child's ~1 CPU s is another process's (os.times' children are not in "process").
    assert spun["others"] * spun["seconds"] * os.cpu_count() > 0.6
    assert timing.host_share(None, before) is None


def test_gc_frozen_keeps_a_collection_off_the_objects_made_before_and_frees_later_garbage():
    """Inside :func:`timing.gc_frozen` a collection scans only what was made since: a cycle made
    before it and dropped inside outlives a ``gc.collect()`` there, one made and dropped inside does
    not; after it the first is collected too."""
    import gc
    import weakref

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    held = cycle()
    older = weakref.ref(held)
    with timing.gc_frozen():
        del held  # garbage now, but made before the freeze
        inside = weakref.ref(cycle())
        gc.collect()
        assert older() is not None and inside() is None
    gc.collect()
    assert older() is None
