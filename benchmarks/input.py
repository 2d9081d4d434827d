"""Input overhead: what the trainer loses to its input, fed vs fixed batch (#61).

    python benchmarks/input.py [--cases autoencoder,denoiser,standin] [--tiers device,stream]
                               [--rounds 20] [--out results/input] [--check] [--all-arms]
                               [--design auto|blocks|interleaved] [--split]
    python benchmarks/input.py --pool RUN1/input.json RUN2/input.json ...   (figures of runs pooled)

For each case and residency tier, in one process:

1. a short run of the real trainer (:func:`motionjax.train.train_and_evaluate`): its steps/s and the
   host's milliseconds per step, p50 / p99, from one step's dispatch to the next (``host_ms``) and
   the call of the step itself (``dispatch_ms``);
2. the train step fed several ways, ``--rounds`` rounds (each figure from the mean over rounds with its
   95% interval over rounds, :func:`motionjax.timing.overhead`): on the resident tier each round
   interleaves the ways step by step, one step of each a cycle in a random order
   (:func:`motionjax.timing.time_interleaved`); on the streamed tier (a Grain thread would prefetch
   during the other ways' steps) each round is a block of steps of each way, in a random order
   (:func:`motionjax.timing.time_blocks`); ``--design`` overrides:
   ``fixed``, one batch again and again (no input program runs); ``fed``, the trainer's way now,
   the feed's input program inside the step (one program a step); ``fixed_again``, the ``fixed`` call
   timed as its own arm: its figure against ``fixed``, ``null``, is 0 but for the measurement's
   noise, so its interval is the run's resolution, the width any figure of the run is read against;
   ``input``, the input program alone (``input_ms``; its share of the fixed step, ``input_share``).
   ``input_overhead = 1 - fed steps/s / fixed steps/s`` counts the input program's device time,
   which a timer around ``next()`` misses (asynchronous dispatch returns before it runs).
   Each figure is from wall time (:data:`ESTIMATOR`) and, beside it, from this process's CPU time per
   step (``*_cpu``: on a CPU backend the device's work and every host thread's, which other processes
   on a shared host stretch less; its null interval is narrower, but it cannot see a step that waits
   for its input: ``utilization``, each arm's CPU seconds per wall second, shows such waits);
   ``spread``: each arm's per-step times taken apart (:func:`motionjax.timing.spread`: per-step
   jitter against drift between blocks); ``cpu_ms_by_thread``: CPU per step by thread kind (XLA's
   compute threads ``tf_XLAEigen``, the ``main`` thread's dispatch, the stream tier's Grain threads);
3. for the stand-in (and with ``--split`` or ``--all-arms``, for every case), the overhead split in
   two: ``other``, everything but the input's compute (host work, dispatch, syncs), is ``fed_fixed``
   (the trainer's fed step, its host path and its program's arguments all as ``fed``'s, but the
   program takes the fixed batch instead of drawing one) against ``fixed``; ``input_in_step``, the
   input's compute as it runs inside the step, is ``fed`` against ``fed_fixed``;
   ``other_by_subtraction = input_overhead - input_share``.
   ``--all-arms`` also times ``separate`` (the input as its own program before each step,
   ``separate_overhead``) and ``before`` / ``before_fixed`` (the trainer of before #61: its own program
   and each step's metrics read one step late, ``before_overhead``): each arm more is fewer rounds of
   the ones the check reads in the same time.

The streamed tier's host cache is filled before anything is timed (:func:`warm_host_cache`): the
figures are a long run's steady state, as compilation is left out; the warm-up's batches and the
cache's hits are in the row (``host_cache_warmup``, ``host_cache``).

Cases: the headline autoencoder (``experiments/autoencoder.py``, its default corpus), the DeepMimic
denoiser (``experiments/deepmimic_denoise.py``) and ``standin``, a small denoiser (the ``runlocal``
variant at width 64, kernel 9, 16 windows) whose step takes ~6-10 ms: a stand-in for a fast
accelerator, where an input cost shows first; its figure is ``other``, what the fed step's host
path costs over the fixed step's (everything but the input's compute). Since 2026-12-07 23:30 UTC it runs on
split cores (:func:`motionjax.timing.split_cores`): XLA's program threads on one core, the host's
threads (dispatch, Grain) on the others, as a GPU host's model does not run on the cores that feed
it; on shared cores (``--shared-cores``, the design before) each host millisecond is taken from the
step, a contention an accelerator does not have (docs/input.md, fifteenth pass).
``--check`` exits 1 when a case's figure (the chosen estimator's mean) passes its threshold
(:data:`CASES`); the row's ``check`` also says whether the interval decided it (``decided``) and the
null arm's half-width (``resolution``). Writes ``input.json`` (every step's seconds apart, in
``input_steps.json``), with the host's CPU outside this process during the timed blocks (other
processes, the VM's steal: :func:`motionjax.timing.host_share`), and prints the table. Ratios within
one process are what count on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from motionjax import configs, parallel, timing, train
from motionjax.data import feed, pipeline
from motionjax.train import loop

# A 10-step block moves +-10-15% between rounds on a shared 2-core VM (docs/input.md): 20 rounds of the
# three arms the check reads cost what 10 of the six arms of before did; the quiet run needs ~45.
ROUNDS = 20

# name: (config spec, trainer steps, steps per timed block, the figure checked, its threshold)
CASES = {
    "autoencoder": ("experiments/autoencoder.py", 30, 10, "input_overhead", 0.02),  # the headline corpus
    "denoiser": ("experiments/deepmimic_denoise.py", 100, 25, "input_overhead", 0.04),
    "standin": ("experiments/deepmimic_denoise.py:runlocal", 300, 60, "other", 0.02),
}


def case_config(name: str, steps: int, tier: str):
    """The case's config trimmed to ``steps`` steps: one checkpoint, one validation evaluation (its
    time is not training time), no references, no input check (measured here); ``tier``'s residency."""
    c = configs.load(CASES[name][0])
    c.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, references=(),
                   progress_every=steps, log_every=10)
    c.train.best_metric = "validation/mpjpe"
    c.evals = {"heldout": dict(c.evals.heldout, splits=("validation",)),
               "final": dict(c.evals.final, splits=("validation",), references=(), by_label=False,
                             inputs=("clean",))}
    if name == "standin":  # a small model: a step of 5-10 ms (5.8-6.3 on split cores, 2026-12-07)
        # runlocal's width 16 / kernel 3 stepped in 3.5-5.0 ms on the quiet host, below that range, where
        # the fixed costs per step weigh more than the issue intends; width 64, kernel 9: 1.8-1.9x that
        # (alternating, docs/input.md), ~7 ms quiet.
        c.data.batch_size = 16
        c.model.update(dim=64, kernel=9)
        c.train.update(warmup_steps=10)
    c.train.input_check_steps = 0  # the trainer's own fed / fixed blocks: measured here instead
    c.data.residency = tier
    return c


