"""Input overhead: what the trainer loses to its input, fed vs fixed batch (#61).

    python benchmarks/input.py [--cases autoencoder,denoiser,standin] [--tiers device,stream]
                               [--out results/input] [--check]

For each case, the real trainer (:func:`motionjax.train.train_and_evaluate`, a short run) fed by its
own input, and the same trainer fed one fixed batch (its first batch repeated: no input program
runs), alternating fed / fixed / fed / fixed in one process; the best of the runs of each:

- ``input_overhead = 1 - fed steps/s / fixed steps/s``: everything the input costs the step,
  the input program's device time included (a timer around ``next()`` misses it: asynchronous
  dispatch returns before the program runs);
- ``input_ms``: the input program alone (the feed's batch, waited for), and its share of the fixed
  step, ``input_share``; ``other = input_overhead - input_share``: host work, dispatch and syncs;
- ``host_ms`` p50 / p99: the trainer's period from one step's dispatch to the next, and
  ``dispatch_ms`` p50 / p99, the call of the train step itself (``summary.json``'s ``host``).

Cases: the headline autoencoder (``experiments/autoencoder.py``, Bandai when here), the DeepMimic
denoiser (``experiments/deepmimic_denoise.py``) and ``standin``, a small denoiser whose step takes
~5-10 ms on 2 CPU cores: a stand-in for a fast accelerator, where an input cost shows first.
``--check`` exits 1 when a case passes its threshold (:data:`THRESHOLDS`). Writes ``input.json``
and prints the table. Ratios within one run are what count on a shared machine.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import jax

import experiments
from benchmarks import measure
from motionjax import parallel, train
from motionjax.data import feed, pipeline
from motionjax.train import loop

# name: (config spec, steps per run, the figure checked, its threshold)
CASES = {
    "autoencoder": ("experiments/autoencoder.py:{corpus}", 60, "input_overhead", 0.02),
    "denoiser": ("experiments/deepmimic_denoise.py", 200, "input_overhead", 0.04),
    "standin": ("experiments/deepmimic_denoise.py:runlocal", 400, "other", 0.02),
}


def case_config(name: str, steps: int, tier: str):
    """The case's config trimmed to ``steps`` steps: one checkpoint, one validation evaluation (its
    time is not training time), no references, no clip video; ``tier``'s residency."""
    spec = CASES[name][0].format(corpus="bandai" if Path(experiments.load(
        "experiments/autoencoder.py:bandai").data.source).exists() else "deepmimic")
    c = experiments.load(spec)
    c.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, references=(),
                   progress_every=steps, log_every=10)
    c.train.best_metric = "validation/mpjpe"
    c.evals = {"heldout": dict(c.evals.heldout, splits=("validation",)),
               "final": dict(c.evals.final, splits=("validation",), references=(), by_label=False,
                             inputs=("clean",))}
    if name == "standin":  # a small model on a full batch: a step of a few ms
        c.data.batch_size = 16
        c.train.update(warmup_steps=10)
    if "input_check_steps" in c.train:
        c.train.input_check_steps = 0  # the trainer's own fed/fixed stretch: measured here instead
    c.data.residency = tier
    return c


@contextlib.contextmanager
def fixed_batch():
    """Within it, the trainer is fed its first batch again and again (an iterator that is no feed, so
    it takes the plain step: the input program never runs)."""
    make = loop.make_iterator

    def repeat(config, info, mesh):
        it = make(config, info, mesh)
        batch = jax.block_until_ready(next(it))
        if hasattr(it, "close"):
            it.close()
        return itertools.repeat(batch)

    loop.make_iterator = repeat
    try:
        yield
    finally:
        loop.make_iterator = make


def one_run(config, workdir: Path, fixed: bool) -> dict:
    shutil.rmtree(workdir, ignore_errors=True)
    with fixed_batch() if fixed else contextlib.nullcontext():
        s = train.train_and_evaluate(config, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"steps_per_s": s["steps_per_s"], "compile_s": s["compile_s"], "host": s.get("host")}


def input_ms(config) -> float:
    """The input program alone: the feed's next batch, waited for (median of 20)."""
    info = pipeline.dataset_info(config.data)
    it = feed.Feed(config.data, info, parallel.make_mesh(config.mesh), train.batch_keys(config),
                   seed=config.seed, mode=config.data.residency)
    try:
        return 1e3 * measure.time_call(lambda: next(it), repeats=20, warmup=3)
    finally:
        it.close()


