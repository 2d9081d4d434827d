"""One config, one change at a time: validation and ood_validation MPJPE side by side.

    python scripts/ablations.py --config experiments/autoencoder.py --steps 1500 \\
        --ablate no_head=model.position_head=False --ablate no_aug=data.mirror_prob=0,data.speed_range=1 \\
        [--set KEY=VALUE ...] [--seed 0] [--out results/ablations]

Each ablation is a ``scripts/train.py`` run of the config with its overrides (``KEY=VALUE``, comma
separated) in ``--out/NAME``; ``base`` (no override) always runs first; ``--set`` overrides apply to
every run. A finished run (its ``summary.json``) is reused, so the command resumes. Scores are of
each run's best checkpoint by the config's ``train.best_metric``; the test splits are not read.
Prints the table and writes ``ablations.json`` and ``ablations.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(config: str, workdir: Path, steps: int, seed: int, overrides: list[str]) -> dict:
    summary = workdir / "summary.json"
    if not summary.exists():
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"--config={config}",
               f"--workdir={workdir}", f"--config.train.steps={steps}", f"--config.seed={seed}",
               *(f"--config.{o}" for o in overrides)]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    doc = json.loads(summary.read_text())
    history = doc["history"]
    step = doc["best_step"]
    at = lambda split: next(v for s, v in history[f"eval/{split}/mpjpe"] if s == step)
    out = {"best_step": step, "steps": doc["steps"], "train_s": doc["train_s"], "params": doc["params"]}
    for split in ("validation", "ood_validation"):
        if f"eval/{split}/mpjpe" in history:
            out[split] = at(split)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ablate", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    p.add_argument("--out", default="results/ablations")
    args = p.parse_args()
    ablations = {"base": []}
    for spec in args.ablate:
        name, _, overrides = spec.partition("=")
        if not name or "=" not in overrides:
            raise SystemExit(f"error: --ablate {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE]")
        ablations[name] = overrides.split(",")
    out = ROOT / args.out
    rows = {name: {"overrides": o, **_run(args.config, out / name, args.steps, args.seed, args.set + o)}
            for name, o in ablations.items()}
    base = rows["base"]
    lines = ["| ablation | overrides | validation cm | ood_validation cm | OOD / ID | vs base (ID, OOD) |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ratio = r["ood_validation"] / r["validation"]
        change = lambda split, r=r: f"{100 * (r[split] / base[split] - 1):+.1f}%"
        delta = f"{change('validation')}, {change('ood_validation')}" if name != "base" else "-"
        lines.append(f"| {name} | {', '.join(r['overrides']) or '-'} | {r['validation']:.3f} | "
                     f"{r['ood_validation']:.3f} | {ratio:.2f} | {delta} |")
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    doc = {"config": args.config, "steps": args.steps, "seed": args.seed, "set": args.set, "rows": rows}
    (out / "ablations.json").write_text(json.dumps(doc, indent=1))
    (out / "ablations.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'ablations.json'}, {out / 'ablations.md'}")


if __name__ == "__main__":
    main()