def trainer_run(config, workdir: Path) -> dict:
    """A short run of the real trainer: steps/s, host wait and host ms per step (its summary)."""
    shutil.rmtree(workdir, ignore_errors=True)
    s = train.train_and_evaluate(config, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    return {k: s.get(k) for k in ("steps_per_s", "compile_s", "host_wait_fraction", "host")}


def read_late(call):
    """``call`` with the metrics of the step before read to the host after each dispatch (the loop of
    before #61: one step of lookahead)."""
    held = []

    def f(state):
        state, metrics, *rest = call(state)
        if held:
            jax.device_get(held.pop())
        held.append(metrics)
        return state, metrics, *rest

    return f


class FixedDraw:
    """A feed for :meth:`Step.fed` whose program takes ``batch`` instead of drawing one: the fed step's
    host path (the feed's ``inputs()``, the step counter, the same arguments and one more) without the
    input's compute."""

    def __init__(self, it, batch):
        self.it, self.batch = it, batch

    @property
    def served(self) -> int:
        return self.it.served

    def inputs(self) -> tuple:
        return (*self.it.inputs(), self.batch)

    def draw(self, counter, *inputs):
        return inputs[-1]


def warm_host_cache(it, block: int = 50, most: int = 2000) -> dict | None:
    """The streamed tier: the feed's host cache warmed (:func:`motionjax.data.feed.warm_host_cache`), so
    the timed blocks see the steady state a training run reaches after its first few hundred steps
    (Bandai-2: ~150 batches), as compilation is left out by warming each way first. Returns the cache's
    statistics with the batches drawn, or None where the cache is not in this process (the resident
    tier; Grain workers)."""
    if it.stats() is None:
        return None
    drawn = feed.warm_host_cache(it.inputs, it.stats, block, most)
    return dict(it.stats(), batches=drawn)


# Each figure: (the arm, what it is against). ``null``: the fixed step timed again as its own arm, the
# measurement's resolution in the same run (its true value is 0).
FIGURES = {"input_overhead": ("fed", "fixed"), "null": ("fixed_again", "fixed"),
           "other": ("fed_fixed", "fixed"), "input_in_step": ("fed", "fed_fixed"),
           "separate_overhead": ("separate", "fixed"), "before_overhead": ("before", "before_fixed")}
# The estimator the figures and the check use: "wall", steps/s as the issue defines the overhead, or
# "cpu", this process's CPU time per step (on a CPU backend the device's work and every host thread's).
# The CPU figure's null interval was the narrower (docs/input.md, ninth pass: 0.65x under load, 0.8-0.9x
# quiet) but it cannot see a wait: a step that idles the cores for its input (a host wait for Grain, a
# sync) costs wall time and no CPU. So the check reads wall time; both figures are in the row, and each
# arm's CPU seconds per wall second (``utilization``) says whether the fed step idles the cores more.
ESTIMATOR = "wall"
# How each tier's arms are timed ("auto"). The resident tier's input runs inside the step (no thread off
# the main one): its arms are interleaved step by step (timing.time_interleaved), every arm's steps of a
# round sharing that round's load moment by moment; in blocks, the load's drift between blocks made most
# of the spread (docs/input.md: the resident row's null spanned 6.8 points in the tenth pass's quiet run).
# The streamed tier's Grain thread would prefetch during the other arms' steps if interleaved, hiding
# its cost: blocks of each arm.
DESIGNS = {"device": "interleaved", "stream": "blocks"}


def compare(name: str, tier: str, out: Path, rounds: int = ROUNDS, log=print,
            steps: int | None = None, all_arms: bool = False, design: str = "auto",
            split: bool = False, shared_cores: bool = False) -> dict:
    """Case ``name`` on ``tier``: a trainer run, then the arms its check needs (``fixed``, its null
    ``fixed_again``, ``fed``; ``fed_fixed`` for the stand-in's ``other``, and for every case with
    ``split``), the input program alone, and with ``all_arms`` the diagnostic ones (``fed_fixed``,
    ``separate``, ``before``), round-robin in a random order each round (``design``: :data:`DESIGNS`).
    The stand-in runs on split cores (:func:`motionjax.timing.split_cores`) unless ``shared_cores``."""
    spec, trainer_steps, block, figure, threshold = CASES[name]
    config = case_config(name, steps or trainer_steps, tier)
    t = time.perf_counter()
    # The stand-in for an accelerator host: XLA's program threads on a core of their own, the host's
    # threads (dispatch, Grain) on the other (timing.split_cores).
    cores = None
    if name == "standin" and not shared_cores:
        jax.block_until_ready(jnp.ones(2) + 1)  # XLA's threads exist once a program ran
        cores = timing.split_cores()
    row = {"config": spec, "data": config.data.dir, "batch": config.data.batch_size,
           "window": config.data.window,
           "cores": {k: cores[k] for k in ("device", "host")} if cores else "shared"}
    try:
        row["trainer"] = trainer_run(config, out / "runs" / f"{name}_{tier}")
        log(f"input: {name}/{tier}: trainer {row['trainer']['steps_per_s']:.2f} steps/s "
            f"({time.perf_counter() - t:.0f} s)")
        _measure(row, name, tier, config, rounds, block, all_arms, design, split, figure, cores)
    finally:
        if cores:
            cores["undo"]()
    lo, hi = row[f"{figure}_interval"]
    null_lo, null_hi = row["null_interval"]
    # "decided": the interval is on one side of the threshold; "resolution": the null arm's half-width.
    row["check"] = {"figure": figure, "threshold": threshold, "estimator": ESTIMATOR,
                    "ok": row[figure] <= threshold, "decided": hi <= threshold or lo > threshold,
                    "resolution": (null_hi - null_lo) / 2}
    log(f"input: {name}/{tier}: overhead {_pct(row, 'input_overhead')} ({ESTIMATOR}; CPU time "
        f"{_pct(row, 'input_overhead', 'cpu')}), null {_pct(row, 'null')}, fixed step "
        f"{row['fixed_step_ms']:.1f} ms ({time.perf_counter() - t:.0f} s){_host(row)}")
    for arm in ("fixed", "fed_fixed", "fed"):
        if arm in row["cpu_ms_by_thread"]:
            log(f"input: {name}/{tier}: {arm}: CPU ms a step by thread " + ", ".join(
                f"{kind} {ms:.1f}" for kind, ms in row["cpu_ms_by_thread"][arm].items()))
    return row


def _measure(row, name, tier, config, rounds, block, all_arms, design, split, figure, cores):
    """:func:`compare`'s timed arms into ``row``."""
    info, mesh = pipeline.dataset_info(config.data), parallel.make_mesh(config.mesh)
    step, state, _, _ = train.build_train_step(config, info, mesh)
    # As the trainer: the stream tier's workers chosen against this step's measured time (not the
    # 4 ms default for an unknown step, which a cold host cache on a loaded host passes).
    it = loop.make_iterator(config, info, mesh, step_ms=loop.step_timer(config, info, mesh, step, state))
    try:
        row["host_cache_warmup"] = warm_host_cache(it)
        fixed_batch = jax.block_until_ready(next(it))
        # "input": the input program alone, its batches in flight as the step's would be (the state
        # passes through untouched). "fixed_again": the same call as "fixed", timed as its own arm.
        calls = {"fixed": lambda s: (*step(s, fixed_batch), None),
                 "fixed_again": lambda s: (*step(s, fixed_batch), None), "fed": step.fed(it),
                 "input": lambda s: (s, next(it))}
        if all_arms or split or figure == "other":
            calls["fed_fixed"] = step.fed(FixedDraw(it, fixed_batch))
        if all_arms:
            calls.update({"separate": lambda s: (*step(s, b := next(it)), b),
                          # The trainer before #61: the input as its own program, each step's metrics
                          # read (device_get) one step late; against the same loop on the fixed batch.
                          "before": read_late(lambda s: (*step(s, b := next(it)), b)),
                          "before_fixed": read_late(lambda s: (*step(s, fixed_batch), None))})
        cpu, threads, per_step = {}, {}, {}
        design = design if design != "auto" else DESIGNS[tier]
        if cores:  # again: threads the step's first runs started (each inherits its starter's cores)
            timing.split_cores()
        host = timing.host_cpu()
        with timing.gc_frozen():  # as the trainer's loop: no full collection's pause inside a block
            seconds = _time(calls, state, design, block, rounds, cpu, threads, per_step)
        # Was it quiet? The host's CPU outside this process (other processes; the VM's steal).
        row["host_share"] = timing.host_share(host, timing.host_cpu())
        row["host_cache"] = it.stats()  # after the timed blocks: their hits
    finally:
        it.close()
    rate = {k: len(v) / sum(v) for k, v in seconds.items()}
    row["input_ms"] = 1e3 / rate.pop("input")
    row.update({f"{k}_steps_per_s": v for k, v in rate.items()}, block=block, seconds=seconds, cpu_s=cpu,
               step_s={k: v for k, v in per_step.items() if k != "input"})
    timed = ({"cycles": block, "order": "each cycle one step of each arm, in a random order (seed 0)"}
             if design == "interleaved" else {"block": block, "order": "random each round (seed 0)"})
    row["design"] = {"design": design, "arms": list(calls), "estimator": ESTIMATOR, "rounds": rounds,
                     "read_lag": 2, **timed}
    row["cpu_ms"] = {k: 1e3 * statistics.mean(v) for k, v in cpu.items()}
    row["utilization"] = {k: sum(cpu[k]) / sum(v) for k, v in seconds.items()}
    # Whose CPU that is, per step (XLA's compute threads, the main thread's dispatch, the stream
    # tier's Grain threads): where a fed step's extra cost over the fixed one is spent.
    row["cpu_ms_by_thread"] = {k: {kind: 1e3 * v for kind, v in sorted(t.items(), key=lambda kv: -kv[1])
                                   if v > 0} for k, t in threads.items()}
    # Where the blocks' spread comes from (per-step jitter or drift between blocks): timing.spread.
    row["spread"] = {k: timing.spread(v) for k, v in row["step_s"].items()}
    # Each figure from the mean over rounds with its 95% interval over rounds (timing.overhead), from
    # wall time (the estimator of the eighth pass and before) and CPU time; the chosen one unsuffixed.
    for key, (arm, base) in FIGURES.items():
        if arm in calls and base in calls:
            both = {"wall": timing.overhead(seconds, arm, base), "cpu": timing.overhead(cpu, arm, base)}
            for kind, cost in both.items():
                row[f"{key}_{kind}"] = dict(cost, interval=[cost["lo"], cost["hi"]])
            row[key], row[f"{key}_best"] = both[ESTIMATOR]["value"], both["wall"]["best"]
            row[f"{key}_interval"] = [both[ESTIMATOR]["lo"], both[ESTIMATOR]["hi"]]
    row["fixed_step_ms"] = 1e3 / rate["fixed"]
    row["input_share"] = row["input_ms"] / row["fixed_step_ms"]
    row["other_by_subtraction"] = row["input_overhead"] - row["input_share"]


def _time(calls, state, design, block, rounds, cpu, threads, per_step) -> dict:
    """Seconds per step of each arm (``design``: interleaved step by step, or blocks)."""
    if design == "interleaved":  # no CPU by thread: a thread's ticks cannot be split between steps
        steps_only = {k: v for k, v in calls.items() if k != "input"}
        seconds = timing.time_interleaved(steps_only, jax.tree.map(jnp.copy, state), block, rounds,
                                          cpu=cpu, steps=per_step, shuffle=0)
        # The input program alone does not take the state: between steps it could run beside the step
        # before it, so its time is not one step's mark to the next. Timed in blocks of its own.
        seconds.update(timing.time_blocks({"input": calls["input"]}, state, block, rounds, cpu=cpu))
        return seconds
    return timing.time_blocks(calls, jax.tree.map(jnp.copy, state), block, rounds, cpu=cpu,
                              threads=threads, steps=per_step, shuffle=0)


def run(cases=tuple(CASES), tiers=("device",), out: Path = Path("results/input"), rounds: int = ROUNDS,
        log=print, steps: int | None = None, all_arms: bool = False, design: str = "auto",
        split: bool = False, shared_cores: bool = False) -> dict:
    """Every case x tier (:func:`compare`; ``steps``: the trainer runs', default each case's own)."""
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "backend": jax.default_backend(),
              "cores": len(os.sched_getaffinity(0)), "rounds": rounds, "estimator": ESTIMATOR, "rows": {}}
    for name in cases:
        for tier in tiers:
            result["rows"][f"{name}/{tier}"] = compare(name, tier, out, rounds, log, steps, all_arms, design,
                                                       split, shared_cores)
    result["ok"] = all(r["check"]["ok"] for r in result["rows"].values())
    return result


