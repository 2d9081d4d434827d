"""Time to target accuracy, MLPerf-style: train until validation error reaches a target, then stop.

A run is :func:`motionjax.train.train_and_evaluate` (the one training loop) with an ``on_eval``
hook: every ``train.eval_every`` steps it evaluates ``validation/mpjpe`` (root-relative MPJPE, cm;
clean input) and stops at the first evaluation at or below the target, or once the budget is
spent (``train.steps``, and optionally seconds). What is counted, as in MLPerf Training, is the
time from the first step to that evaluation, initialization aside (dataset preparation, building
the model, the evaluation windows, the step-0 checkpoint), split into

* ``compile_s``: the first (compiling) step;
* ``compute_s``: the other steps, the data wait taken out (``train_s - data_wait_s``);
* ``data_wait_s``: the host waiting for the next batch;
* ``eval_s``: the validation evaluations, the one that reached the target included;
* ``checkpoint_s``: the checkpoint saved at each evaluation (orbax writes asynchronously: this is
  the blocking part).

Convergence varies with the seed (initial weights, data order, noise), so every configuration
runs several seeds; a run that misses the target within its budget is reported as a miss and
counts as infinitely slow in the median, never dropped. :func:`compare` runs configurations side
by side, alternating them seed by seed (a change of load on a shared machine hits all alike).

The learning-rate schedule is the config's (``train.steps`` long, which is also the step budget):
stopping early at a target does not change what each step does.
"""
from __future__ import annotations

import copy
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import jax
import ml_collections
import numpy as np

from motionjax import train

METRIC = "validation/mpjpe"  # root-relative MPJPE (cm) on the validation split, clean input
SPLIT_KEYS = ("compile_s", "compute_s", "data_wait_s", "eval_s", "checkpoint_s")


def _plain(c):
    from experiments import baseline  # experiments/ sits next to the package (the repo root)
    return baseline.plain(c)


