"""Corpus preparation at scale: frames/s and peak memory of ``prepare`` on Bandai-1 and on a synthetic
BVH corpus the size of Bandai Namco's second dataset (~400k frames in ~3,000 clips), and the Grain
loader's frames/s on Bandai-1 against what a training step consumes. Two ratios measured in one run:
prepare with cleaning (``clean="repair"``) against without (``"off"``) on Bandai-1, and with dedup
against without on a corpus of repeated takes (~3,000 short clips: 100 actions x 30 takes, each take
standing still before and after its action, the same idle pose in every clip, and 20 planted copies
of each kind: exact, noised, mirrored, resampled, re-exported).

    python benchmarks/bench_prepare.py [--clips 3000] [--frames 134] [--workers 2] [--repeats 3] \
        [--corpora bandai,synthetic,takes] [--skip-loader] [--out results/bench_prepare.json]
    python benchmarks/bench_prepare.py --corpora scale --scale 3000,30000 --repeats 1 --skip-loader \
        --out results/bench_prepare_scale.json     # docs/scale.md: the 30,000-clip prepare

``scale``: the synthetic corpus at each ``--scale`` size, with and without dedup (frames/s against the
smallest size, peak RSS growth against the clip count, dedup's share of the CPU).

Each prepare runs in a fresh subprocess (``--force`` into a temporary directory), so its peak RSS is
its own: the main process's and the largest worker's are reported, and their sum bounds the total.
The synthetic corpus is written once as BVH (centimetres, the Bandai skeleton) under
``data_cache/bench/``, so the whole path runs: parse, unit detection, dedup, shards, stats.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BANDAI = ROOT.parent / "shared" / "data" / "bandai-namco-1" / "data"
SPLITS = (("train", "rest"), ("validation", "stratified:content:0.1"), ("test", "stratified:content:0.1"))

_CHILD = """
import json, resource, sys, time
from motionjax.data import prepare
src, out, workers, splits = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
fields = json.loads(sys.argv[5])
if __name__ == "__main__":
    t = time.perf_counter()
    info = prepare.prepare(src, out, settings=prepare.Settings(splits=tuple(map(tuple, splits)), **fields),
                           workers=workers, force=True, progress=False)
    wall = time.perf_counter() - t
    kept = sorted({c for segs in info.splits.values() for c, _, _ in segs})
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": wall, "clips": len(info.names), "kept": len(kept),
                      "frames": sum(info.frames), "skipped": len(info.skipped),
                      "cpu_main_s": me.ru_utime + me.ru_stime, "cpu_workers_s": kids.ru_utime + kids.ru_stime,
                      "split_clips": {k: len({c for c, _, _ in v}) for k, v in info.splits.items()},
                      "dedup": info.dedup,
                      "cleaning": info.cleaning and prepare.cleaning_line(info.cleaning).strip(),
                      "rss_main_mb": me.ru_maxrss / 1024, "rss_worker_mb": kids.ru_maxrss / 1024}))
