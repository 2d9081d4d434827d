"""The training effect of cleaning: Bandai-1 with 10% of its training clips corrupted, the autoencoder
trained with and without ``data.clean``, against the untouched corpus (docs/data.md "Cleaning").

    python benchmarks/clean_effect.py [--steps 3000] [--seeds 0,1] [--fraction 0.1] \\
        [--out results/clean_effect]

1. The untouched corpus is prepared as the autoencoder's config does; its training split names the
   clips that may be corrupted (validation and test stay untouched: the script checks that the
   corrupted corpus draws the same validation and test clips).
2. ``--fraction`` of the training clips (seeded) get two studio defects each, kinds drawn from
   :data:`MIX` at the middle magnitude of :data:`motionjax.data.anomalies.MAGNITUDES`, written as BVH
   with the original hierarchy (``formats.write_bvh_like``) beside copies of the label sidecars.
3. Three conditions x seeds, each a ``scripts/train.py`` run of ``experiments/autoencoder.py`` at
   ``--steps``: ``untouched`` (cleaning on), ``corrupted_clean`` (cleaning on), ``corrupted_off``.

Prints the table (validation MPJPE of the best checkpoint, and test of that checkpoint) and writes
``clean_effect.json``; a finished run (its ``summary.json``) is reused, so the command resumes.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import autoencoder  # noqa: E402
from motionjax.data import anomalies, corpus, pipeline, prepare  # noqa: E402
from motionjax.formats import load  # noqa: E402
from motionjax.formats.bvh import read_bvh, write_bvh_like  # noqa: E402

# What a studio delivers that a BVH file can carry (NaN files are the readers' rejections and sign
# flips vanish in Euler angles; no Bandai-1 file has varying position channels to stretch).
MIX = ("pop", "twist", "teleport", "frozen", "sink", "float")
CONFIG = "experiments/autoencoder.py"


def corrupt_corpus(src: Path, dst: Path, names: list[str], seed: int, defects: int = 2) -> list[dict]:
    """Copy the Bandai-1 layout (``data/`` with label sidecars, ``cfg/``) to ``dst``, the clips in
    ``names`` (file stems) each with ``defects`` injected defects. Returns what was planted."""
    rng = np.random.default_rng(seed)
    shutil.copytree(src.parent / "cfg", dst.parent / "cfg", dirs_exist_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    planted = []
    for path in sorted(src.glob("*.bvh")):
        shutil.copy2(path.with_suffix(".json"), dst / path.with_suffix(".json").name)
        if path.stem not in names:
            shutil.copy2(path, dst / path.name)
            continue
        original = read_bvh(path)
        motion, decided = corpus.conform(load(path))
        found = []
        for kind in rng.choice(MIX, size=defects, replace=False):
            magnitude = anomalies.MAGNITUDES[kind][1]
            motion, ranges = anomalies.inject(motion, str(kind), magnitude, rng)
            found.append({"kind": str(kind), "magnitude": magnitude, "frames": [list(r) for r in ranges]})
        write_bvh_like(dst / path.name, path, corpus.unconform(motion, original, decided["units"]))
        planted.append({"file": path.name, "frames": motion.num_frames, "defects": found})
    return planted


def _split_names(data_dir: Path) -> dict[str, set]:
    index = json.loads((data_dir / prepare.INDEX).read_text())
    names = [c["name"] for c in index["clips"]]
    return {split: {names[c] for c, _, _ in segs} for split, segs in index["splits"].items()}


def _train(workdir: Path, seed: int, steps: int, overrides: list[str]) -> dict:
    summary = workdir / "summary.json"
    if not summary.exists():
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"--config={CONFIG}",
               f"--workdir={workdir}", f"--config.seed={seed}", f"--config.train.steps={steps}", *overrides]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    doc = json.loads(summary.read_text())
    return {"seed": seed, "validation_cm": doc["best_value"], "best_step": doc["best_step"],
            "test_cm": doc["results"]["test"]["clean"]["model"]["mpjpe"], "train_s": doc["train_s"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--fraction", type=float, default=0.1, help="share of the training clips corrupted")
    p.add_argument("--corrupt-seed", type=int, default=0)
    p.add_argument("--out", default="results/clean_effect")
    args = p.parse_args()
    out = ROOT / args.out
    seeds = [int(s) for s in args.seeds.split(",")]
    c = autoencoder.get_config("bandai")
    src = ROOT / c.data.source
    pipeline.dataset_info(c.data)  # prepared as the untouched runs will find it
    reference = _split_names(ROOT / c.data.dir)
    train_names = sorted(reference["train"])
    rng = np.random.default_rng(args.corrupt_seed)
    chosen = sorted(rng.choice(train_names, size=int(round(args.fraction * len(train_names))), replace=False))
    tag = f"bandai1_corrupt{round(100 * args.fraction)}"
    corrupted = ROOT / "data_cache" / tag / "data"
    planted_file = out / "planted.json"
    if not planted_file.exists():
        planted = corrupt_corpus(src, corrupted, chosen, args.corrupt_seed)
        out.mkdir(parents=True, exist_ok=True)
        planted_file.write_text(json.dumps(planted, indent=1))
    planted = json.loads(planted_file.read_text())
    print(f"{len(planted)} of {len(train_names)} training clips corrupted ({corrupted})", flush=True)
    conditions = {
        "untouched": [],
        "corrupted_clean": [f"--config.data.source={corrupted}",
                            f"--config.data.dir=data_cache/{tag}_w64_clean"],
        "corrupted_off": [f"--config.data.source={corrupted}", f"--config.data.dir=data_cache/{tag}_w64_off",
                          "--config.data.clean=off"],
    }
    runs = {}
    for seed in seeds:  # seed by seed: a partial result compares all conditions
        for name, overrides in conditions.items():
            runs.setdefault(name, []).append(_train(out / f"{name}_s{seed}", seed, args.steps, overrides))
    for name in ("corrupted_clean", "corrupted_off"):
        got = _split_names(ROOT / conditions[name][1].split("=", 1)[1])
        for split in ("validation", "test"):
            if got[split] != reference[split]:
                raise SystemExit(f"error: {name}: its {split} split differs from the untouched corpus's")
    print(f"\n{'condition':<18}{'validation cm (seeds)':>28}{'mean':>7}{'test cm':>9}")
    for name, rs in runs.items():
        val = [r["validation_cm"] for r in rs]
        print(f"{name:<18}{', '.join(f'{v:.3f}' for v in val):>28}{np.mean(val):>7.3f}"
              f"{np.mean([r['test_cm'] for r in rs]):>9.3f}")
    (out / "clean_effect.json").write_text(json.dumps(
        {"steps": args.steps, "fraction": args.fraction, "corrupted_clips": len(planted),
         "training_clips": len(train_names), "mix": MIX, "runs": runs}, indent=1))
    print(f"wrote {out / 'clean_effect.json'}")


if __name__ == "__main__":
    main()
