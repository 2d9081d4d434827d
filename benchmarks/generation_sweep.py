"""The dynamics loss on invented motion, swept on validation (issue #56 item 4).

``python benchmarks/generation_sweep.py [--workdir runs/generate] [--weights 0,5,50] [--seeds 0,1,2]
[--steps 600] [--dim 64] [--depth 2] [--dynamics-batch 8]`` trains the generator of
``experiments/generate.py`` once per (dynamics weight, seed) on the frozen autoencoder and evaluator of
a ``make train CONFIG=experiments/generate.py`` run (its ``WORKDIR``; trained there first if missing),
a smaller model with a shorter schedule than the config's (the sweep must fit the shared 2-core machine),
and scores each on the **validation** split at the config's guidance (or the scales that run chose):
FID, label accuracy, foot skating, root residual force and torque, jitter, floor contact. It writes
``docs/results/generation_dynamics_sweep.json`` (every run, and each weight's change against weight 0 of
the same seed) and ``.png`` (the changes per seed), and prints the table. Target: >= 30% less skating and
root residual force at <= +5% FID against weight 0.

``--physics-guidance 0,0.5,1,2`` sweeps the other place the issue names instead, sampling-time physics
guidance (``generation.physics_guidance``, :func:`motionjax.generation.flow.physics_cost`): nothing is
trained; the run's own generator (``WORKDIR/generator.npz``) samples validation at each scale (x each
set of cost terms of ``--physics-terms`` x each start of ``--physics-from``), one sampling seed per
``--seeds`` (the same noise for every setting), each setting's change against scale 0 of the same seed
(also paired over clips: :func:`paired`), every figure with its 95% interval over clips, and a verdict
per setting against ``--criteria`` (skating ratio change, FID interval overlapping scale 0's, contact
change); ``--then test,unseen_test`` scores those splits once with scale 0 and the setting chosen
(:func:`choose`); ``OUT.png`` plots the skating ratio against FID
(``--out docs/results/generation_physics_bandai2``).

``--sampling "euler:32:2,2;heun:16:2,2;euler:32:1.5,1.5"`` crosses those settings with the physics ones:
each the ODE sampler (``generation.sampler``), its steps and the (content, style) guidance scales, the
first the reference every other setting is paired with (the same noise; ``--physics-guidance 0`` alone
sweeps sampling without physics guidance). ``--choose fid``: of the settings whose paired FID difference
against the first lies below 0 (its whole interval), the one of lowest FID, else the first.

The run's own ``WORKDIR/config.json`` is the config when there is one (its autoencoder and data), else
``--config``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METRICS = (
    "fid",
    "fid_ratio",
    "accuracy_content",
    "accuracy_style",
    "skate_ratio",
    "skate_ratio_avg5",
    "contact",
    "foot_skate",
    "root_force",
    "root_torque",
    "jitter",
    "penetration",
    "floating",
)
TARGET = {"skate_ratio": -0.30, "foot_skate": -0.30, "root_force": -0.30, "fid": 0.05}


def main(argv=None) -> dict:
    from motionjax import malloc

    malloc.configure()
    from motionjax import configs
    from motionjax.generation import flow, run

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="", help="default: WORKDIR/config.json when there, else "
                   "experiments/generate.py")
    p.add_argument(
        "--workdir",
        default="runs/generate",
        help="a finished generation run (its autoencoder, "
        "evaluator); the sweep's generators are kept in WORKDIR/sweep",
    )
    p.add_argument("--weights", default="0,5,50")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--dim", type=int, default=64, help="generator width (a smaller model than the config's)")
    p.add_argument("--depth", type=int, default=2, help="generator blocks")
    p.add_argument("--dynamics-batch", type=int, default=8, help="windows of each batch the dynamics loss "
                   "decodes (generation.dynamics_batch)")
    p.add_argument("--guidance", default="", help="content,style guidance scales (default: the run's choice)")
    p.add_argument("--physics-guidance", default="", help="physics guidance scales to sweep at sampling "
                   "time with the run's generator (then --weights, --steps, --dim, --depth do not apply)")
    p.add_argument("--physics-terms", default="", help="cost terms to sweep, comma-separated sets of "
                   "names joined by + (force, contact, band: flow.physics_cost; default: the config's)")
    p.add_argument("--physics-from", default="", help="flow times the guidance starts at, comma-separated "
                   "(default: the config's physics_guidance_from)")
    p.add_argument("--sampling", default="", help="with --physics-guidance: sampler:steps:content,style "
                   "settings separated by ';' (the first the reference; default: the run's)")
    p.add_argument("--choose", default="physics", choices=("physics", "fid"), help="the rule of --then: "
                   "physics (:func:`choose`) or fid (:func:`choose_fid`)")
    p.add_argument("--criteria", default="-0.35,-0.08", help="skating ratio change (at most) and contact "
                   "change (at least) a setting must meet, with its FID interval overlapping scale 0's")
    p.add_argument("--splits", default="validation", help="comma-separated splits scored; choose on "
                   "validation, then score test / unseen_pairs once with the chosen setting and 0")
    p.add_argument("--then", default="", help="with --physics-guidance: splits scored once after the sweep "
                   "(e.g. test,unseen_test) with scale 0 and the setting chosen on the first of --splits "
                   "(:func:`choose`)")
    p.add_argument("--then-if-met", action="store_true", help="score the --then splits only when a setting "
                   "meets every criterion on the first split")
    p.add_argument("--out", default="docs/results/generation_dynamics_sweep")
    p.add_argument("--tradeoff", nargs="*", default=None, help="only plot the FID change against the physics "
                   "change of these sweep JSON files into OUT.png (no training)")
    args = p.parse_args(argv)
    if args.tradeoff is not None:
        out = REPO / args.out if not Path(args.out).is_absolute() else Path(args.out)
        plot_tradeoff([json.loads(Path(f).read_text()) for f in args.tradeoff], out.with_suffix(".png"))
        return {}
    workdir = Path(args.workdir)
    if args.config or not (workdir / "config.json").exists():
        config = configs.load(args.config or "experiments/generate.py")
    else:  # the run's own config: its autoencoder (generation.autoencoder), data and sizes
        import ml_collections

        config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    sampling = bool(args.physics_guidance)
    weights = [float(w) for w in (args.physics_guidance if sampling else args.weights).split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    criteria = [float(x) for x in args.criteria.split(",")]
    g0 = config.generation
    foots = (args.physics_terms.split(",") if args.physics_terms
             else ["+".join(g0.get("physics_terms", flow.UNNAMED_TERMS))])
    froms = [float(f) for f in args.physics_from.split(",")] if args.physics_from else [
        float(g0.get("physics_guidance_from", 0.5))]
    # (weight, cost terms, from): scale 0 once (it samples without guidance), every other scale per set of
    # terms and start; the dynamics sweep has one of each (unused).
    s = run.setup(config, workdir)
    (workdir / "sweep").mkdir(exist_ok=True)
    if args.guidance:
        scales = tuple(float(x) for x in args.guidance.split(","))
    elif (workdir / "summary.json").exists():  # the scales that run chose on validation
        scales = tuple(json.loads((workdir / "summary.json").read_text())["guidance"])
    else:
        scales = (config.generation.content_scale, config.generation.style_scale)
    samplings = (args.sampling.split(";") if sampling and args.sampling else
                 [f"{flow.sampler_of(g0)}:{g0.sample_steps}:" + ",".join(f"{x:g}" for x in scales)])
    for spec in samplings:
        parse_sampling(spec)  # a malformed one fails before any sampling
    # The first setting is the reference (scale 0 of a physics sweep) every other one is paired with.
    settings = [(w, foot, f, spec) for spec in samplings for w in weights
                for foot in (foots if w else foots[:1]) for f in (froms if w else froms[:1])]
    if not sampling:
        settings = [(w, foots[0], froms[0], samplings[0]) for w in weights]
    runs, unguided = [], {}
    if sampling:  # the run's generator, as trained by make train
        trained, _ = run.fit_generator(s, config.generation, config.seed, workdir / "generator")
        g = config.generation
        args.steps, args.dim, args.depth = g.steps, g.dim, g.depth
    def score(model, w, foot, start, spec, seed, split, report, train_s):
        """One setting on one split: its row (values, intervals, paired changes) appended to ``runs``."""
        clock = time.perf_counter()
        scored = {}
        sampler, steps, scales_ = parse_sampling(spec)
        if sampling:
            model = (*model, sampler, steps)
        rows = run.evaluate_split(s, split, {"generator": model}, scales_, seed=100 + seed,
                                  multimodality=False, references=False, scored_out=scored)
        row = {k: rows["generator"][k] for k in METRICS}
        row.update({k + "_ci": rows["generator"].get(k + "_ci") for k in METRICS})
        row.update(windows=rows["generator"]["windows"], fid_windows=rows["generator"]["fid_windows"])
        if sampling and (seed, split) not in unguided:  # the first setting's windows: the reference
            unguided[(seed, split)] = scored["generator"]
        elif sampling:
            row["paired"] = paired(s, split, scored["generator"], unguided[(seed, split)], 100 + seed)
        runs.append({"weight": w, "terms": foot if sampling else None, "from": start if sampling else None,
                     "sampling": spec if sampling else None, "seed": seed, "split": split,
                     "steps": args.steps,
                     "train_s": None if sampling else train_s, "evaluation_s": time.perf_counter() - clock,
                     "steps_per_s": report.get("steps_per_s"), **row})
        print(json.dumps(runs[-1]), flush=True)
        partial = REPO / f"{args.out}.partial.json" if not Path(args.out).is_absolute() else Path(
            f"{args.out}.partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(runs, indent=1))  # what a run cut short still leaves

    for seed in seeds:  # seed by seed: a change of load on the shared machine hits every weight alike
        for w, foot, start, spec in settings:
            clock = time.perf_counter()
            if sampling:
                model, report = (trained, w, foot, start), {}
            else:
                g = run.generator_config(config, w)
                g.update(steps=args.steps, dynamics_batch=args.dynamics_batch, dim=args.dim, depth=args.depth)
                model, report = run.fit_generator(
                    s, g, seed, workdir / "sweep" / (f"w{w:g}_seed{seed}_steps{args.steps}"
                                                      f"_dim{args.dim}_depth{args.depth}")
                )
            train_s = time.perf_counter() - clock
            for split in args.splits.split(","):
                score(model, w, foot, start, spec, seed, split, report, train_s)
    chosen = None
    if sampling and args.then:  # the choice on the first split (validation), then the other splits once
        first = args.splits.split(",")[0]
        rs = [r for r in runs if r["split"] == first and r["seed"] == seeds[0]]
        chosen = choose(rs, criteria) if args.choose == "physics" else choose_fid(rs)
        print(f"chosen on {first}: {chosen}", flush=True)
        met = chosen["rule"].startswith("meets")
        for split in args.then.split(",") if met or not args.then_if_met else []:
            for w, foot, start, spec in (settings[0], (chosen["weight"], chosen["terms"], chosen["from"],
                                                       chosen.get("sampling", samplings[0]))):
                score((trained, w, foot, start), w, foot, start, spec, seeds[0], split, {}, None)
    for r in runs:  # each against the first setting of its seed and split
        base = next(b for b in runs if (b["seed"], b["split"]) == (r["seed"], r["split"]))
        r["change"] = {k: r[k] / base[k] - 1 if base[k] else float("nan") for k in METRICS}
        if sampling and r["weight"]:
            r["meets"] = meets(r, base, criteria)
    summary = {
        "command": "python benchmarks/generation_sweep.py " + " ".join(argv or sys.argv[1:]),
        "splits": args.splits.split(",") + (args.then.split(",") if sampling and args.then else []),
        "chosen": chosen,
        "sweeps": "physics guidance scale at sampling" if sampling else "dynamics loss weight in training",
        "guidance": list(scales),
        "steps": args.steps,
        "weights": weights,
        "seeds": seeds,
        "dynamics_batch": args.dynamics_batch,
        "generator": {"dim": args.dim, "depth": args.depth, "batch_size": config.generation.batch_size},
        "dynamics_terms": dict(config.loss.dynamics),
        "target": TARGET,
        "runs": runs,
        "settings": ([{"weight": w, "terms": foot, "from": f, "sampling": spec}
                      for w, foot, f, spec in settings] if sampling else None),
        "criteria": {"skate_ratio_change_at_most": criteria[0], "contact_change_at_least": criteria[1],
                     "fid_interval_overlaps_scale_0": True} if sampling else None,
        "mean_change": {  # {split: {setting: {metric: mean change over seeds}}}
            split: {
                label(w, foot, f, sampling, spec): {
                    k: float(np.mean([r["change"][k] for r in rs
                                      if (r["weight"], r["terms"], r["from"], r["sampling"])
                                      == ((w, foot, f, spec) if sampling else (w, None, None, None))]))
                    for k in METRICS}
                for w, foot, f, spec in settings[1:]
            }
            for split in args.splits.split(",")
            for rs in [[r for r in runs if r["split"] == split]]
        },
    }
    lines = [f"{'split':12s} {'setting':>18s} {'seed':>4s} " + " ".join(f"{k:>14s}" for k in METRICS)]
    for r in runs:
        lines.append(
            f"{r['split']:12s} {label(r['weight'], r['terms'], r['from'], sampling, r['sampling']):>18s} "
            f"{r['seed']:4d} "
            + " ".join(f"{r[k]:8.3f} {100 * r['change'][k]:+4.0f}%" for k in METRICS)
            + ("" if r.get("meets") is None else f"  meets: {r['meets']}")
        )
    if sampling:  # the figures the choice reads, with their intervals
        lines.append("")
        for r in runs:
            name = label(r["weight"], r["terms"], r["from"], sampling, r["sampling"])
            lines.append(f"{r['split']} {name} seed {r['seed']}: "
                         + ", ".join(f"{k} {fmt_ci(r[k], r.get(k + '_ci'))}"
                                     for k in ("fid", "fid_ratio", "skate_ratio", "contact",
                                               "accuracy_content", "accuracy_style"))
                         + "".join(f"; {k} {fmt_ci(v[0], v[1:])}" for k, v in r.get("paired", {}).items()))
    summary["table"] = lines
    out = REPO / args.out if not Path(args.out).is_absolute() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    if sampling and not any(weights):
        plot_sampling(summary, out.with_suffix(".png"))
    else:
        (plot_ratio if sampling else plot)(summary, out.with_suffix(".png"))
    print("\n".join(lines), flush=True)
    return summary


def paired(s, split: str, mine: dict, base: dict, seed: int) -> dict:
    """A guided setting against scale 0 on the same windows (the same noise), each with a paired bootstrap
    over clips (:mod:`motionjax.evaluation.intervals`, each replicate draws the clips once for both):
    the ratio of the skating ratios and of the contact shares (guided / unguided), and the FID difference
    (guided − unguided, both against the same real windows of the other half, :func:`run.halves`)."""
    from motionjax.evaluation import generative, intervals
    from motionjax.generation import run

    w = s.splits[split]
    out = {}
    for k in ("skate_ratio", "contact", "root_force"):  # counted over the same frames in both (foot_skate's
        (sa, ca), (sb, cb) = mine["plausibility"][k], base["plausibility"][k]  # contact frames differ)
        r = intervals.ratio_interval(sa / np.maximum(ca, 1), sb / np.maximum(cb, 1), w.clip, ca, seed=seed)
        out[k + "_ratio"] = [r["value"], r["lo"], r["hi"]]
    a, b, _ = run.halves(w, seed)
    real, fm, fb = s.real[split]["features"], mine["features"], base["features"]
    n = len(a)

    def difference(idx):
        ia, ib = a[idx[idx < n]], b[idx[idx >= n] - n]
        return generative.fid(fm[ia], real[ib]) - generative.fid(fb[ia], real[ib])

    d = intervals.statistic_interval(difference, np.concatenate([w.clip[a], w.clip[b]]), seed=seed)
    out["fid_difference"] = [d["value"], d["lo"], d["hi"]]
    return out


def choose(rs: list, criteria) -> dict:
    """The setting chosen among the guided runs ``rs`` of one split and seed: of those meeting ``criteria``
    (:func:`meets`) the one of lowest FID; if none does, the one of lowest skating ratio among those whose
    FID interval overlaps scale 0's and whose contact change is within ``criteria[1]``; else the lowest
    skating ratio. Returns ``{"weight", "terms", "from", "rule"}``."""
    base = next(r for r in rs if not r["weight"])
    guided = [(r, meets(r, base, criteria)) for r in rs if r["weight"]]
    ok = [r for r, m in guided if m["all"]]
    if ok:
        r, rule = min(ok, key=lambda r: r["fid"]), "meets every criterion, lowest FID"
    else:
        near = [r for r, m in guided if m["fid_overlap"] and m["contact"]] or [r for r, _ in guided]
        r = min(near, key=lambda r: r["skate_ratio"])
        rule = "none meets every criterion: lowest skating ratio"
    return {"weight": r["weight"], "terms": r["terms"], "from": r["from"], "rule": rule}


def label(w: float, foot, start, sampling: bool, spec=None) -> str:
    """A setting's name: ``"0"`` (no guidance), ``"1 band from 0.5"`` (a physics guidance setting) or the
    dynamics weight; then its sampling setting (``"heun:16:2,2"``) when given."""
    name = f"{w:g} {foot} from {start:g}" if sampling and w else f"{w:g}"
    return f"{name} {spec}" if sampling and spec else name


def parse_sampling(spec: str) -> tuple[str, int, tuple[float, ...]]:
    """``"heun:16:2,1.5"`` -> ``("heun", 16, (2.0, 1.5))``: the sampler (:data:`flow.SAMPLERS`), its steps
    and the label guidance scales; anything else is an error naming the setting."""
    from motionjax.generation import flow

    parts = spec.split(":")
    try:
        sampler, steps, scales = parts[0], int(parts[1]), tuple(float(x) for x in parts[2].split(","))
    except (IndexError, ValueError):
        raise ValueError(f"--sampling setting {spec!r}: sampler:steps:content,style, e.g. heun:16:2,2"
                         ) from None
    if sampler not in flow.SAMPLERS or steps < 1 or len(parts) != 3:
        raise ValueError(f"--sampling setting {spec!r}: sampler one of {flow.SAMPLERS}, steps >= 1")
    return sampler, steps, scales


def choose_fid(rs: list) -> dict:
    """The setting chosen among the runs ``rs`` of one split and seed by FID alone: of those whose paired FID
    difference against the first (the reference) has its whole 95% interval below 0, the one of lowest
    FID; if none, the reference. Returns ``{"weight", "terms", "from", "sampling", "rule"}``."""
    lower = [r for r in rs[1:] if r.get("paired") and r["paired"]["fid_difference"][2] < 0]
    r, rule = ((min(lower, key=lambda r: r["fid"]), "meets: FID lower than the reference's (paired), lowest")
               if lower else (rs[0], "meets: none lower than the reference (paired): the reference"))
    return {"weight": r["weight"], "terms": r["terms"], "from": r["from"], "sampling": r["sampling"],
            "rule": rule}


def fmt_ci(value: float, ci) -> str:
    """``"0.278 [0.220, 0.339]"`` (:func:`motionjax.evaluation.intervals.fmt`); ``"0.278 [-]"`` without
    ``ci``."""
    from motionjax.evaluation import intervals

    return intervals.fmt({"value": value, "lo": ci[0], "hi": ci[1]}, 3) if ci else f"{value:.3f} [-]"


def overlaps(a, b) -> bool:
    """Whether two intervals ``[lo, hi]`` share a point (a missing one: no)."""
    return bool(a and b and a[0] <= b[1] and b[0] <= a[1])


def meets(r: dict, base: dict, criteria) -> dict:
    """The verdict of one guided setting against scale 0 of the same seed and split: skating ratio change
    at most ``criteria[0]``, contact change at least ``criteria[1]``, FID intervals overlapping."""
    change = {k: r[k] / base[k] - 1 if base[k] else float("nan") for k in ("skate_ratio", "contact")}
    verdict = {"skate_ratio": change["skate_ratio"] <= criteria[0],
               "contact": change["contact"] >= criteria[1],
               "fid_overlap": overlaps(r.get("fid_ci"), base.get("fid_ci"))}
    verdict["all"] = all(verdict.values())
    return verdict


def plot_sampling(summary: dict, path) -> None:
    """A sweep of sampling settings alone (no physics guidance): each setting's FID difference against the
    first (paired over clips, 95% interval), one panel per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = summary["splits"]
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 3.6), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        rs = [r for r in summary["runs"] if r["split"] == split]
        for y, r in enumerate(rs):
            d = r.get("paired", {}).get("fid_difference", [0.0, 0.0, 0.0])
            ax.errorbar(d[0], y, xerr=[[d[0] - d[1]], [d[2] - d[0]]], fmt="o", color="k", capsize=3)
        ax.axvline(0, color="C3", lw=1)
        ax.set_yticks(range(len(rs)), [r["sampling"] + (" (reference)" if not i else "")
                                       for i, r in enumerate(rs)])
        ax.invert_yaxis()
        ax.set(xlabel="FID − reference's, paired over clips (95% interval)",
               title=f"{split}: sampler:steps:content,style guidance")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratio(summary: dict, path) -> None:
    """FID and the contact share against the skating ratio of every setting (95% intervals over clips),
    one row per split, the criteria's lines (skating, contact) from the scale-0 point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits, crit = summary["splits"], summary["criteria"]
    fig, axes = plt.subplots(len(splits), 2, figsize=(11, 4.2 * len(splits)), squeeze=False)
    for row, split in zip(axes, splits, strict=True):
        rs = [r for r in summary["runs"] if r["split"] == split]
        terms = sorted({r["terms"] for r in rs if r["weight"]})
        for ax, k, name in zip(row, ("fid", "contact"), ("FID", "contact share (toes in the band)"),
                               strict=True):
            for r in rs:
                color = "k" if not r["weight"] else f"C{terms.index(r['terms'])}"
                x, y = r["skate_ratio"], r[k]
                xe, ye = r.get("skate_ratio_ci"), r.get(k + "_ci")
                ax.errorbar(x, y, xerr=None if not xe else [[max(x - xe[0], 0)], [max(xe[1] - x, 0)]],
                            yerr=None if not ye else [[max(y - ye[0], 0)], [max(ye[1] - y, 0)]], fmt="o",
                            color=color, ms=4, lw=0.8, capsize=2)
                ax.annotate(f"{r['weight']:g}" if r["weight"] else "no guidance", (x, y), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
                if not r["weight"]:
                    c = crit["skate_ratio_change_at_most"]
                    ax.axvline(x * (1 + c), color="C3", ls="--", lw=1, label=f"{100 * c:+.0f}% skating")
                    if k == "contact":
                        c = crit["contact_change_at_least"]
                        ax.axhline(y * (1 + c), color="C3", ls=":", lw=1, label=f"{100 * c:+.0f}% contact")
            for i, name_ in enumerate(terms):
                ax.plot([], [], "o", color=f"C{i}", label=f"cost: {name_}")
            ax.set(xlabel="skating ratio (papers', 95% interval)", ylabel=f"{name} (95% interval)",
                   title=f"{split}: physics guidance, scale by each point")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(summary: dict, path) -> None:
    """The change against weight 0 of the same seed (%), one panel per metric, a point per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ("foot_skate", "root_force", "root_torque", "fid")
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), sharey=False)
    weights = [w for w in summary["weights"] if w]
    first = summary.get("splits", ["validation"])[0]  # the split of the sweep (the first one scored)
    for ax, k in zip(axes, shown, strict=True):
        for seed in summary["seeds"]:
            ys = [
                100 * next(r["change"][k] for r in summary["runs"]
                           if (r["weight"], r["seed"], r.get("split", "validation")) == (w, seed, first))
                for w in weights
            ]
            ax.plot(range(len(weights)), ys, "o-", label=f"seed {seed}")
        if k in TARGET:
            ax.axhline(100 * TARGET[k], color="C3", ls="--", lw=1, label="target")
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_xticks(range(len(weights)), [f"{w:g}" for w in weights])
        ax.set(title=k, xlabel=summary.get("sweeps", "dynamics loss weight"), ylabel="% vs 0")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{summary.get('sweeps', 'dynamics loss weight')}, validation, generator of "
                 f"{summary['steps']} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tradeoff(sweeps: list[dict], path) -> None:
    """Each run's FID change (%) against its skating and root-force changes (%) vs weight 0 of the same
    seed, one marker per sweep size, labelled by weight and seed; the target's corner shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, k in zip(axes, ("foot_skate", "root_force"), strict=True):
        ax.axhspan(-100, 100 * TARGET["fid"], xmin=0, xmax=1, color="0.93")
        ax.axvline(100 * TARGET[k], color="C3", ls="--", lw=1)
        ax.axhline(100 * TARGET["fid"], color="C3", ls="--", lw=1)
        for i, sweep in enumerate(sweeps):
            g = sweep["generator"]
            size = f"{sweep['steps']} steps, width {g['dim']}, {g['depth']} blocks"
            runs = [r for r in sweep["runs"] if r["weight"]]
            ax.scatter([100 * r["change"][k] for r in runs], [100 * r["change"]["fid"] for r in runs],
                       color=f"C{i}", label=size if ax is axes[0] else None)
            for r in runs:
                at = (100 * r["change"][k], 100 * r["change"]["fid"])
                ax.annotate(f"w{r['weight']:g} s{r['seed']}", at, fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set(xlabel=f"{k} change vs weight 0 (%)", title=k)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("FID change vs weight 0 (%)")
    axes[0].set_ylim(-30, 20)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("dynamics loss on decoded samples (validation): target = below and left of the dashed lines")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
