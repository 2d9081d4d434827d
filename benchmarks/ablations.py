"""One config, one change at a time, over seeds: held-out metrics side by side.

    python benchmarks/ablations.py --config experiments/autoencoder.py --steps 1500 \\
        --ablate no_head=model.position_head=False --ablate no_aug=data.mirror_prob=0,data.speed_range=1 \\
        [--set KEY=VALUE ...] [--seeds 0,1,2] [--devices 8] [--metric validation/mpjpe ...] \\
        [--target 2.3] [--out results/ablations] [--report-only]

Each (ablation, seed) is a ``scripts/train.py`` run of the config with its overrides (``KEY=VALUE``,
comma separated) in ``--out/NAME[_sSEED]``; ``base`` (no override) always runs first; ``--set``
overrides apply to every run; ``--devices N`` runs each on N virtual CPU devices (XLA's
``--xla_force_host_platform_device_count``). A finished run (its ``summary.json``) is reused, so the
command resumes; ``--report-only`` runs nothing and reports the finished runs (a sweep cut short).
Metrics (history keys after ``eval/``; default ``validation/mpjpe`` and, where the
run has it, ``ood_validation/mpjpe``) are read at each run's best checkpoint (the config's
``train.best_metric``); the test splits are never read. ``--target T``: also the step at which the
best metric first reaches T, linearly interpolated between evaluations. Prints the table (the mean
over seeds, the range in brackets) and writes ``ablations.json``, ``ablations.md`` and, with several
evaluations per run, ``ablations.png`` (the best metric against steps, one line per run); with two
metrics, ``ablations_tradeoff.png`` (the second against the first, one point per ablation).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_METRICS = ("validation/mpjpe", "ood_validation/mpjpe")


def _run(config: str, workdir: Path, steps: int, seed: int, overrides: list[str], devices: int) -> dict:
    summary = workdir / "summary.json"
    if not summary.exists():
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"--config={config}",
               f"--workdir={workdir}", f"--config.train.steps={steps}", f"--config.seed={seed}",
               *(f"--config.{o}" for o in overrides)]
        env = dict(os.environ)
        if devices:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                f" --xla_force_host_platform_device_count={devices}").strip()
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    return json.loads(summary.read_text())


def steps_to(curve: list, target: float) -> float | None:
    """The first step at which ``curve`` (``[(step, value)]``, ascending steps) is ≤ ``target``,
    interpolated linearly from the evaluation before it; None if it never is."""
    prev = None
    for step, value in curve:
        if value <= target:
            if prev is None or prev[1] == value:
                return float(step)
            (s0, v0) = prev
            return s0 + (step - s0) * (v0 - target) / (v0 - value)
        prev = (step, value)
    return None


def scores(doc: dict, metrics, target: float | None) -> dict:
    """One run's summary -> its metrics at the best step (and steps to target)."""
    history, step = doc["history"], doc["best_step"]
    out = {"best_step": step, "steps": doc["steps"], "train_s": doc["train_s"], "params": doc["params"],
           "steps_per_s": doc.get("steps_per_s")}
    for key in metrics:
        if f"eval/{key}" in history:
            out[key] = next(v for s, v in history[f"eval/{key}"] if s == step)
    best = history.get(f"eval/{doc['best_metric']}") if "best_metric" in doc else None
    if target is not None and best:
        out["steps_to_target"] = steps_to(best, target)
    return out


def _best_key(doc: dict) -> str:
    config = json.loads((Path(doc["workdir"]) / "config.json").read_text())
    return config["train"]["best_metric"]


