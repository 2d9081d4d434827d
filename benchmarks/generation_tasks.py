"""Style transfer and in-betweening with a trained generator, against their baselines (issue #62 items 4-5).

``python benchmarks/generation_tasks.py --workdir runs/generate [--split test]
[--strength 0.6,0.65,0.7,0.75] [--choose-only] [--missing 5,15,30] [--inbetween-strengths 0.25,0.5,0.75,1.0]
[--inbetween-shares 0] [--inbetween-samples 8] [--choose-at 15] [--tasks transfer,inbetweening]
[--inbetween-limit 0] [--limit 0] [--out docs/results/generation_tasks]`` reads a finished run of
``experiments/generate.py`` (nothing is trained) and scores, on the held-out split's real windows:

**Style transfer** (:func:`motionjax.generation.edit.stylize`): each window rendered in another style, one
drawn at random among those its content has in training (so the baseline has a take to copy), with the
run's guidance scales; against **retrieval**, the training window of the same content and the target
style nearest to the source in the evaluator's features. The method (strength, optionally sampler, mean
of several samples, guidance: :func:`parse_methods`) is chosen on validation among ``--strength``'s
(:func:`choose_method`: target style >= 0.75 and content >= 0.9, then the lowest feature distance).
Scored by the evaluator's target-style and content accuracy, content preservation (evaluator feature
distance to the source; root trajectory distance, cm, mean over frames of the root's horizontal offset
from the source's, both in the window's canonical frame) with the paired per-clip difference of both
against retrieval, FID against the split's real windows (halves by clip, :func:`run.halves`), and the
skating ratio; 95% intervals over clips.

**In-betweening** (:func:`motionjax.generation.edit.inbetween`): ``--missing`` consecutive frames of each
whole window (no padding) removed at a random place and generated with the window's labels, from the
interpolated window's latent noised to flow time ``1 - strength`` (chosen on validation among
``--inbetween-strengths``, at ``--choose-at`` missing frames or at each gap's own); the result is the
mean of ``--inbetween-samples`` samples joined to the given frames (:func:`motionjax.generation.edit.join`),
moved a share of the way to the interpolation (chosen with the strength among ``--inbetween-shares``:
:func:`motionjax.generation.edit.toward`; the unmoved mean beside it), one sample joined beside it;
against linear root / slerp rotation interpolation
(:func:`motionjax.generation.edit.interpolate`). Scored by MPJPE (cm, on the skeleton's bones, in the
window frame) at the given frames and at the missing ones, and the skating ratio; 95% intervals over
clips, and the paired difference per clip. ``--tasks`` runs one of the two; ``--inbetween-limit`` scores
at most that many windows, spread over the split.

Writes ``OUT.json`` and prints both tables.
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


def _interval_row(values: dict) -> dict:
    return {k: {"value": v.get("mean", v.get("value")), "ci": [v["lo"], v["hi"]]} for k, v in values.items()}


def _targets(s, labels, rng) -> np.ndarray:
    """``labels [B, 2]`` (content, style ids) with each style replaced by another one the window's
    content has in training (so retrieval has a take of it)."""
    target = labels.copy()
    for i, (c, st) in enumerate(labels):
        styles = np.unique(s.labels[s.labels[:, 0] == c, 1])
        target[i, 1] = rng.choice(styles[styles != st])
    return target


# The choice's floors: the target-style accuracy 0.7 with a margin, its content accuracy 0.9.
STYLE_MIN, CONTENT_MIN = 0.75, 0.9


def parse_methods(text: str) -> list[dict]:
    """``"0.6,0.7/heun,0.7/x4,0.7/g1.5"`` -> style-transfer methods ``{"name", "strength", "sampler",
    "samples", "guidance"}``: a strength, then optionally ``/SAMPLER`` (a :data:`flow.SAMPLERS` entry;
    default the run's), ``/xK`` (the mean of K samples' features) and ``/gC[:S]`` (label guidance scales
    content, style; default the run's)."""
    from motionjax.generation import flow

    methods = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        strength, *options = item.split("/")
        m = {"name": f"style transfer {item}", "strength": float(strength), "sampler": None, "samples": 1,
             "guidance": None}
        if not 0.0 < m["strength"] <= 1.0:
            raise ValueError(f"style transfer method {item!r}: its strength must be in (0, 1]")
        for o in options:
            if o in flow.SAMPLERS:
                m["sampler"] = o
            elif o[:1] == "x" and o[1:].isdigit() and int(o[1:]) > 0:
                m["samples"] = int(o[1:])
            elif o[:1] == "g":
                scales = [float(v) for v in o[1:].split(":")]
                m["guidance"] = tuple(scales * 2 if len(scales) == 1 else scales)
            else:
                raise ValueError(f"style transfer method {item!r}: {o!r} is none of a sampler "
                                 f"({', '.join(flow.SAMPLERS)}), xK (samples) or gC[:S] (guidance)")
        methods.append(m)
    if not methods:
        raise ValueError(f"no style transfer method in {text!r}")
    return methods


def choose_method(rows: dict, methods: list[dict]) -> str:
    """The name of the method chosen from its rows of :func:`transfer` on validation: of those with
    target-style accuracy >= :data:`STYLE_MIN` and content accuracy >= :data:`CONTENT_MIN`, the one with the
    lowest evaluator feature distance to the source (content preservation; the retrieval baseline is the
    same for all, on the same windows and targets); else the one with the best lower of the two
    accuracies."""
    acc = {m["name"]: (rows[m["name"]]["accuracy_target_style"]["value"],
                       rows[m["name"]]["accuracy_content"]["value"]) for m in methods}
    good = [n for n, (st, co) in acc.items() if st >= STYLE_MIN and co >= CONTENT_MIN]
    if good:
        return min(good, key=lambda n: rows[n]["feature_distance"]["value"])
    return max(acc, key=lambda n: min(acc[n]))


def retrieve(s, source, target) -> np.ndarray:
    """Retrieval: for each source window's evaluator features ``source [B, E]`` and its target labels
    ``target [B, n_keys]``, the index of the nearest (Euclidean, evaluator features) training window with
    those labels, mirrored copies left out."""
    plain = np.flatnonzero(~s.train.mirrored)
    train_f = s.score(s.train.features[plain], s.train.offsets[plain], s.train.valid[plain])["features"]
    pick = np.empty(len(source), np.int64)
    for i, y in enumerate(target):
        match = np.flatnonzero((s.labels[plain] == y).all(-1))
        pick[i] = plain[match[np.argmin(np.linalg.norm(train_f[match] - source[i], axis=-1))]]
    return pick


def preservation(s, source_features, source_root, scored: dict, root, valid) -> dict:
    """Per window ``[B]``: ``feature_distance`` (evaluator features to the source's) and
    ``root_distance_cm`` (mean over valid frames of the root's horizontal offset from the source's, cm),
    from ``scored`` (:meth:`run.Setup.score`) and ``root [B, T, 3]`` (m) against ``source_features [B, E]``
    and ``source_root [B, T, 3]``; ``valid [B, T]``."""
    up = s.info.skeleton.up_axis
    drift = np.linalg.norm(np.delete(root - source_root, up, axis=-1), axis=-1)  # [B, T] m
    frames = np.maximum(valid.sum(1), 1)
    return {"feature_distance": np.linalg.norm(scored["features"] - source_features, axis=-1),
            "root_distance_cm": 100 * (drift * valid).sum(1) / frames}


def transfer(s, model, split: str, scales, methods, seed: int, limit: int = 0, fid: bool = True) -> dict:
    """The style-transfer table on ``split``: ``{method name or "retrieval": {metric: {"value", "ci"}}}``
    for each of ``methods`` (:func:`parse_methods`) and the retrieval baseline, on the same windows and
    targets, and ``{"<name> - retrieval": {metric: {"value", "ci", "gain"}}}``: the paired per-clip
    differences of the content-preservation distances (both methods edit the same source windows, so
    a clip's difficulty cancels); ``fid``: FID rows too (not on a ``limit``)."""
    import jax

    from motionjax.evaluation import generative, intervals
    from motionjax.generation import edit, latents
    from motionjax.generation import run as run_module

    w = s.splits[split]
    take = np.arange(len(w)) if not limit else np.arange(min(limit, len(w)))
    w = w.take(take)
    labels = s.encode_labels(w)
    target = _targets(s, labels, np.random.default_rng(seed))
    source = s.real[split]["features"][take]  # the source windows' evaluator features
    root_src = latents.motion(s.info, w.features)[0]
    pick = retrieve(s, source, target)
    made = {m["name"]: (edit.stylize(s, model, w.features, target, m["guidance"] or scales,
                                     jax.random.key(seed), m["strength"], m["samples"], m["sampler"]),
                        None, w.valid) for m in methods}
    made["retrieval"] = (s.train.features[pick], s.train.offsets[pick], s.train.valid[pick])
    a, b, _ = run_module.halves(s.splits[split], seed)
    real = s.real[split]["features"]
    fid_clips = np.concatenate([s.splits[split].clip[a], s.splits[split].clip[b]])
    out, kept = {}, {}
    frames = np.maximum(w.valid.sum(1), 1)  # the root distance's weight: a window's valid frames
    for name, (feats, offsets, valid) in made.items():
        scored = s.score(feats, offsets, valid)
        kept[name] = preservation(s, source, root_src, scored, latents.motion(s.info, feats, offsets)[0],
                                  w.valid)
        predicted = scored["predicted"]
        values = {
            "accuracy_target_style": intervals.mean_interval(predicted["style"] == target[:, 1], w.clip),
            "accuracy_content": intervals.mean_interval(predicted["content"] == target[:, 0], w.clip),
            "feature_distance": intervals.mean_interval(kept[name]["feature_distance"], w.clip),
            "root_distance_cm": intervals.mean_interval(kept[name]["root_distance_cm"], w.clip, frames),
        }
        if fid and not limit:  # FID: the windows of one half of the clips against the real ones of the other
            f = scored["features"]
            stat = lambda idx, f=f: generative.fid(  # noqa: E731
                f[a][idx[idx < len(a)]], real[b][idx[idx >= len(a)] - len(a)])
            values["fid"] = intervals.statistic_interval(stat, fid_clips, seed=seed)
        sums, counts = scored["plausibility"]["skate_ratio"]
        values["skate_ratio"] = intervals.mean_interval(sums / np.maximum(counts, 1), w.clip, counts)
        out[name] = _interval_row(values)
    for m in methods:
        diffs = {}
        for metric, weights in (("feature_distance", None), ("root_distance_cm", frames)):
            d = intervals.paired_difference(kept[m["name"]][metric], kept["retrieval"][metric], w.clip,
                                            weights)
            diffs[metric] = {"value": d["mean"], "ci": [d["lo"], d["hi"]], "gain": d["gain"]}
        out[f"{m['name']} - retrieval"] = diffs
    if fid and not limit:
        ref = intervals.statistic_interval(
            lambda idx: generative.fid(real[a][idx[idx < len(a)]], real[b][idx[idx >= len(a)] - len(a)]),
            fid_clips, seed=seed)
        out["real (reference)"] = _interval_row({"fid": ref})
    out["windows"], out["clips"] = int(len(w)), int(len(np.unique(w.clip)))
    return out


def generator_name(samples: int, share: float = 0.0) -> str:
    """The in-betweening table's name of the generator's result (mean of ``samples``, moved ``share`` of
    the way to the interpolation)."""
    return f"generator (mean of {samples})" + (f", {share:g} toward interpolation" if share else "")


def inbetweening(s, model, split: str, scales, missing: int, seed: int, limit: int = 0,
                 strength: float = 1.0, samples: int = 8, single: bool = True, share: float = 0.0,
                 shares=()) -> dict:
    """The in-betweening table for ``missing`` frames: ``{method: {metric: {"value", "ci"}}}`` and the
    paired per-clip differences of MPJPE on the missing frames; ``strength``: how much of the flow the
    generator runs from the interpolated window's latent (1: the missing frames from noise); ``samples``:
    the generator's result is the mean of that many samples, joined to the given frames
    (:func:`motionjax.generation.edit.join`), moved ``share`` of the way to the interpolation
    (:func:`motionjax.generation.edit.toward`; with ``share > 0`` the unmoved mean beside it); ``shares``:
    rows for these shares too, from the same samples (the choice on validation); ``single``: one sample,
    joined, beside it."""
    import jax

    from motionjax.evaluation import intervals
    from motionjax.generation import edit, latents

    w = s.splits[split]
    whole = np.flatnonzero(w.valid.all(1))
    if limit and limit < len(whole):  # spread over the split's clips (its windows come clip by clip)
        whole = whole[np.linspace(0, len(whole) - 1, limit).astype(int)]
    w = w.take(whole)
    labels = s.encode_labels(w)
    rng = np.random.default_rng(seed + missing)
    known = edit.gap(w.valid.shape[1], missing, len(w), rng)
    truth = latents.motion(s.info, w.features)[2]
    key = jax.random.key(seed + missing)
    run = lambda k: edit.inbetween(s, model, w.features, known, labels, scales, key, strength,  # noqa: E731
                                   join_ends=True, samples=k)
    baseline, mean = edit.interpolate(s.info, w.features, known), run(samples)
    made = {generator_name(samples, x): edit.toward(mean, baseline, x)
            for x in dict.fromkeys((share, 0.0, *shares))}  # the reported share first
    if single and samples > 1:
        made["generator (one sample)"] = run(1)
    made["interpolation"] = baseline
    out, errors = {}, {}
    given, free = known.sum(1), (~known).sum(1)
    for name, x in made.items():
        pos = latents.motion(s.info, x)[2]
        err = 100 * np.linalg.norm(pos - truth, axis=-1).mean(-1)  # [B, T] cm
        errors[name] = (err * ~known).sum(1) / free
        sums, counts = s.score(x, None, w.valid)["plausibility"]["skate_ratio"]
        out[name] = _interval_row({
            "mpjpe_missing_cm": intervals.mean_interval(errors[name], w.clip, free),
            "mpjpe_given_cm": intervals.mean_interval((err * known).sum(1) / given, w.clip, given),
            "skate_ratio": intervals.mean_interval(sums / np.maximum(counts, 1), w.clip, counts),
        })
    truth_sums, truth_counts = s.real[split]["plausibility"]["skate_ratio"]
    out["real"] = _interval_row({"skate_ratio": intervals.mean_interval(
        truth_sums[whole] / np.maximum(truth_counts[whole], 1), w.clip, truth_counts[whole])})
    for name in made:
        if name != "interpolation":
            diff = intervals.paired_difference(errors[name], errors["interpolation"], w.clip, free)
            out[f"{name} - interpolation, missing frames (cm)"] = {
                "value": diff["mean"], "ci": [diff["lo"], diff["hi"]], "gain": diff["gain"]}
    out["windows"], out["clips"] = int(len(w)), int(len(np.unique(w.clip)))
    return out


def main(argv=None) -> dict:
    from motionjax import malloc

    malloc.configure()
    from motionjax.generation import run

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="runs/generate")
    p.add_argument("--split", default="test")
    p.add_argument("--strength", default="0.6,0.65,0.7,0.75",
                   help="style transfer methods: flow time noised away, each optionally /SAMPLER, /xK (the "
                   "mean of K samples), /gC[:S] (guidance), e.g. 0.7/heun/x4 (several: one chosen on "
                   "--choose-split)")
    p.add_argument("--missing", default="5,15,30")
    p.add_argument("--inbetween-strengths", default="0.25,0.5,0.75,1.0",
                   help="in-betweening: flow time redone from the interpolation (chosen on --choose-split)")
    p.add_argument("--inbetween-samples", type=int, default=8,
                   help="in-betweening: the result is the mean of this many samples, joined to the given "
                   "frames")
    p.add_argument("--inbetween-shares", default="0",
                   help="in-betweening: shares of the way from the generator's result to the interpolation "
                   "(several: one chosen on --choose-split with the strength, from the same samples)")
    p.add_argument("--inbetween-limit", type=int, default=0,
                   help="in-betweening: at most this many windows of the reported split (0: all)")
    p.add_argument("--choose-at", default="15",
                   help="in-betweening: the gap (missing frames) its strength is chosen at, or 'each' gap "
                   "its own")
    p.add_argument("--tasks", default="transfer,inbetweening", help="which of the two to run")
    p.add_argument("--choose-split", default="validation", help="where both strengths are chosen")
    p.add_argument("--choose-only", action="store_true",
                   help="style transfer: the choice on --choose-split only, --split not scored")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="at most this many windows (0: all; tests)")
    p.add_argument("--out", default="docs/results/generation_tasks")
    args = p.parse_args(argv)
    clock = time.perf_counter()
    s, model, summary = run.load(args.workdir)
    scales = tuple(summary.get("guidance") or (s.config.generation.content_scale,
                                               s.config.generation.style_scale))
    result = {"command": "python benchmarks/generation_tasks.py " + " ".join(argv or sys.argv[1:]),
              "workdir": str(args.workdir), "split": args.split, "guidance": list(scales)}
    tasks = set(args.tasks.split(","))
    if tasks - {"transfer", "inbetweening"}:
        p.error(f"--tasks {args.tasks}: transfer and/or inbetweening")
    if "transfer" in tasks:
        transfer_task(result, s, model, scales, args)
    if "inbetweening" in tasks:
        inbetween_task(result, s, model, scales, args)
    result["wall_s"] = time.perf_counter() - clock
    result["table"] = table(result)
    print("\n".join(result["table"]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return result


def transfer_task(result: dict, s, model, scales, args) -> None:
    """Style transfer: the method chosen on ``--choose-split`` among ``--strength``'s
    (:func:`choose_method`), the table on ``--split`` (not with ``--choose-only``)."""
    methods = parse_methods(args.strength)
    if len(methods) > 1:
        rows = transfer(s, model, args.choose_split, scales, methods, args.seed + 2, args.limit, fid=False)
        chosen = choose_method(rows, methods)
        result["transfer_choice"] = {"split": args.choose_split, "rule": f"target style >= {STYLE_MIN}, "
                                     f"content >= {CONTENT_MIN}, then the lowest feature distance",
                                     "chosen": chosen, "rows": rows}
        print(f"style transfer method {chosen} (on {args.choose_split})", flush=True)
        methods = [m for m in methods if m["name"] == chosen]
    result["transfer_method"] = methods[0]
    result["strength"] = methods[0]["strength"]
    if not args.choose_only:
        result["style_transfer"] = transfer(s, model, args.split, scales, methods, args.seed, args.limit)
        print(json.dumps(result["style_transfer"], indent=1), flush=True)


def inbetween_task(result: dict, s, model, scales, args) -> None:
    """In-betweening: the strength chosen on ``--choose-split`` (at ``--choose-at`` missing frames, or at
    each gap's own), the table on ``--split``."""
    strengths = [float(x) for x in args.inbetween_strengths.split(",")]
    shares = [float(x) for x in args.inbetween_shares.split(",")]
    k = args.inbetween_samples

    def choose(m: int):
        # The (strength, share) of the lowest MPJPE on the missing frames, on at most 400 windows of
        # validation (never the reported split); the shares from the same samples.
        if len(strengths) == 1 and len(shares) == 1:
            return (strengths[0], shares[0]), {}
        tried = {}
        for x in strengths:
            rows = inbetweening(s, model, args.choose_split, scales, m, args.seed + 1, args.limit or 400,
                                x, k, single=False, shares=shares)
            tried.update({f"{x}/{y}": rows[generator_name(k, y)]["mpjpe_missing_cm"] for y in shares})
        best = min(tried, key=lambda key: tried[key]["value"])
        chosen = tuple(map(float, best.split("/")))
        print(f"in-betweening strength / share toward interpolation {best} (on {args.choose_split}, {m} "
              "missing frames: " + ", ".join(f"{x}: {v['value']:.2f} cm" for x, v in tried.items()) + ")",
              flush=True)
        return chosen, tried

    gaps = list(map(int, args.missing.split(",")))
    each = args.choose_at == "each"
    if not each:
        (result["inbetween_strength"], result["inbetween_share"]), result["inbetween_strength_choice"] = \
            choose(int(args.choose_at))
    result["inbetweening"] = {}
    for m in gaps:
        chosen, share = result.get("inbetween_strength"), result.get("inbetween_share", 0.0)
        if each:
            (chosen, share), tried = choose(m)
            result.setdefault("inbetween_strength_each", {})[str(m)] = {"chosen": chosen, "share": share,
                                                                        "tried": tried}
        result["inbetweening"][str(m)] = inbetweening(s, model, args.split, scales, m, args.seed,
                                                      args.inbetween_limit or args.limit, chosen, k,
                                                      share=share)
        result["inbetweening"][str(m)].update(strength=chosen, share=share)
        print(m, json.dumps(result["inbetweening"][str(m)], indent=1), flush=True)


def _cell(entry: dict | None, digits: int = 2) -> str:
    if not entry:
        return "-"
    v, (lo, hi) = entry["value"], entry["ci"]
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(result: dict) -> list[str]:
    """The tables run, as markdown."""
    lines = []
    cols = ("accuracy_target_style", "accuracy_content", "feature_distance", "root_distance_cm", "fid",
            "skate_ratio")
    parts = [("transfer_choice", "rows", result.get("transfer_choice", {}).get("split")),
             ("style_transfer", None, result["split"])]
    for part, inner, split in parts:
        if part not in result:
            continue
        st = result[part][inner] if inner else result[part]
        method = result.get("transfer_method", {}).get("name", f"strength {result.get('strength')}")
        what = "choice" if inner else f"method {method}"
        lines += [f"style transfer, {split} ({st['windows']} windows, {st.get('clips', '?')} clips), {what}",
                  "| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for name, row in st.items():
            if isinstance(row, dict) and not name.endswith(" - retrieval"):
                lines.append(f"| {name} | " + " | ".join(_cell(row.get(c)) for c in cols) + " |")
        for name, row in st.items():
            if name.endswith(" - retrieval"):
                cells = [f"{_cell(row[c])} ({row[c]['gain']})" if c in row else "" for c in cols]
                lines.append(f"| {name} (paired) | " + " | ".join(cells) + " |")
        lines.append("")
    if "inbetweening" not in result:
        return lines
    cols = ("mpjpe_given_cm", "mpjpe_missing_cm", "skate_ratio")
    strength = result.get("inbetween_strength", "chosen per gap")
    lines += [f"in-betweening, {result['split']}, strength {strength}",
              "| missing frames | method | " + " | ".join(cols) + " |", "|---:|---|" + "---:|" * len(cols)]
    for m, rows in result["inbetweening"].items():
        for name, row in rows.items():
            if isinstance(row, dict) and "mpjpe_missing_cm" in row or name == "real":
                cells = [_cell(row.get(c), 3 if c == "skate_ratio" else 2) for c in cols]
                lines.append(f"| {m} ({rows['windows']} windows, {rows.get('clips', '?')} clips, strength "
                             f"{rows.get('strength', strength)}, share {rows.get('share', 0.0):g}) | "
                             f"{name} | " + " | ".join(cells) + " |")
        for name, d in rows.items():
            if name.endswith("missing frames (cm)"):
                method = name.split(", missing")[0]
                lines.append(f"| {m} | {method} (paired) | | {_cell(d)} ({d['gain']}) | |")
    return lines


if __name__ == "__main__":
    main()
