"""Page faults and kernel time of a training run, with and without ``motionjax.malloc``.

    python scripts/bench_page_faults.py [--config experiments/autoencoder.py] [--steps 300] \\
        [--repeats 2] [--out results/page_faults]

Runs ``scripts/train.py`` for ``--steps`` steps (one evaluation, at the end) alternately with the
allocator as glibc leaves it (``MOTIONJAX_MALLOC=system``) and as ``motionjax.malloc`` sets it, so
both see the same load; reads each child's minor page faults, user and system CPU seconds and peak RSS
from ``wait4``, and its steps/s and training seconds from the run's ``summary.json``. Prints a table
(the median per setting, and the ratio) and writes ``page_faults.json``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"glibc default": "system", "motionjax.malloc": ""}
FIELDS = ("minor_faults", "user_s", "system_s", "peak_rss_mb", "steps_per_s", "train_s")


def one_run(config: str, steps: int, malloc: str, workdir: Path) -> dict:
    env = dict(os.environ, MOTIONJAX_MALLOC=malloc)
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"--config={config}", f"--workdir={workdir}",
           f"--config.train.steps={steps}", f"--config.train.eval_every={steps}",
           f"--config.train.checkpoint_every={steps}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({os.waitstatus_to_exitcode(status)})")
    summary = json.loads((workdir / "summary.json").read_text())
    return {"minor_faults": usage.ru_minflt, "user_s": usage.ru_utime, "system_s": usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "steps_per_s": summary["steps_per_s"], "train_s": summary["train_s"],
            "best_value": summary.get("best_value")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="experiments/autoencoder.py")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="results/page_faults")
    args = ap.parse_args()
    runs = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, value in SETTINGS.items():
                print(f"[{r + 1}/{args.repeats}] {name} ...", flush=True)
                runs[name].append(one_run(args.config, args.steps, value, Path(tmp) / f"{value or 'mj'}{r}"))
                print("   ", {k: runs[name][-1][k] for k in FIELDS}, flush=True)
    med = {name: {k: float(np.median([x[k] for x in rs])) for k in FIELDS} for name, rs in runs.items()}
    ref, new = med["glibc default"], med["motionjax.malloc"]
    print(f"\n{args.config}, {args.steps} steps, median of {args.repeats} "
          "(ratio: motionjax.malloc / default)")
    print(f"| {'':18s} | " + " | ".join(f"{k:>12s}" for k in FIELDS) + " |")
    for name, row in [*med.items(), ("ratio", {k: new[k] / ref[k] for k in FIELDS})]:
        print(f"| {name:18s} | " + " | ".join(f"{row[k]:12.4g}" for k in FIELDS) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "page_faults.json").write_text(json.dumps(
        {"config": args.config, "steps": args.steps, "runs": runs, "median": med}, indent=1))
    print(f"wrote {out / 'page_faults.json'}")


if __name__ == "__main__":
    main()