def compare(name: str, tier: str, out: Path, rounds: int = 2, log=print, steps: int | None = None) -> dict:
    """Fed and fixed trainer runs of case ``name``, alternating, ``rounds`` of each; the best of each."""
    steps = steps or CASES[name][1]
    config = case_config(name, steps, tier)
    runs = {"fed": [], "fixed": []}
    for r in range(rounds):
        for kind in ("fed", "fixed"):
            t = time.perf_counter()
            runs[kind].append(one_run(config, out / "runs" / f"{name}_{tier}_{kind}", kind == "fixed"))
            log(f"input: {name}/{tier} {kind} run {r + 1}: {runs[kind][-1]['steps_per_s']:.2f} steps/s "
                f"({time.perf_counter() - t:.0f} s)")
    best = {k: max(runs[k], key=lambda x: x["steps_per_s"]) for k in runs}
    fed, fixed = best["fed"]["steps_per_s"], best["fixed"]["steps_per_s"]
    row = {"config": config.data.dir, "steps": steps, "batch": config.data.batch_size,
           "fed_steps_per_s": fed, "fixed_steps_per_s": fixed, "input_overhead": 1 - fed / fixed,
           "fixed_step_ms": 1e3 / fixed, "input_ms": input_ms(config), "host": best["fed"]["host"],
           "fixed_host": best["fixed"]["host"], "compile_s": best["fed"]["compile_s"], "runs": runs}
    row["input_share"] = row["input_ms"] / row["fixed_step_ms"]
    row["other"] = row["input_overhead"] - row["input_share"]
    figure, threshold = CASES[name][2:]
    row["check"] = {"figure": figure, "threshold": threshold, "ok": row[figure] <= threshold}
    return row


def run(cases=tuple(CASES), tiers=("device",), out: Path = Path("results/input"), rounds: int = 2,
        log=print, steps: int | None = None) -> dict:
    """Every case x tier (:func:`compare`; ``steps``: every run's, default the case's own)."""
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "backend": jax.default_backend(),
              "cores": len(os.sched_getaffinity(0)), "rounds": rounds, "rows": {}}
    for name in cases:
        for tier in tiers:
            result["rows"][f"{name}/{tier}"] = compare(name, tier, out, rounds, log, steps)
    result["ok"] = all(r["check"]["ok"] for r in result["rows"].values())
    return result


def _ms(host: dict | None, key: str) -> str:
    return "-" if not host else f"{host[f'{key}_p50']:.2f} / {host[f'{key}_p99']:.2f}"


def markdown(result: dict) -> str:
    lines = [f"Input overhead, fed vs fixed batch, best of {result['rounds']} alternating trainer runs "
             f"({result['backend']}, {result['cores']} cores, {result['date']})", "",
             "| case / tier | fed steps/s | fixed steps/s | **input overhead** | input program ms (share) "
             "| other | host ms p50 / p99 | dispatch ms p50 / p99 | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, r in result["rows"].items():
        c = r["check"]
        lines.append(f"| {key} | {r['fed_steps_per_s']:.2f} | {r['fixed_steps_per_s']:.2f} | "
                     f"**{100 * r['input_overhead']:.1f}%** | {r['input_ms']:.2f} "
                     f"({100 * r['input_share']:.1f}%) | {100 * r['other']:.1f}% "
                     f"| {_ms(r['host'], 'host_ms')} "
                     f"| {_ms(r['host'], 'dispatch_ms')} | {c['figure']} <= {100 * c['threshold']:.0f}%: "
                     f"{'ok' if c['ok'] else 'PASSED'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    p.add_argument("--tiers", default="device", help="device,stream")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="results/input")
    p.add_argument("--check", action="store_true", help="exit 1 when a case passes its threshold")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args.cases.split(","), args.tiers.split(","), out, args.rounds)
    result["command"] = " ".join(["python", "benchmarks/input.py", *(sys.argv[1:] if argv is None else argv)])
    (out / "input.json").write_text(json.dumps(result, indent=2))
    print(markdown(result), flush=True)
    return 0 if result["ok"] or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