def _fmt(values, spec=".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(np.mean(values), spec)} [{format(min(values), spec)}–{format(max(values), spec)}]"


def table(rows: dict, metrics, target: float | None) -> list[str]:
    """Markdown lines: one row per ablation, each metric's mean [range] over seeds, change vs base."""
    present = [m for m in metrics if any(m in r for e in rows.values() for r in e["runs"])]
    head = ["ablation", "overrides", "seeds", *(f"{m}" for m in present), "vs base"]
    if target is not None:
        head.insert(-1, f"steps to {target:g}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mean = lambda runs, m: float(np.mean([r[m] for r in runs if m in r]))
    for name, entry in rows.items():
        runs = entry["runs"]
        cells = [name, ", ".join(entry["overrides"]) or "-", str(len(runs))]
        cells += [_fmt([r.get(m) for r in runs]) for m in present]
        if target is not None:
            reached = [r.get("steps_to_target") for r in runs]
            cells.append(_fmt(reached, ".0f") + ("" if all(v is not None for v in reached)
                                                 else f" ({reached.count(None)} not reached)"))
        base = rows["base"]["runs"]
        cells.append("-" if name == "base" else ", ".join(
            f"{100 * (mean(runs, m) / mean(base, m) - 1):+.1f}%" for m in present))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(docs: dict, path: Path, target: float | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, runs) in enumerate(docs.items()):
        for j, doc in enumerate(runs):
            curve = np.asarray(doc["history"][f"eval/{doc['best_metric']}"])
            ax.plot(curve[:, 0], curve[:, 1], color=colors[i % len(colors)], lw=1.2,
                    label=name if j == 0 else None)
    if target is not None:
        ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:g}")
    ax.set(xlabel="step", ylabel=next(iter(docs.values()))[0]["best_metric"], yscale="log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tradeoff_plot(rows: dict, x: str, y: str, path: Path) -> None:
    """Each ablation's mean ``y`` against its mean ``x`` (e.g. ood_validation against validation),
    with lines of constant ratio y / x: how far each setting is from an equal error on both."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = {name: [float(np.mean([r[m] for r in row["runs"]])) for m in (x, y)]
              for name, row in rows.items() if all(m in r for r in row["runs"] for m in (x, y))}
    xs, ys = np.array(list(points.values())).T
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    grid = np.linspace(0.9 * xs.min(), 1.1 * xs.max(), 2)
    for ratio, ls in ((1.0, "-"), (1.15, "--"), (1.5, ":"), (2.0, "-.")):
        ax.plot(grid, ratio * grid, color="0.6", lw=0.8, ls=ls, label=f"ratio {ratio:g}×")
    ax.scatter(xs, ys, color=["C3" if n == "base" else "C0" for n in points], zorder=3)
    for name, (px, py) in points.items():
        ax.annotate(f"{name} ({py / px:.2f}×)", (px, py), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")
    ax.set(xlabel=x, ylabel=y, title=f"{y} ÷ {x} per ablation",
           ylim=(0.9 * min(xs.min(), ys.min()), 1.08 * ys.max()))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seeds", default="0", help="comma separated")
    p.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds SEED)")
    p.add_argument("--devices", type=int, default=0, help="virtual CPU devices per run (0: as set)")
    p.add_argument("--ablate", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    p.add_argument("--metric", action="append", default=None, help="history key after eval/ (repeatable)")
    p.add_argument("--target", type=float, default=None, help="report steps to best metric <= target")
    p.add_argument("--out", default="results/ablations")
    p.add_argument("--report-only", action="store_true", help="run nothing: report the finished runs")
    args = p.parse_args()
    seeds = [args.seed] if args.seed is not None else [int(s) for s in args.seeds.split(",")]
    metrics = tuple(args.metric or DEFAULT_METRICS)
    ablations = {"base": []}
    for spec in args.ablate:
        name, _, overrides = spec.partition("=")
        if not name or "=" not in overrides:
            raise SystemExit(f"error: --ablate {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE]")
        ablations[name] = overrides.split(",")
    out = ROOT / args.out
    # A single seed keeps the run directory of before (--out/NAME), so older sweeps resume.
    workdir = lambda name, seed: out / (name if len(seeds) == 1 else f"{name}_s{seed}")
    docs, rows = {}, {}
    for seed in seeds:  # seed by seed: a sweep cut short still compares every ablation
        for name, overrides in ablations.items():
            if args.report_only and not (workdir(name, seed) / "summary.json").exists():
                continue
            doc = _run(args.config, workdir(name, seed), args.steps, seed, args.set + overrides, args.devices)
            doc["best_metric"] = _best_key(doc)
            docs.setdefault(name, []).append((seed, doc))
    for name, overrides in ablations.items():
        runs = [dict(seed=s, **scores(d, metrics, args.target)) for s, d in docs.get(name, [])]
        rows[name] = {"overrides": overrides, "runs": runs}
    rows = {name: row for name, row in rows.items() if row["runs"]}
    if "base" not in rows:
        raise SystemExit(f"error: {out}: no finished base run to compare with")
    lines = table(rows, metrics, args.target)
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    doc = {"config": args.config, "steps": args.steps, "seeds": seeds, "devices": args.devices,
           "set": args.set, "target": args.target, "rows": rows}
    (out / "ablations.json").write_text(json.dumps(doc, indent=1))
    (out / "ablations.md").write_text("\n".join(lines) + "\n")
    written = [out / "ablations.json", out / "ablations.md"]
    curves = {name: [d for _, d in runs] for name, runs in docs.items()}
    if any(len(d["history"].get(f"eval/{d['best_metric']}", [])) > 1 for ds in curves.values() for d in ds):
        plot(curves, out / "ablations.png", args.target)
        written.append(out / "ablations.png")
    present = [m for m in metrics if all(m in r for r in rows["base"]["runs"])]
    if len(present) >= 2:
        tradeoff_plot(rows, present[0], present[1], out / "ablations_tradeoff.png")
        written.append(out / "ablations_tradeoff.png")
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
