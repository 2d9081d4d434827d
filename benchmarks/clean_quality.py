"""How well :mod:`motionjax.data.clean` finds and fixes corrupted frames on real captures
(``benchmarks/bench_clean.py``).

Three parts, all on Bandai-1 (conformed, at 30 fps, as prepare sees it):

1. ``untouched``: the detectors in ``report`` mode on every clip: frames flagged per kind, the
   flagged clips, and each measure's corpus maximum (the defaults are these times a margin).
2. ``injected``: each kind of :mod:`motionjax.data.anomalies` at its three magnitudes, ``trials``
   times on random clips (>= ``min_frames`` frames), through :func:`motionjax.data.prepare.convert`
   (the worker's path): recall (the ground-truth range overlaps a range of the expected detector
   kind, +-2 frames), precision (flagged ranges overlapping a ground-truth range +-3 frames, over
   all flagged ranges of the corrupted clip), and what happened to the ground-truth frames
   (repaired / cut).
3. ``repair``: on the ground-truth frames that were repaired, FK of the prepared record against
   FK of the clean clip: mean joint error (MPJPE) and the largest joint error per frame.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from motionjax.core.kinematics import forward_kinematics
from motionjax.data import anomalies, clean, corpus, prepare, records, transforms
from motionjax.formats import Motion, load


def load_clips(paths, fps: float = 30.0) -> list[Motion]:
    """Each file conformed and resampled as prepare does (metres, ``fps``), with its ``stretch``."""
    out = []
    for p in paths:
        m, decided = corpus.conform(load(p))
        root, rots = transforms.resample(m.root_position, m.rotations, m.fps, fps)
        clip = Motion(m.skeleton, fps, root.astype(np.float32), rots.astype(np.float32), name=m.name)
        clip.stretch = decided["stretch"]  # the measure of the file's position channels
        out.append(clip)
    return out


def _positions(sk):
    return lambda r, q: np.asarray(forward_kinematics(sk, q, r)[0])


def measure_maxima(clips, th: clean.Thresholds) -> dict:
    """Per measure, its largest value over the corpus (and the clip), as the defaults are set from."""
    best: dict = {}

    def keep(key, value, name):
        if key not in best or value > best[key][0]:
            best[key] = (float(value), name)

    for m in clips:
        q, _ = clean.hemisphere_continuity(m.rotations)
        pos = _positions(m.skeleton)(m.root_position, q)
        keep("pop_m", clean.pop_measure(pos).max(), m.name)
        keep("twist_rad", clean.step_angles(q).max(), m.name)
        keep("teleport_m", clean.teleport_measure(m.root_position).max(), m.name)
        still = clean.frozen_frames(m.root_position, q)
        keep("frozen_frames", max((e - s + 1 for s, e in clean.runs(still)), default=0), m.name)
        h = clean.floor_heights(pos, m.skeleton.up_axis, m.fps)
        keep("penetration_m", -h.min(), m.name)
        keep("float_m", h.max(), m.name)
        longest = max((e - s for s, e in clean.runs(h > th.float_m / 2)), default=0)
        keep("float_s at half float_m", longest / m.fps, m.name)
        if getattr(m, "stretch", None) is not None:
            keep("stretch_m", m.stretch.max(), m.name)
    return {k: {"max": v, "clip": n, "default": getattr(th, k.split()[0], None)}
            for k, (v, n) in best.items()}


def untouched(clips, th: clean.Thresholds, window: int) -> dict:
    """Frames flagged on the clean corpus (report mode), per kind and per clip."""
    flagged_clips, frames, per_kind = [], 0, {}
    flagged_frames = 0
    for m in clips:
        *_, rep = clean.clean_clip(m.root_position, m.rotations, _positions(m.skeleton), fps=m.fps,
                                   up_axis=m.skeleton.up_axis, th=th, mode="report", window=window,
                                   stretch=getattr(m, "stretch", None), names=m.skeleton.names)
        frames += rep["frames"]
        bad = np.zeros(rep["frames"], bool)
        for d in rep["defects"]:
            bad[d["frames"][0]:d["frames"][1]] = True
            per_kind[d["kind"]] = per_kind.get(d["kind"], 0) + d["frames"][1] - d["frames"][0]
        flagged_frames += int(bad.sum())
        if rep["defects"]:
            flagged_clips.append({"clip": m.name, "frames": rep["frames"], "defects": rep["defects"]})
    return {"clips": len(clips), "frames": frames, "flagged_frames": flagged_frames,
            "flagged_fraction": flagged_frames / max(frames, 1), "per_kind_frames": per_kind,
            "flagged_clips": flagged_clips}


def _overlaps(a, b, pad: int) -> bool:
    return a[0] < b[1] + pad and b[0] < a[1] + pad


def injected(clips, settings: prepare.Settings, trials: int, min_frames: int, seed: int = 0) -> dict:
    """Recall, precision, actions and repair error per (kind, magnitude)."""
    rng = np.random.default_rng(seed)
    pool = [m for m in clips if m.num_frames >= min_frames]
    rows = {}
    for kind in anomalies.KINDS:
        for mag in anomalies.MAGNITUDES[kind]:
            hits = any_hits = found = flagged = repaired = cut = gt_frames = 0
            errors, worst = [], []
            t0 = time.perf_counter()
            for _ in range(trials):
                m = pool[int(rng.integers(len(pool)))]
                bad, truth = anomalies.inject(m, kind, mag, rng)
                if kind == "sign_flip":  # restored: on the clean clip's hemisphere again (up to one sign)
                    fixed, _ = clean.hemisphere_continuity(bad.rotations)
                    orig, _ = clean.hemisphere_continuity(m.rotations)
                    side = np.sign((fixed * orig).sum(-1))
                    hits += sum(bool(side[f, j] == side[0, j]) for f, j in truth)
                    found += len(truth)
                    continue
                out = prepare.convert(bad, settings)
                rep = out["cleaning"]
                defects = rep["defects"]
                want = anomalies.DETECTOR[kind]
                for g in truth:
                    found += 1
                    hits += any(d["kind"] == want and _overlaps(d["frames"], g, 2) for d in defects)
                    any_hits += any(_overlaps(d["frames"], g, 2) for d in defects)
                flagged += len(defects)
                good = sum(any(_overlaps(d["frames"], g, 3) for g in truth) for d in defects)
                rows.setdefault((kind, mag), {})["_good"] = rows.get((kind, mag), {}).get("_good", 0) + good
                kept = np.zeros(m.num_frames, bool)
                for s, e in rep["spans"]:
                    kept[s:e] = True
                rec = records.decode_record(out["record"])
                sk = out["skeleton"]
                got = _positions(sk)(rec["root_position"], rec["rotations"])
                ref = _positions(m.skeleton)(m.root_position, m.rotations)
                fixed = np.zeros(m.num_frames, bool)
                for d in defects:
                    if d["action"] == "repair":
                        fixed[d["frames"][0]:d["frames"][1]] = True
                for s, e in truth:
                    gt = np.zeros(m.num_frames, bool)
                    gt[s:e] = True
                    gt_frames += int(gt.sum())
                    rep_here = gt & fixed & kept
                    repaired += int(rep_here.sum())
                    cut += int((gt & ~kept).sum())
                    if rep_here.any():
                        err = np.linalg.norm(got[rep_here] - ref[rep_here], axis=-1)  # [n, J]
                        errors += err.mean(-1).tolist()
                        worst += err.max(-1).tolist()
            good = rows.get((kind, mag), {}).pop("_good", 0)
            rows[(kind, mag)] = {
                "kind": kind, "magnitude": mag, "detector": anomalies.DETECTOR[kind], "trials": trials,
                "recall": hits / max(found, 1),
                "recall_any_kind": (any_hits if kind != "sign_flip" else hits) / max(found, 1),
                "precision": (good / flagged) if flagged else (1.0 if kind == "sign_flip" else None),
                "flagged_ranges": flagged, "gt_frames": gt_frames,
                "gt_repaired": repaired / max(gt_frames, 1), "gt_cut": cut / max(gt_frames, 1),
                "repair_mpjpe_cm": 100 * float(np.mean(errors)) if errors else None,
                "repair_max_cm_p95": 100 * float(np.percentile(worst, 95)) if worst else None,
                "repair_frames_within_1cm": float(np.mean(np.array(errors) < 0.01)) if errors else None,
                "seconds": time.perf_counter() - t0}
    return {f"{k} {m:g}": v for (k, m), v in rows.items()}


def settings_for(window: int = 32, **limits) -> prepare.Settings:
    th = dataclasses.replace(clean.Thresholds(), **limits)
    return prepare.Settings(window=window, clean="repair", clean_limits=tuple(th.__dict__.items()),
                            dedup=False)