"""


def synthetic_bvh_corpus(clips: int, frames: int) -> Path:
    """``clips`` BVH files of ``frames`` frames on the Bandai skeleton (cm), written once."""
    from motionjax.data import synthetic
    from motionjax.formats import write_bvh

    out = ROOT / "data_cache" / "bench" / f"synthetic_bvh_{clips}x{frames}"
    done = out / "COMPLETE"
    if done.exists():
        return out
    info_dir = ROOT / "data_cache" / "bench" / "bandai_skeleton"
    from motionjax.data import prepare
    if not (info_dir / prepare.INDEX).exists():
        prepare.prepare(str(BANDAI / "*.bvh"), info_dir, settings=prepare.Settings(splits=SPLITS),
                        progress=False)
    skeleton = prepare.load_info(info_dir).skeleton
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm
    for m in tqdm(synthetic.synthetic_motions(clips, frames=frames, fps=30.0, seed=1, skeleton=skeleton),
                  total=clips, desc="writing synthetic BVH", unit="clip"):
        write_bvh(out / f"{m.name}.bvh", m, scale=0.01)
    done.write_text("")
    return out


def repeated_takes_corpus(actions: int = 100, takes: int = 30, frames: int = 134, copies: int = 20,
                          idle: tuple = (40, 30), variation: float = 0.1, seed: int = 2) -> Path:
    """The repeated-takes corpus (:func:`motionjax.data.synthetic.repeated_takes`) as BVH (cm), written
    once: ``idle[0]`` frames standing, the action, ``idle[1]`` standing. On the DeepMimic body, whose rest
    pose stands upright (the procedural motion is joint angles around the rest pose) and whose left and
    right joint frames mirror each other (mirrored copies are exact mirror images).
    """
    from motionjax.core.skeleton import deepmimic_humanoid
    from motionjax.data import synthetic
    from motionjax.formats import write_bvh

    default = (idle, variation, seed) == ((40, 30), 0.1, 2)
    tag = "" if default else f"_i{idle[0]}-{idle[1]}_v{variation}_s{seed}"
    out = ROOT / "data_cache" / "bench" / f"takes_bvh_{actions}x{takes}x{frames}_c{copies}{tag}"
    done = out / "COMPLETE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm
    motions = synthetic.repeated_takes(actions, takes, frames=frames, idle=idle[0], idle_end=idle[1],
                                       variation=variation, seed=seed, copies=copies,
                                       skeleton=deepmimic_humanoid())
    for m in tqdm(motions, desc="writing repeated takes BVH", unit="clip"):
        write_bvh(out / f"{m.name}.bvh", m, scale=0.01)
    done.write_text("")
    return out


def prepare_run(source: str, workers: int, **fields) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-c", _CHILD, source, str(Path(tmp) / "out"), str(workers),
                              json.dumps(SPLITS), json.dumps(fields)],
                             capture_output=True, text=True, cwd=ROOT, check=False)
    if res.returncode:
        raise RuntimeError(f"prepare of {source} failed:\n{res.stderr[-3000:]}")
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row["frames_per_s"] = row["frames"] / row["wall_s"]
    return row


def loader_vs_step(batches: int = 30) -> dict:
    """The streamed input's frames/s alone on Bandai-1 (Grain spans, augmented on the device) vs the
    default model's train-step frames/s."""
    import jax

    from experiments import deepmimic_denoise
    from motionjax.configs import base
    from motionjax.data import feed, pipeline
    from motionjax.train import batch_finder

    config = base.use_bandai(deepmimic_denoise.get_config(), window=32)
    info = pipeline.dataset_info(config.data)
    it = feed.Feed(config.data, info, seed=0, mode="stream")  # the Grain tier: the host's share of the work
    live = [jax.block_until_ready(next(it)) for _ in range(3)]
    t = time.perf_counter()
    for _ in range(batches):
        live = [*live[-2:], next(it)]  # XLA:CPU: a batch lives until its program has run
    jax.block_until_ready(live)
    loader = batches * config.data.batch_size * config.data.window / (time.perf_counter() - t)
    it.close()
    probe = batch_finder.StepProbe.for_trainer(config, info)
    per_device = config.data.batch_size // probe.data_size
    step_fps = config.data.batch_size * config.data.window / probe.step_time(per_device, steps=batches)
    return {"loader_frames_per_s": loader, "step_frames_per_s": step_fps, "ratio": loader / step_fps}


