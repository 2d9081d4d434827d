"""Where a Bandai-2 run's cross-corpus error comes from (issue #60): its error on Bandai-1 walk + run
taken apart beside its own validation split.

``python benchmarks/cross_corpus_gap.py --workdir RUN [--step best] [--split validation]
[--cross bandai1_walk_run|bandai1_validation] [--changes leaves,clip,shoulders,...] [--json OUT]``
scores the run's model (its own normalization and windows, as the ``corpus`` evaluator does) on its
``--split`` and on a Bandai-1 set (``--cross``: the walk and run takes of
:data:`motionjax.configs.base.BANDAI1_CROSS`, or :data:`BANDAI1_VALIDATION`), and prints, each with a
95% bootstrap interval over clips (:mod:`motionjax.evaluation.intervals`):

* MPJPE per joint, by frame position in the window (first / middle / last 8 frames), and the root's
  global error;
* Bandai-1 per clip, by whether the clip's style is one Bandai-2 has (by name or meaning:
  :data:`SHARED_STYLES`), by content and by whether its bones are the run's;
* how far Bandai-1's standardized input lies outside what the run saw: per feature, the share of
  Bandai-1 frames beyond the largest ``|z|`` of ``--split``; and, without the model, the share of each
  set's local rotation values outside the other's 0.1-99.9% range (the reverse direction too, against
  a Bandai-1 training split);
* the error when the input, or the motion itself, is changed (``--changes``): ``leaves``, the leaf
  joints' rotations (``Head``, hands, toes: nothing on the run's bones hangs below them at a nonzero
  offset, so they move no joint) held at the training mean on the input only; ``clip``, every input
  feature clipped to the ``|z|`` range of ``--split``; ``shoulders``, the shoulders at the training mean
  (input and target); ``turn``, the shoulders turned, every frame, by the rotation that takes the set's
  mean to the training mean (input and target, the motion kept); ``leaves+shoulders``,
  ``leaves+turn``. A change that closes most of the gap names what the model is thrown by.

It reads ``--split`` (validation by default, never the run's test splits) and the Bandai-1 set: walk +
run is the cross-corpus test row, to diagnose with; choices go on ``bandai1_validation``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from motionjax.configs.base import BANDAI1_CROSS, BANDAI_SOURCE  # noqa: E402

# Bandai-1 walk/run styles that Bandai-2 has, by name or by meaning (Bandai-2: active, elderly,
# exhausted, feminine, masculine, normal, youthful).
SHARED_STYLES = {"active": "active", "feminine": "feminine", "normal": "normal", "masculinity": "masculine",
                 "old": "elderly", "tired": "exhausted"}
EDGE = 8  # frames at each end of a window counted as its edges
# A Bandai-1 set to choose on, apart from the walk + run test row: contents near Bandai-2's walk-turn and
# wave (60 clips; all of Bandai-1 is the other test row, so a choice here is said as such).
BANDAI1_VALIDATION = tuple(f"{BANDAI_SOURCE}/dataset-1_{k}_*.bvh"
                           for k in ("walk-left", "walk-right", "bye", "byebye"))


def leaf_joints(skeleton) -> list[int]:
    """Rotating joints that move no joint: every joint below them sits at zero offset (BVH end sites)."""
    from motionjax.core.features import rotating_joints

    children = {j: [c for c, p in enumerate(skeleton.parents) if p == j] for j in range(skeleton.num_joints)}

    def moves(j):  # any joint below j at a nonzero offset
        return any(np.linalg.norm(skeleton.offsets[c]) > 1e-6 or moves(c) for c in children[j])

    return [j for j in rotating_joints(skeleton) if not moves(j)]


def feature_names(skeleton) -> list[str]:
    from motionjax.core.features import rotating_joints

    return ["root.x", "root.y", "root.z"] + [f"{skeleton.names[j]}.{k}" for j in rotating_joints(skeleton)
                                             for k in range(6)]


def score(predict, batches, skeleton, mean, std, transform=None, target=None) -> dict:
    """Per window: ``err [W, T, J]`` root-relative joint error (cm), ``root [W, T]`` the root's global
    error (cm), ``valid [W, T]``, ``clip [W]`` (fill windows dropped) and the input ``z [W, T, F]``.
    ``target``: a change of the motion itself (standardized features ``[..., F] -> [..., F]``), on the
    model's input and its target; ``transform``: then a change of the input alone."""
    from motionjax.evaluation import metrics

    out = {k: [] for k in ("err", "root", "valid", "clip", "z")}
    for batch in batches:
        b = batch["clean"].shape[0]
        flat = lambda x, b=b: np.asarray(x).reshape(b, -1, x.shape[-1])  # noqa: E731
        x, clean = np.asarray(batch["noisy"]), np.asarray(batch["clean"])
        if target is not None:
            x, clean = target(x), target(clean)
        x = x if transform is None else transform(x)
        offsets = batch.get("offsets")
        true = np.asarray(metrics.feature_positions(skeleton, flat(clean), mean, std, offsets))
        pred = np.asarray(metrics.feature_positions(skeleton, flat(predict(x)), mean, std, offsets))
        rel = lambda p: p - p[..., :1, :]  # noqa: E731
        keep = np.asarray(batch["clip"]) >= 0
        out["err"].append(100 * np.linalg.norm(rel(pred) - rel(true), axis=-1)[keep])
        out["root"].append(100 * np.linalg.norm(pred[..., 0, :] - true[..., 0, :], axis=-1)[keep])
        out["valid"].append(flat(batch["valid"])[..., 0][keep])
        out["clip"].append(np.asarray(batch["clip"])[keep])
        out["z"].append(flat(x)[keep])
    return {k: np.concatenate(v) for k, v in out.items()}


