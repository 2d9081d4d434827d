"""Calibrating the papers' foot-skating ratio for a skeleton on its real motion (issue #62 item 3).

``python benchmarks/skating_band.py [--data data_cache/bandai2_w64_unseen_clean] [--split train]
[--joints Foot,Toes,Toes_end] [--bands 0.02,0.03,0.04,0.05] [--stride 16]`` cuts the split's clips of a
prepared dataset into windows (canonical frame: floor at the window's lowest joint, as the generation
experiment scores them; padding frames left out), and prints, per candidate foot joint (the left/right
pair ``Toes_{s}``: ``Toes_L``, ``Toes_R``) and height band, the skating ratio of GMD / OmniControl
(:func:`motionjax.evaluation.plausibility.skating_pairs`: in the band in two adjacent frames and faster
than 0.5 m/s; with and without the 5-frame mean speed) and the share of foot-frames in the band. Real
motion barely slides its planted feet, so its ratio counts the band catching a swing foot: the band is
chosen as the widest whose real-motion ratio stays small while the contacts it sees stay many.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv=None) -> dict:
    import jax.numpy as jnp

    from experiments import autoencoder
    from motionjax.data.info import load_info
    from motionjax.evaluation import intervals, plausibility
    from motionjax.generation import latents

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data_cache/bandai2_w64_unseen_clean")
    p.add_argument("--split", default="train")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--joints", default="Foot_{s},Toes_{s},Toes_{s}_end",
                   help="candidate joints, {s} the side (L, R)")
    p.add_argument("--bands", default="0.02,0.03,0.04,0.05")
    p.add_argument("--stride", type=int, default=16, help="frames between windows")
    p.add_argument("--out", default="", help="JSON file of the table")
    args = p.parse_args(argv)
    cfg = autoencoder.get_config("bandai").data
    cfg.update(window=args.window, chunk=16)
    info = load_info(args.data)
    w = latents.split_windows(cfg, info, args.split, args.stride)
    _, _, pos = latents.motion(info, w.features, w.offsets)
    sk, fps, up = info.skeleton, float(info.fps), info.skeleton.up_axis
    rows = []
    for joint in args.joints.split(","):
        pair = [sk.index(joint.format(s=side)) for side in "LR"]
        feet = pos[:, :, pair]  # [K, T, 2, 3]
        step = np.linalg.norm(np.delete(feet[:, 1:] - feet[:, :-1], up, axis=-1), axis=-1)
        for band in map(float, args.bands.split(",")):
            skate, skate5, pairs = (np.asarray(x, np.float64) for x in plausibility.skating_pairs(
                jnp.asarray(feet[..., up]), jnp.asarray(step), jnp.asarray(w.valid > 0), fps, band))
            counts = pairs.sum(1)
            ratio = intervals.mean_interval(skate.sum(1) / np.maximum(counts, 1), w.clip, counts)
            ratio5 = intervals.mean_interval(skate5.sum(1) / np.maximum(counts, 1), w.clip, counts)
            inside = ((feet[..., up] < band) * (w.valid[..., None] > 0)).sum((1, 2))
            contact = float(inside.sum() / (2 * w.valid.sum()))
            rows.append({"joint": joint, "band_m": band, "skate_ratio": ratio, "skate_ratio_avg5": ratio5,
                         "contact": contact, "median_height_m": float(np.median(feet[..., up][w.valid > 0]))})
            print(f"{joint:12s} {100 * band:4.0f} cm  ratio {intervals.fmt(ratio, 3)}  5-frame "
                  f"{intervals.fmt(ratio5, 3)}  contact {contact:.2f}  (median height "
                  f"{100 * rows[-1]['median_height_m']:.1f} cm)", flush=True)
    summary = {"command": "python benchmarks/skating_band.py " + " ".join(argv or sys.argv[1:]),
               "data": args.data, "split": args.split, "windows": len(w),
               "clips": int(len(np.unique(w.clip))), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