def _batch2x(c):
    """Twice the batch, the learning rate × √2 (the square-root rule for Adam), half the steps,
    warmup and evaluation interval: the same frames between evaluations and in the budget."""
    c.data.batch_size *= 2
    c.train.learning_rate *= math.sqrt(2)
    c.train.steps = max(c.train.steps // 2, 1)
    c.train.warmup_steps //= 2
    c.train.eval_every = max(c.train.eval_every // 2, 1)
    return c


def _toggle_dynamics_loss(c):
    """The dynamics loss off where the config has it on; on (weight 0.005, the DeepMimic default)
    where it is off."""
    c.loss.dynamics_weight = 0.0 if c.loss.dynamics_weight > 0 else 0.005
    return c


def _schedule_free_rate(factor: float):
    """Schedule-free AdamW at ``factor`` × the config's peak rate (its averaged iterate usually
    tolerates a higher one than a cosine schedule)."""
    def apply(c):
        c.train.optimizer = "schedule_free"
        c.train.learning_rate *= factor
        return c
    return apply


def _set(section: str, key: str, value):
    def apply(c):
        c[section][key] = value
        return c
    return apply


# Each lever: what it changes (for the table), and the change applied to the base config.
LEVERS: dict[str, tuple[str, Callable]] = {
    "optimized": ("the config as is", lambda c: c),
    "baseline": ("experiments/baseline.py: dense jacfwd, main-thread numpy loader, no prefetch, fp32",
                 _plain),
    "uniform": ("uniform window sampling (data.dynamics_sampling = 0)",
                _set("data", "dynamics_sampling", 0.0)),
    "batch2x": ("batch ×2, learning rate ×√2, half the steps (same frames)", _batch2x),
    "dynamics_loss": ("the dynamics loss toggled (off if on, 0.005 if off)", _toggle_dynamics_loss),
    "bf16": ("bfloat16 activations and compute (model.dtype)", _set("model", "dtype", "bfloat16")),
    "loss_aware": ("loss-aware sampling (data.loss_sampling = 0.5: half of each draw by the segment's "
                   "latest window error)", _set("data", "loss_sampling", 0.5)),
    "schedule_free": ("schedule-free AdamW (train.optimizer = 'schedule_free': the same warmup and "
                      "peak rate, no cosine; evaluation reads its averaged iterate)",
                      _set("train", "optimizer", "schedule_free")),
    "schedule_free_lr2x": ("schedule-free AdamW at twice the peak rate (the same warmup)",
                           _schedule_free_rate(2.0)),
    "schedule_free_lr4x": ("schedule-free AdamW at four times the peak rate (the same warmup)",
                           _schedule_free_rate(4.0)),
    "muon": ("Muon (train.optimizer = 'muon': every weight of rank ≥ 2 orthogonalized at AdamW's update "
             "RMS, the same rate, warmup + cosine)", _set("train", "optimizer", "muon")),
    "ema": ("a parameter EMA (train.ema_decay = 0.999), which evaluation reads",
            _set("train", "ema_decay", 0.999)),
    "adamw": ("AdamW + warmup-cosine (train.optimizer = 'adamw'), whatever the config's optimizer",
              _set("train", "optimizer", "adamw")),
}
DEFAULT_LEVERS = ("optimized", "baseline", "uniform", "batch2x", "dynamics_loss")


def variants(config: ml_collections.ConfigDict, levers, eval_every: int | None = None) -> dict:
    """``{lever: config}``: ``config`` with each lever applied (after ``eval_every``, if given, so a
    lever may scale it)."""
    out = {}
    for name in levers:
        if name not in LEVERS:
            raise ValueError(f"unknown lever {name!r}; expected one of {', '.join(LEVERS)}")
        c = copy.deepcopy(config)
        if eval_every:
            c.train.eval_every = eval_every
        out[name] = LEVERS[name][1](c)
    return out


def run_to_target(config: ml_collections.ConfigDict, workdir, target: float, *,
                  max_seconds: float | None = None, metric: str = METRIC) -> dict:
    """Train ``config`` from scratch in ``workdir`` until ``metric`` ≤ ``target`` (cm) at an
    evaluation, or ``train.steps``, or (``max_seconds``) the counted time is spent.

    Returns ``{"reached", "steps", "frames", "wall_s", <SPLIT_KEYS>, "curve", "final", "status"}``:
    the numbers at the stopping evaluation (to target if ``reached``, else at the end of the
    budget), ``curve`` every evaluation (step, frames, wall_s, value), ``final`` the root-relative
    MPJPE on every final split (``test`` included, evaluated once) of the checkpoint validation chose:
    the stopping one when the target was reached (every earlier evaluation was above it).
    """
    split = metric.split("/")[0]
    c = copy.deepcopy(config)
    c.evals.heldout.splits = (split,)
    c.train.best_metric = metric
    c.evals.final.splits = tuple(dict.fromkeys((split, "test")))
    c.train.checkpoint_every = c.train.eval_every  # a checkpoint with each evaluation, none between
    c.train.references = ()
    frames_per_step = c.data.batch_size * c.data.window
    curve = []

    def on_eval(step, metrics, timing):
        if metric not in metrics:
            raise KeyError(f"time_to_target: the evaluation has no {metric!r}; it has {sorted(metrics)}")
        wall = timing["compile_s"] + timing["train_s"] + timing["eval_s"] + timing["checkpoint_s"]
        point = {"step": step, "frames": step * frames_per_step, "wall_s": wall,
                 "value": float(metrics[metric]), **_split(timing)}
        curve.append(point)
        return point["value"] <= target or (max_seconds is not None and wall >= max_seconds)

    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, never a resumed one
    # Every run compiles its programs itself, as a fresh process would: without this, module-level
    # jitted functions (the evaluation metrics) compile in the first run of a process only.
    jax.clear_caches()
    summary = train.train_and_evaluate(c, workdir, on_eval=on_eval)
    if not curve:
        raise RuntimeError(f"time_to_target: {workdir} ended without an evaluation ({summary.get('status')})")
    last = curve[-1]
    results = summary.get("results", {})
    return {"reached": last["value"] <= target, **{k: last[k] for k in ("step", "frames", "wall_s")},
            **{k: last[k] for k in SPLIT_KEYS}, "value": last["value"], "curve": curve,
            "final": {f"{s}/mpjpe": results[s]["clean"]["model"]["mpjpe"] for s in c.evals.final.splits
                      if s in results},
            "status": summary["status"], "seed": c.seed}


def _split(timing: dict) -> dict:
    return {"compile_s": timing["compile_s"], "compute_s": timing["train_s"] - timing["host_wait_s"],
            "data_wait_s": timing["host_wait_s"], "eval_s": timing["eval_s"],
            "checkpoint_s": timing["checkpoint_s"]}


def summarize(runs: list[dict]) -> dict:
    """Median and spread over seeds. A miss counts as infinitely slow (so the median is ``inf``
    when at least half missed) and is excluded from the spread of the runs that reached."""
    hit = [r for r in runs if r["reached"]]
    median = lambda key: float(np.median([r[key] if r["reached"] else math.inf for r in runs]))
    spread = lambda key: [float(min(r[key] for r in hit)), float(max(r[key] for r in hit))] if hit else None
    out = {"runs": len(runs), "reached": len(hit)}
    for key in ("wall_s", "step", "frames"):
        out[key] = median(key)
        out[f"{key}_range"] = spread(key)
    # The time split of the median run (by wall time; misses at the end of their budget).
    order = sorted(runs, key=lambda r: (not r["reached"], r["wall_s"]))
    out["split"] = {k: order[(len(order) - 1) // 2][k] for k in SPLIT_KEYS}
    finals = {}
    for key in runs[0]["final"]:
        values = [r["final"][key] for r in runs]
        finals[key] = {"mean": float(np.mean(values)), "range": [float(min(values)), float(max(values))]}
    out["final"] = finals
    return out


def compare(configs: dict[str, ml_collections.ConfigDict], target: float, seeds, out, *,
            max_seconds: float | None = None, reference: str | None = None, metric: str = METRIC,
            log: Callable[[str], None] = print, on_run: Callable[[dict], None] | None = None,
            done: dict[str, list[dict]] | None = None, run_missing: bool = True) -> dict:
    """Every config of ``configs`` once per seed, alternating configs seed by seed; runs in
    ``out/runs/<name>/seed<N>``. Returns ``{"target", "seeds", "runs": {name: [run]},
    "summary": {name: summarize}, "ratios": {name: {"time", "steps"}}}``: ratios of the
    medians, ``name`` ÷ ``reference`` (the first config by default; > 1 = slower than it).
    ``on_run(runs)`` is called after every run with the runs so far (a long comparison that dies
    keeps what it measured). ``done``: runs measured before (``{name: [run]}``, e.g. from that
    record), reused for their seeds instead of run again; ``run_missing=False`` runs nothing new
    (the report of what ``done`` holds)."""
    out = Path(out)
    names = list(configs)
    reference = reference or names[0]
    runs = {name: [] for name in names}
    start = time.perf_counter()
    for seed in seeds:
        for name in names:
            before = [r for r in (done or {}).get(name, []) if r.get("seed") == int(seed)]
            if before:
                runs[name].append(before[0])
                continue
            if not run_missing:
                continue
            c = copy.deepcopy(configs[name])
            c.seed = int(seed)
            r = run_to_target(c, out / "runs" / name / f"seed{seed}", target, max_seconds=max_seconds,
                              metric=metric)
            runs[name].append(r)
            log(f"{name} seed {seed}: {'reached' if r['reached'] else 'MISSED'} {r['value']:.3f} cm at step "
                f"{r['step']}, {r['wall_s']:.1f} s counted ({time.perf_counter() - start:.0f} s elapsed)")
            if on_run is not None:
                on_run(runs)
    runs = {name: rs for name, rs in runs.items() if rs}
    if reference not in runs:
        raise ValueError(f"time_to_target: no run of the reference {reference!r}")
    summary = {name: summarize(rs) for name, rs in runs.items()}
    ratio = lambda a, b: a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else None
    ratios = {name: {key: ratio(s[k], summary[reference][k])
                     for key, k in (("time", "wall_s"), ("steps", "step"), ("frames", "frames"))}
              for name, s in summary.items()}
    return {"target_cm": target, "metric": metric, "seeds": [int(s) for s in seeds], "reference": reference,
            "max_seconds": max_seconds, "runs": runs, "summary": summary, "ratios": ratios,
            "total_s": time.perf_counter() - start}


def jsonable(x):
    """``x`` with every non-finite float (a miss's median) as ``None``: strict JSON."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def _fmt(x, spec=".1f") -> str:
    return "miss" if x is None or not math.isfinite(x) else format(x, spec)


def _range(r, spec=".1f") -> str:
    return "–" if r is None else f"{format(r[0], spec)}–{format(r[1], spec)}"


def markdown(result: dict, descriptions: dict | None = None) -> str:
    """The table: per config, reached/runs, median (range) wall time, steps and frames to target,
    the median run's time split, the ratio to the reference, and the final test MPJPE."""
    ref = result["reference"]
    lines = [f"Target: {result['metric']} ≤ {result['target_cm']} cm; seeds {result['seeds']}; "
             f"ratios are ÷ `{ref}` (medians; > 1 = more than it).", "",
             "| config | reached | wall s to target, median (range) | steps (range) | frames (M) | "
             "compile / compute / data wait / eval / ckpt s | time ÷ ref | steps ÷ ref | "
             "final test MPJPE cm, mean (range) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["summary"].items():
        ratio = result["ratios"][name]
        test = s["final"].get("test/mpjpe")
        split = " / ".join(_fmt(s["split"][k]) for k in SPLIT_KEYS)
        frames = s["frames"] / 1e6 if math.isfinite(s["frames"]) else None
        lines.append(
            f"| {name} | {s['reached']}/{s['runs']} | {_fmt(s['wall_s'])} ({_range(s['wall_s_range'])}) | "
            f"{_fmt(s['step'], '.0f')} ({_range(s['step_range'], '.0f')}) | {_fmt(frames, '.2f')} | "
            f"{split} | "
            f"{_fmt(ratio['time'], '.2f')} | {_fmt(ratio['steps'], '.2f')} | "
            + (f"{test['mean']:.3f} ({_range(test['range'], '.3f')})" if test else "–") + " |")
    if descriptions:
        lines += [""] + [f"- `{name}`: {descriptions[name]}" for name in result["summary"]
                         if name in descriptions]
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    """Validation MPJPE against counted wall-clock (left) and steps (right), every config and
    seed (one colour per config), the target as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, runs) in enumerate(result["runs"].items()):
        for j, r in enumerate(runs):
            for ax, key in zip(axes, ("wall_s", "step"), strict=True):
                x = [p[key] for p in r["curve"]]
                y = [p["value"] for p in r["curve"]]
                ax.plot(x, y, color=colors[i % len(colors)], alpha=0.8, marker="o", markersize=2.5,
                        linewidth=1.2, label=name if j == 0 else None)
                if not r["reached"]:
                    ax.plot(x[-1:], y[-1:], "x", color=colors[i % len(colors)], markersize=7)
    for ax, xlabel in zip(axes, ("wall-clock s (compile + train + eval + checkpoint)", "steps"), strict=True):
        ax.axhline(result["target_cm"], color="k", linestyle="--", linewidth=1, label="target")
        ax.set(xlabel=xlabel, ylabel=f"{result['metric']} (cm)", yscale="log")
        ax.grid(alpha=0.3, which="both")
        ax.set_xlim(left=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"time to {result['target_cm']} cm; one line per seed; × = missed within budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