def _host(row: dict) -> str:
    share = row.get("host_share")
    return "" if not share else (f"; the host's cores meanwhile: {100 * share['others']:.1f}% other "
                                 f"processes, {100 * share['steal']:.1f}% stolen by the hypervisor")


def _ms(host: dict | None, key: str) -> str:
    return "-" if not host else f"{host[f'{key}_p50']:.2f} / {host[f'{key}_p99']:.2f}"


def _pct(row: dict, key: str, kind: str | None = None) -> str:
    """``key``'s figure [interval] in %: the chosen estimator's, or ``kind``'s ("wall", "cpu")."""
    if f"{key}_interval" not in row:
        return "-"
    value, (lo, hi) = ((row[key], row[f"{key}_interval"]) if kind is None
                       else (row[f"{key}_{kind}"]["value"], row[f"{key}_{kind}"]["interval"]))
    return _span(value, lo, hi)


def _span(value: float, lo: float, hi: float) -> str:
    return f"{100 * value:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _design(row: dict) -> str:
    d = row.get("design", {})
    if d.get("design") == "interleaved":
        return f"each round {d['cycles']} cycles of one step of each arm in a random order (interleaved)"
    return f"each round a block of {d.get('block', row.get('block'))} steps of each arm in a random order"


def markdown(result: dict) -> str:
    kind = result.get("estimator", ESTIMATOR)
    other = "cpu" if kind == "wall" else "wall"
    lines = [f"Input overhead: fed vs fixed batch, {result['rounds']} rounds in one process (each row's "
             f"design below); {kind} time per step, mean over rounds [95% interval over rounds]; "
             f"null: the fixed step timed again as its own arm, the run's resolution ({result['backend']}, "
             f"{result['cores']} cores, {result['date']})", "",
             f"| case / tier | fixed step ms | **input overhead** ({kind}) | null ({kind}) | input overhead "
             f"({other}) | null ({other}) | of which the input's compute | other (host, dispatch, syncs) "
             "| input program alone ms (share; other by subtraction) | input as its own program | before #61 "
             "| trainer steps/s | host ms p50 / p99 | dispatch ms p50 / p99 | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in result["rows"].items():
        c, host = r["check"], r["trainer"]["host"]
        verdict = ("ok" if c["ok"] else "NOT MET") + ("" if c.get("decided", True) else " (undecided)")
        cells = [key, f"{r['fixed_step_ms']:.2f}", f"**{_pct(r, 'input_overhead')}**", _pct(r, "null"),
                 _pct(r, "input_overhead", other), _pct(r, "null", other), _pct(r, "input_in_step"),
                 _pct(r, "other"),
                 f"{r['input_ms']:.2f} ({100 * r['input_share']:.1f}%; "
                 f"{100 * r['other_by_subtraction']:.1f}%)", _pct(r, "separate_overhead"),
                 _pct(r, "before_overhead"), f"{r['trainer']['steps_per_s']:.2f}", _ms(host, "host_ms"),
                 _ms(host, "dispatch_ms"), f"{c['figure']} <= {100 * c['threshold']:.0f}%: {verdict}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"{key}: {_design(r)}{_host(r) or '; no /proc/stat'}"
                    for key, r in result["rows"].items())]
    return "\n".join(lines)


