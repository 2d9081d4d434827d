"""Page faults and kernel time of a training run under each host-allocator setting.

    python benchmarks/bench_page_faults.py [--config experiments/autoencoder.py] [--steps 300] \\
        [--repeats 2] [--settings "glibc default,one arena,huge pages"] [--flag=--config.X=Y] \\
        [--out results/page_faults]

Runs ``scripts/train.py`` for ``--steps`` steps (one evaluation, at the end) with each setting in
turn, ``--repeats`` rounds, so all see the same load: ``MOTIONJAX_MALLOC`` = ``system`` (glibc as it
is), ``one_arena`` (no mmapped chunks, one lock) and ``hugepages`` (the default: mmapped chunks in
transparent huge pages). Reads each child's minor page faults, user and system
CPU seconds and peak RSS from ``wait4``, and its steps/s and training seconds from the run's
``summary.json``. Prints a table (the median per setting, and each one's ratio to the first) and
writes ``page_faults.json``.
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
# name: the child's MOTIONJAX_MALLOC (motionjax/malloc.py).
SETTINGS = {"glibc default": "system", "one arena": "one_arena", "huge pages": "hugepages"}
FIELDS = ("minor_faults", "user_s", "system_s", "peak_rss_mb", "steps_per_s", "train_s")


def one_run(config: str, steps: int, malloc: str, workdir: Path, flags=()) -> dict:
    # Without this process's GLIBC_TUNABLES: a huge-page tunable inherited here would reach every arm.
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {"MOTIONJAX_MALLOC": malloc}
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), f"--config={config}", f"--workdir={workdir}",
           f"--config.train.steps={steps}", f"--config.train.eval_every={steps}",
           f"--config.train.checkpoint_every={steps}", *flags]
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
    ap.add_argument("--flag", action="append", default=[], help="a trainer flag for every run, e.g. "
                    "--flag=--config.train.optimizer=adamw")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {list(SETTINGS)}")
    args = ap.parse_args()
    chosen = args.settings.split(",")
    if unknown := set(chosen) - set(SETTINGS):
        ap.error(f"unknown --settings {sorted(unknown)}; expected some of {list(SETTINGS)}")
    runs = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for i, name in enumerate(chosen):
                print(f"[{r + 1}/{args.repeats}] {name} ...", flush=True)
                runs[name].append(one_run(args.config, args.steps, SETTINGS[name], Path(tmp) / f"s{i}r{r}",
                                          args.flag))
                print("   ", {k: runs[name][-1][k] for k in FIELDS}, flush=True)
    med = {name: {k: float(np.median([x[k] for x in rs])) for k in FIELDS} for name, rs in runs.items()}
    ref = med[chosen[0]]
    ratios = [(f"{name} / first", {k: med[name][k] / ref[k] for k in FIELDS}) for name in chosen[1:]]
    print(f"\n{args.config} {' '.join(args.flag)}, {args.steps} steps, median of {args.repeats}")
    print(f"| {'':26s} | " + " | ".join(f"{k:>12s}" for k in FIELDS) + " |")
    for name, row in [*med.items(), *ratios]:
        print(f"| {name:26s} | " + " | ".join(f"{row[k]:12.4g}" for k in FIELDS) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "page_faults.json").write_text(json.dumps(
        {"config": args.config, "flags": args.flag, "steps": args.steps,
         "settings": {n: SETTINGS[n] for n in chosen}, "runs": runs, "median": med}, indent=1))
    print(f"wrote {out / 'page_faults.json'}")


if __name__ == "__main__":
    main()