def frame_features(info, split: str) -> np.ndarray:
    """``[N, 6 R']``: the 6D local rotation of every rotating joint but the root, every frame of
    ``split`` (these features do not depend on the window: only the root's is canonicalized)."""
    from motionjax.core import rotations
    from motionjax.core.features import rotating_joints
    from motionjax.data.pipeline import ClipSource

    source, joints = ClipSource(info), rotating_joints(info.skeleton)[1:]
    rows = np.concatenate([source[c]["rotations"][b:e, joints] for c, b, e in info.splits[split]])
    return rotations.quat_to_6d(rows).reshape(len(rows), -1)


def outside_share(reference: np.ndarray, frames: np.ndarray, q: float = 0.001) -> np.ndarray:
    """``[F]``: the share of ``frames [N, F]`` outside the ``[q, 1 - q]`` quantile range of
    ``reference [M, F]`` per feature (widened by 1e-3, the float noise of an unmoving channel)."""
    lo, hi = np.quantile(reference, [q, 1 - q], axis=0)
    return ((frames < lo - 1e-3) | (frames > hi + 1e-3)).mean(0)


def interval(values, valid, clips, select=None) -> dict:
    """Mean of ``values [W, T, ...]`` over valid frames (and ``select [W]`` windows), interval over clips."""
    from motionjax.evaluation import intervals

    v = values if values.ndim == 2 else values.mean(-1)  # [W, T]: the mean over joints
    w = valid.astype(np.float64)
    if select is not None:
        v, w, clips = v[select], w[select], clips[select]
    return intervals.from_sums((v * w).sum(-1), w.sum(-1), clips)


def frames_interval(err, valid, clips, frames) -> dict:
    mask = np.zeros(err.shape[1], bool)
    mask[frames] = True
    return interval(err, valid * mask, clips)


