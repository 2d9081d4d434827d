"""Corpus preparation at scale: frames/s and peak memory of ``prepare`` on Bandai-1 and on a synthetic
BVH corpus the size of Bandai Namco's second dataset (~400k frames in ~3,000 clips), and the Grain
loader's frames/s on Bandai-1 against what a training step consumes.

    python scripts/bench_prepare.py [--clips 3000] [--frames 134] [--workers 2] [--repeats 3] \
        [--out results/bench_prepare.json]

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
if __name__ == "__main__":
    t = time.perf_counter()
    info = prepare.prepare(src, out, settings=prepare.Settings(splits=tuple(map(tuple, splits))),
                           workers=workers, force=True, progress=False)
    wall = time.perf_counter() - t
    kept = sorted({c for segs in info.splits.values() for c, _, _ in segs})
    print(json.dumps({"wall_s": wall, "clips": len(info.names), "kept": len(kept),
                      "frames": sum(info.frames), "skipped": len(info.skipped),
                      "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
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


def prepare_run(source: str, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-c", _CHILD, source, str(Path(tmp) / "out"), str(workers),
                              json.dumps(SPLITS)],
                             capture_output=True, text=True, cwd=ROOT, check=False)
    if res.returncode:
        raise RuntimeError(f"prepare of {source} failed:\n{res.stderr[-3000:]}")
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row["frames_per_s"] = row["frames"] / row["wall_s"]
    return row


def loader_vs_step(batches: int = 30) -> dict:
    """Grain loader frames/s alone on Bandai-1 vs the default model's train-step frames/s."""
    from experiments import base, deepmimic_denoise
    from motionjax.data import pipeline
    from motionjax.train import batch_finder

    config = base.use_bandai(deepmimic_denoise.get_config(), window=32)
    info = pipeline.dataset_info(config.data)
    it = pipeline.make_train_iterator(config.data, info, seed=0)
    for _ in range(3):
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    loader = batches * config.data.batch_size * config.data.window / (time.perf_counter() - t)
    it.close()
    probe = batch_finder.StepProbe.for_trainer(config, info)
    per_device = config.data.batch_size // probe.data_size
    step_fps = config.data.batch_size * config.data.window / probe.step_time(per_device, steps=batches)
    return {"loader_frames_per_s": loader, "step_frames_per_s": step_fps, "ratio": loader / step_fps}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clips", type=int, default=3000)
    p.add_argument("--frames", type=int, default=134, help="frames per synthetic clip (3000 x 134 ≈ 400k)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="runs per corpus; the median run is reported")
    p.add_argument("--out", default="results/bench_prepare.json")
    args = p.parse_args()
    if not BANDAI.is_dir():
        raise SystemExit(f"error: {BANDAI} not found (the Bandai-1 corpus of ../shared/data)")
    corpus = synthetic_bvh_corpus(args.clips, args.frames)
    sources = {"bandai-1": str(BANDAI / "*.bvh"), f"synthetic {args.clips} clips": str(corpus)}
    runs = {name: [] for name in sources}
    for _ in range(args.repeats):  # interleaved, so a slow spell of a shared host hits both corpora
        for name, source in sources.items():
            runs[name].append(prepare_run(source, args.workers))
    rows = {}
    for name, rs in runs.items():  # the median run by frames/s, with every run's frames/s beside it
        rows[name] = dict(sorted(rs, key=lambda r: r["frames_per_s"])[len(rs) // 2],
                          runs_frames_per_s=[r["frames_per_s"] for r in rs])
    print(f"{'corpus':<24}{'clips':>7}{'kept':>7}{'frames':>10}{'wall s':>9}{'frames/s':>10}"
          f"{'RSS main MB':>13}{'RSS worker MB':>15}   frames/s of each run")
    for name, r in rows.items():
        print(f"{name:<24}{r['clips']:>7}{r['kept']:>7}{r['frames']:>10}{r['wall_s']:>9.1f}"
              f"{r['frames_per_s']:>10,.0f}{r['rss_main_mb']:>13.0f}{r['rss_worker_mb']:>15.0f}   "
              + " ".join(f"{v:,.0f}" for v in r["runs_frames_per_s"]))
    load = loader_vs_step()
    print(f"Bandai-1 loader {load['loader_frames_per_s']:,.0f} frames/s vs train step "
          f"{load['step_frames_per_s']:,.0f} frames/s: {load['ratio']:.1f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"workers": args.workers, "prepare": rows, "loader": load}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