def _scale_ratios(rows: dict, sizes: list[int]) -> dict:
    """Per size against the smallest: frames/s, peak RSS (main + largest worker) and clips; dedup's CPU."""
    base = rows[f"scale {sizes[0]}"]
    rss = lambda r: r["rss_main_mb"] + r["rss_worker_mb"]
    out = {}
    for n in sizes:
        on, off = rows[f"scale {n}"], rows[f"scale {n} no dedup"]
        cpu_on, cpu_off = (r["cpu_main_s"] + r["cpu_workers_s"] for r in (on, off))
        out[n] = {"frames": on["frames"], "frames_per_s": on["frames_per_s"],
                  "frames_per_s_vs_smallest": on["frames_per_s"] / base["frames_per_s"],
                  "rss_mb": rss(on), "rss_vs_smallest": rss(on) / rss(base),
                  "clips_vs_smallest": n / sizes[0],
                  "rss_no_dedup_mb": rss(off), "dedup_cpu_share": 1 - cpu_off / cpu_on,
                  "dedup_cpu_s": cpu_on - cpu_off, "wall_s": on["wall_s"]}
        r = out[n]
        print(f"scale {n} clips ({r['frames']:,} frames): {r['frames_per_s']:,.0f} frames/s "
              f"({r['frames_per_s_vs_smallest']:.2f}x the {sizes[0]}-clip rate), peak RSS "
              f"{r['rss_mb']:.0f} MB "
              f"({r['rss_vs_smallest']:.2f}x at {r['clips_vs_smallest']:.0f}x the clips; "
              f"{r['rss_no_dedup_mb']:.0f} MB without dedup), dedup {100 * r['dedup_cpu_share']:.1f}% of "
              f"the CPU ({r['dedup_cpu_s']:.0f} s)")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clips", type=int, default=3000)
    p.add_argument("--frames", type=int, default=134, help="frames per synthetic clip (3000 x 134 ≈ 400k)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="runs per corpus; the median run is reported")
    p.add_argument("--corpora", default="bandai,synthetic,takes", help="which rows to run")
    p.add_argument("--takes-frames", type=int, default=134, help="frames per repeated take")
    p.add_argument("--takes-idle", default="40,30", help="frames standing before,after each take's action")
    p.add_argument("--takes-variation", type=float, default=0.1, help="take-to-take joint variation (rad)")
    p.add_argument("--takes-seed", type=int, default=2)
    p.add_argument("--scale", default="3000,30000", help="clip counts of the 'scale' rows")
    p.add_argument("--skip-loader", action="store_true", help="skip the loader vs step comparison")
    p.add_argument("--out", default="results/bench_prepare.json")
    args = p.parse_args()
    if not BANDAI.is_dir():
        raise SystemExit(f"error: {BANDAI} not found (the Bandai-1 corpus of ../shared/data)")
    chosen = set(args.corpora.split(","))
    sources = {}  # row -> (source, Settings fields)
    if "bandai" in chosen:
        sources["bandai-1"] = (str(BANDAI / "*.bvh"), {})
        sources["bandai-1 clean off"] = (str(BANDAI / "*.bvh"), {"clean": "off"})
    if "synthetic" in chosen:
        sources[f"synthetic {args.clips} clips"] = (str(synthetic_bvh_corpus(args.clips, args.frames)), {})
    sizes = [int(v) for v in args.scale.split(",")] if "scale" in chosen else []
    for n in sizes:
        corpus = str(synthetic_bvh_corpus(n, args.frames))
        sources[f"scale {n}"] = (corpus, {})
        sources[f"scale {n} no dedup"] = (corpus, {"dedup": False})
    if "takes" in chosen:
        takes = str(repeated_takes_corpus(frames=args.takes_frames, variation=args.takes_variation,
                                          idle=tuple(int(v) for v in args.takes_idle.split(",")),
                                          seed=args.takes_seed))
        sources["repeated takes"] = (takes, {})
        sources["repeated takes no dedup"] = (takes, {"dedup": False})
    runs = {name: [] for name in sources}
    for _ in range(args.repeats):  # interleaved, so a slow spell of a shared host hits every row alike
        for name, (source, fields) in sources.items():
            runs[name].append(prepare_run(source, args.workers, **fields))
    rows = {}
    for name, rs in runs.items():  # the median run by frames/s, with every run's frames/s beside it
        rows[name] = dict(sorted(rs, key=lambda r: r["frames_per_s"])[len(rs) // 2],
                          runs_frames_per_s=[r["frames_per_s"] for r in rs])
    print(f"{'corpus':<26}{'clips':>7}{'kept':>7}{'frames':>10}{'wall s':>9}{'frames/s':>10}{'CPU s':>8}"
          f"{'RSS main MB':>13}{'RSS worker MB':>15}   frames/s of each run")
    for name, r in rows.items():
        cpu = r["cpu_main_s"] + r["cpu_workers_s"]
        print(f"{name:<26}{r['clips']:>7}{r['kept']:>7}{r['frames']:>10}{r['wall_s']:>9.1f}"
              f"{r['frames_per_s']:>10,.0f}{cpu:>8.1f}{r['rss_main_mb']:>13.0f}{r['rss_worker_mb']:>15.0f}   "
              + " ".join(f"{v:,.0f}" for v in r["runs_frames_per_s"]))
    ratios = {}
    if "bandai-1" in rows:
        on, off = rows["bandai-1"], rows["bandai-1 clean off"]
        # Per repeat (the two ran back to back), then the median: a loaded host's slow spells hit a pair.
        paired = sorted(a / b for a, b in zip(on["runs_frames_per_s"], off["runs_frames_per_s"], strict=True))
        ratios["clean_frames_per_s_ratio"] = paired[len(paired) // 2]
        ratios["clean_frames_per_s_ratios"] = paired
        cpu_on, cpu_off = (r["cpu_main_s"] + r["cpu_workers_s"] for r in (on, off))
        ratios["clean_cpu_ratio"] = cpu_off / cpu_on
        print(f"Bandai-1 cleaning on / off: {ratios['clean_frames_per_s_ratio']:.3f} of the frames/s (median "
              f"of the repeats' ratios {[round(r, 2) for r in paired]}; target >= 0.85), CPU off / on "
              f"{ratios['clean_cpu_ratio']:.3f}; {on['cleaning']}")
    if "repeated takes" in rows:
        on, off = rows["repeated takes"], rows["repeated takes no dedup"]
        cpu_on, cpu_off = (r["cpu_main_s"] + r["cpu_workers_s"] for r in (on, off))
        ratios["dedup_cpu_share"] = 1 - cpu_off / cpu_on
        ratios["dedup_rss_main_extra_mb"] = on["rss_main_mb"] - off["rss_main_mb"]
        print(f"repeated takes: dedup {100 * ratios['dedup_cpu_share']:.1f}% of prepare CPU (target <= 25%), "
              f"+{ratios['dedup_rss_main_extra_mb']:.0f} MB peak RSS (target <= 300); kept {on['kept']} of "
              f"{on['clips']}; splits {on['split_clips']}; dedup {on['dedup']}")
    if sizes:
        ratios["scale"] = _scale_ratios(rows, sizes)
    load = None if args.skip_loader else loader_vs_step()
    if load:
        print(f"Bandai-1 loader {load['loader_frames_per_s']:,.0f} frames/s vs train step "
              f"{load['step_frames_per_s']:,.0f} frames/s: {load['ratio']:.1f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"workers": args.workers, "prepare": rows, "ratios": ratios, "loader": load}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