def report(name, s, skeleton, names) -> dict:
    from motionjax.evaluation.intervals import fmt

    clips, valid, err = s["clip"], s["valid"], s["err"]
    t = err.shape[1]
    rows = {"mpjpe": interval(err, valid, clips),
            "root_global": interval(s["root"], valid, clips),
            "first_frames": frames_interval(err, valid, clips, slice(0, EDGE)),
            "middle_frames": frames_interval(err, valid, clips, slice(EDGE, t - EDGE)),
            "last_frames": frames_interval(err, valid, clips, slice(t - EDGE, t))}
    j = np.arange(err.shape[-1])
    rows["per_joint"] = {skeleton.names[i]: interval(err[..., i], valid, clips) for i in j}
    print(f"{name}: {len(np.unique(clips))} clips, {len(clips)} windows: MPJPE {fmt(rows['mpjpe'])} cm; "
          f"root global {fmt(rows['root_global'])}; first {EDGE} frames {fmt(rows['first_frames'])}, "
          f"middle {fmt(rows['middle_frames'])}, last {EDGE} {fmt(rows['last_frames'])}")
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--step", default="best")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--cache", default="data_cache/eval")
    parser.add_argument("--cross", default="bandai1_walk_run",
                        choices=("bandai1_walk_run", "bandai1_validation"),
                        help="the Bandai-1 set: walk + run (the cross-corpus test row) or bandai1_validation "
                             "(walk-left, walk-right, bye, byebye: to choose on)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--bandai1-train", default="data_cache/bandai1_w64_ood_clean",
                        help="a prepared Bandai-1 directory: its train split's range (the reverse direction)")
    parser.add_argument("--changes", default="leaves,clip,shoulders,leaves+shoulders,turn,leaves+turn",
                        help="the changed inputs also scored (comma-separated; empty: none)")
    args = parser.parse_args(argv)

    from motionjax.data import pipeline, prepare
    from motionjax.data.info import load_info
    from motionjax.efficiency import trained
    from motionjax.evaluation import inference
    from motionjax.evaluation.intervals import fmt

    run = trained.load(args.workdir, int(args.step) if args.step.isdigit() else args.step)
    config, info = run.config, run.info
    sk, mean, std = info.skeleton, info.mean, info.std
    names = feature_names(sk)
    cross_name = args.cross
    sources = BANDAI1_CROSS.get(cross_name) or BANDAI1_VALIDATION
    paths = sorted({p for s in sources for p in prepare.resolve_sources(s)})
    spec, settings = inference.ModelSpec.from_run(config, info), prepare.Settings.from_config(config.data)
    other = inference.prepare_corpus(paths, spec, settings, args.cache, cross_name,
                                     log=lambda line: print(line, flush=True))
    other = dataclasses.replace(other, mean=mean, std=std, window=config.data.window)
    own = pipeline.make_eval_batches(config.data, info, args.split, 0.0, seed=config.seed)
    cross = pipeline.make_eval_batches(config.data, other, cross_name, 0.0, seed=config.seed)
    print(f"{args.workdir} step {run.step}")

    result = {"workdir": args.workdir, "step": run.step, "split": args.split}
    s_own = score(run.predict, own, sk, mean, std)
    s_b1 = score(run.predict, cross, sk, mean, std)
    result[args.split] = report(args.split, s_own, sk, names)
    result[cross_name] = report(cross_name, s_b1, sk, names)

    # Per joint, the largest gaps.
    gap = {n: (result[cross_name]["per_joint"][n]["mean"], result[args.split]["per_joint"][n]["mean"])
           for n in sk.names}
    print(f"per joint (cm), {cross_name} vs {args.split}, largest first:")
    for n, (_, b) in sorted(gap.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"  {n:12s} {fmt(result[cross_name]['per_joint'][n])}  vs {b:.2f}")

    # Per clip and by style.
    clip_names = [other.names[c] for c in s_b1["clip"]]
    style = np.array([n.split("_")[2] for n in clip_names])
    shared = np.array([st in SHARED_STYLES for st in style])
    content = np.array([n.split("_")[1] for n in clip_names])
    per_clip = {}
    for c in np.unique(s_b1["clip"]):
        sel = s_b1["clip"] == c
        w = s_b1["valid"][sel]
        per_clip[other.names[c]] = float((s_b1["err"][sel].mean(-1) * w).sum() / w.sum())
    print("Bandai-1 clips, worst first:", ", ".join(f"{k} {v:.2f}" for k, v in
                                                   sorted(per_clip.items(), key=lambda kv: -kv[1])[:12]))
    print("best:", ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_clip.items(), key=lambda kv: kv[1])[:6]))
    # Takes exported with other bones than the run's (Bandai-1's end sites at 5-10 cm instead of 0).
    source = pipeline.ClipSource(other)
    bones = {c: np.abs(np.asarray(source[c]["offsets"])[1:] - sk.offsets[1:]).max() > 1e-4
             for c in np.unique(s_b1["clip"])}
    own_bones = np.array([not bones[c] for c in s_b1["clip"]])
    groups = {"style in Bandai-2": shared, "style not in Bandai-2": ~shared,
              **{k: content == k for k in np.unique(content)},
              "bones as the run's": own_bones, "other bones (end sites)": ~own_bones}
    groups = {k: v for k, v in groups.items() if v.any()}
    by_style = {}
    for st in np.unique(style):
        by_style[st] = interval(s_b1["err"], s_b1["valid"], s_b1["clip"], style == st)
    result["per_clip"], result["by_style"] = per_clip, by_style
    result["groups"] = {g: interval(s_b1["err"], s_b1["valid"], s_b1["clip"], sel)
                        for g, sel in groups.items()}
    for g, r in result["groups"].items():
        print(f"  {g}: {fmt(r)} ({r['clips']} clips)")
    print("by style:", ", ".join(f"{k} {fmt(v)}"
                                 for k, v in sorted(by_style.items(), key=lambda kv: -kv[1]["mean"])))

    # How far the input lies outside the run's own split, per feature.
    zmax = np.abs(s_own["z"][s_own["valid"] > 0]).max(0)  # [F]
    zb1 = np.abs(s_b1["z"][s_b1["valid"] > 0])
    outside = (zb1 > zmax).mean(0)
    order = np.argsort(-outside)
    result["outside"] = {names[i]: {"share": float(outside[i]), "own_max_z": float(zmax[i]),
                                    "bandai1_max_z": float(zb1[:, i].max()), "std": float(std[i])}
                         for i in order[:15]}
    print("features of Bandai-1 outside the split's |z| range (share of frames, max |z| there vs here):")
    for i in order[:12]:
        print(f"  {names[i]:14s} {outside[i]:.3f}  {zmax[i]:.1f} vs {zb1[:, i].max():.1f}"
              f"  (std {std[i]:.4f})")

    # The input changed, the target not.
    leaves = leaf_joints(sk)
    from motionjax.core.features import rotating_joints
    slot = {j: i for i, j in enumerate(rotating_joints(sk))}
    leaf_cols = np.array([3 + 6 * slot[j] + k for j in leaves for k in range(6)])

    def hold_leaves(x):
        x = x.copy()
        x[..., leaf_cols] = 0.0  # the training mean
        return x

    def clip_range(x):
        return np.clip(x, -zmax, zmax)

    shoulders = [sk.index(n) for n in sk.names if n.startswith("Shoulder")]
    shoulder_cols = np.array([3 + 6 * slot[j] + k for j in shoulders for k in range(6)])

    def hold_shoulders(x):
        x = x.copy()
        x[..., shoulder_cols] = 0.0
        return x

    def shift_shoulders(batches):
        """The shoulders turned, every frame, by the one rotation that takes their mean over ``batches``
        to the training mean (their motion kept): a set whose shoulders sit as Bandai-2's do."""
        from motionjax.core import rotations as rot

        frames = np.concatenate([np.asarray(b["clean"]).reshape(-1, mean.shape[-1])[
            np.asarray(b["valid"]).reshape(-1) > 0] for b in batches])
        here = rot.sixd_to_quat((frames * std + mean)[:, shoulder_cols].mean(0).reshape(-1, 6))
        there = rot.sixd_to_quat(mean[shoulder_cols].reshape(-1, 6))
        delta = rot.quat_mul(there, rot.quat_conj(here))  # [S, 4]

        def apply(x):
            raw = x * std + mean
            q = rot.sixd_to_quat(raw[..., shoulder_cols].reshape(*x.shape[:-1], -1, 6))
            out = raw.copy()
            out[..., shoulder_cols] = rot.quat_to_6d(rot.quat_mul(delta, q)).reshape(*x.shape[:-1], -1)
            return ((out - mean) / std).astype(x.dtype)
        return apply

    result["leaves"] = [sk.names[j] for j in leaves]
    result["input_changed"] = {}
    changes = {  # key: (what changes, the input-only change, the change of the motion itself)
        "leaves": ("input: leaf rotations at the mean", hold_leaves, None),
        "clip": ("input: clipped to the split's |z| range", clip_range, None),
        "shoulders": ("input and target: shoulders at the mean", None, hold_shoulders),
        "leaves+shoulders": ("input: leaves at the mean; input and target: shoulders at the mean",
                             hold_leaves,
                             hold_shoulders),
        "turn": ("input and target: shoulders turned to the training mean (motion kept)", None, "shift"),
        "leaves+turn": ("input: leaves at the mean; input and target: shoulders turned to the mean",
                        hold_leaves, "shift")}
    changes = [changes[k] for k in args.changes.split(",") if k]
    for label, f, target in changes:
        rows = {}
        for split, batches in ((args.split, own), (cross_name, cross)):
            t = shift_shoulders(batches) if target == "shift" else target
            s = score(run.predict, batches, sk, mean, std, f, t)
            rows[split] = interval(s["err"], s["valid"], s["clip"])
            w = s["valid"][..., None]
            per_joint = ((s["err"] * w).sum((0, 1)) / w.sum()).tolist()
            rows[split + "_joints"] = dict(zip(sk.names, per_joint, strict=True))
        result["input_changed"][label] = rows
        worst = sorted(rows[cross_name + "_joints"].items(), key=lambda kv: -kv[1])[:4]
        print(f"{label}: {args.split} {fmt(rows[args.split])}; "
              f"{cross_name} {fmt(rows[cross_name])}"
              f" (worst joints there: {', '.join(f'{k} {v:.2f}' for k, v in worst)})")

    # Model-free: which corpus's rotations lie inside the other's range (the reverse direction too).
    b1_dir = Path(args.bandai1_train)
    b1_train = frame_features(load_info(b1_dir), "train") if (b1_dir / "index.json").exists() else None
    own_train, own_split, b1_frames = (frame_features(info, "train"), frame_features(info, args.split),
                                       frame_features(other, cross_name))
    rot_names = names[9:]
    shift = {cross_name + " outside train": outside_share(own_train, b1_frames),
             args.split + " outside train": outside_share(own_train, own_split)}
    if b1_train is not None:
        shift[args.split + " outside bandai1 train"] = outside_share(b1_train, own_split)
    result["range_shift"] = {k: {"mean_share": float(v.mean()), "worst": {rot_names[i]: float(v[i])
                                                                        for i in np.argsort(-v)[:6]}}
                             for k, v in shift.items()}
    print("local rotations (6D, joints below the root) outside the 0.1-99.9% range of another set:")
    for k, v in result["range_shift"].items():
        print(f"  {k}: {v['mean_share']:.3f} of values; worst "
              + ", ".join(f"{n} {x:.2f}" for n, x in v["worst"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))
        print(f"written: {args.json}")
    return result


if __name__ == "__main__":
    main()