def pool(paths) -> dict:
    """Each row's figures with the rounds of several runs' ``input.json`` pooled (a round of each run as
    one round of the pool: :func:`motionjax.timing.overhead` over them all), beside each run's own:
    ``{row: {figure: {"pooled": cost, "runs": [cost of each run]}}}``. Rounds share a run's process
    and its compiled programs; a run's own effect (memory placement, the VM's state that hour) is
    not in the pooled interval: the runs' spread beside it shows whether there is one."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = {}
    for key in sorted(set.intersection(*(set(r["rows"]) for r in runs))):
        rows = [r["rows"][key] for r in runs]
        figures = out.setdefault(key, {})
        for figure, (arm, base) in FIGURES.items():
            if all(arm in r["seconds"] and base in r["seconds"] for r in rows):
                both = {k: [x for r in rows for x in r["seconds"][k]] for k in (arm, base)}
                figures[figure] = {"pooled": timing.overhead(both, arm, base),
                                   "runs": [timing.overhead(r["seconds"], arm, base) for r in rows],
                                   "designs": [r.get("design", {}).get("design", "blocks") for r in rows]}
    return out


def _pool_table(pooled: dict, paths) -> str:
    lines = [f"Pooled over {len(paths)} runs ({', '.join(map(str, paths))}); wall time, mean over rounds "
             "[95% interval over rounds]", "", "| row | figure | pooled | each run |", "|---|---|---|---|"]
    for key, figures in pooled.items():
        for figure, cost in figures.items():
            runs = "; ".join(f"{_span(c['value'], c['lo'], c['hi'])} ({c['rounds']} rounds, {design})"
                             for c, design in zip(cost["runs"], cost["designs"], strict=True))
            both = cost["pooled"]
            lines.append(f"| {key} | {figure} | **{_span(both['value'], both['lo'], both['hi'])}** "
                         f"({both['rounds']} rounds) | {runs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from motionjax import malloc

    malloc.configure()  # the trainer's allocator (motionjax train sets it up first; it may re-execute)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    p.add_argument("--tiers", default="device", help="device,stream")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="timed blocks of each way to feed the step")
    p.add_argument("--steps", type=int, default=None, help="steps of each trainer run (default: the case's)")
    p.add_argument("--out", default="results/input")
    p.add_argument("--check", action="store_true", help="exit 1 when a case passes its threshold")
    p.add_argument("--all-arms", action="store_true",
                   help="also time the diagnostic arms (fed_fixed, separate, before): fewer rounds a minute")
    p.add_argument("--split", action="store_true",
                   help="also time fed_fixed for every case: the overhead split into the input's compute "
                        "in the step and everything else (one arm more a cycle)")
    p.add_argument("--design", default="auto", choices=("auto", "blocks", "interleaved"),
                   help="how the arms are timed (auto: interleaved step by step on the resident tier, "
                        "blocks on the streamed one)")
    p.add_argument("--shared-cores", action="store_true",
                   help="run the stand-in on every core, its XLA threads beside the host's (before "
                        "2026-12-07 23:30 UTC); by default XLA's program threads get a core of their own")
    p.add_argument("--pool", nargs="+", metavar="INPUT_JSON",
                   help="measure nothing: print each row's figures with these runs' rounds pooled")
    args = p.parse_args(argv)
    if args.pool:
        print(_pool_table(pool(args.pool), args.pool))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args.cases.split(","), args.tiers.split(","), out, args.rounds, steps=args.steps,
                 all_arms=args.all_arms, design=args.design, split=args.split,
                 shared_cores=args.shared_cores)
    result["command"] = " ".join(["python", "benchmarks/input.py", *(sys.argv[1:] if argv is None else argv)])
    # Every step's seconds apart (a few MB at 45 rounds): the summary keeps their spread (timing.spread).
    steps = {key: row.pop("step_s") for key, row in result["rows"].items()}
    (out / "input_steps.json").write_text(json.dumps(steps))
    (out / "input.json").write_text(json.dumps(result, indent=2))
    print(markdown(result), flush=True)
    return 0 if result["ok"] or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
