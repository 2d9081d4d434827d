"""Four processes against one: the same training run on 4 processes x 2 CPU devices and on 1 process
x 8 devices, compared step by step (issue #27: the long comparison; ``tests/test_multiprocess.py``
holds the short one in ``make test``).

    python benchmarks/bench_multiprocess.py [--config experiments/autoencoder.py:deepmimic] [--steps 300] \
        [--modes fp32,fp32_two_level,int8] [--threads 8] [--out results/bench_multiprocess]

Per mode, ``scripts/train.py`` runs the config twice: in one process on 8 virtual CPU devices, and
through ``scripts/launch_local.sh 4`` (2 devices each, gloo collectives). ``fp32``: XLA's all-reduce
over ``data`` (its sum order is the transport's: XLA:CPU's in one process, gloo's across four);
``fp32_two_level``: the explicit fp32 sum over two levels, ordered (``train.grad_reduce_ordered``) (2
devices a host in both runs: a reduce-scatter inside a process, across the 4 each slice summed by its
owner in device order, an all-gather inside); ``int8``: the same with int8 and error feedback across the
4. The Grain pipeline gives each process its block of every global batch (``pipeline.SampleBatch``),
so both runs train on the same windows; mirroring is turned off, as when the recorded figures were
measured (it was then drawn per batch in each process; since #53 it runs on the device from global
keys, the same in both runs). Every process of both runs gets the same XLA:CPU compute pool
(``--threads``, through ``NPROC``): XLA sizes it max(cores, devices in the process), 8 threads in the
one-process run and 2 in each of the four on a 2-core host, and a matmul's work is split by it, so the
same jitted dot on the same inputs differs in its last bits between the two runs (the rotation head's
gradient did, from step 1). Prints, per mode, the largest |loss difference| over the logged steps, the
validation MPJPE of both runs at each evaluation and their largest difference, and the wall time of
each; writes ``bench_multiprocess.json``. Targets (#27): fp32 losses to 1e-5; compressed, the same
validation MPJPE to 1e-3 cm.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWO_LEVELS = ["train.grad_reduce_levels=2", "train.grad_reduce_host_size=2"]
MODES = {"fp32": [],
         "fp32_two_level": [*TWO_LEVELS, "train.grad_reduce_ordered=True"],
         "int8": ["train.grad_reduce=int8", *TWO_LEVELS]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(workdir: Path, flags: list[str], processes: int, threads: int) -> float:
    """One run of scripts/train.py (``processes`` > 1: through launch_local.sh) with ``threads``
    XLA:CPU compute threads in every process; its wall seconds."""
    if (workdir / "summary.json").exists():
        return json.loads((workdir / "wall_s.json").read_text())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if threads:
        env["NPROC"] = str(threads)  # XLA:CPU's compute pool: max(NPROC, devices in the process)
    if processes == 1:
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        cmd = [sys.executable, "scripts/train.py", *flags]
    else:
        env.update(PYTHON=sys.executable, CPU_DEVICES_PER_PROCESS="2", PORT=str(_free_port()),
                   LOG_DIR=str(workdir.parent / f"{workdir.name}_logs"))
        cmd = ["bash", "scripts/launch_local.sh", str(processes), *flags]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    (workdir / "wall_s.json").write_text(json.dumps(wall))
    return wall


def compare(one: dict, four: dict) -> dict:
    """Two runs' summaries -> the largest loss and validation-MPJPE differences at shared steps."""
    def curve(doc, key):
        return dict((int(s), float(v)) for s, v in doc["history"][key])
    out = {}
    for key, name in (("train/loss", "loss"), ("eval/validation/mpjpe", "validation_mpjpe")):
        a, b = curve(one, key), curve(four, key)
        steps = sorted(set(a) & set(b))
        out[name] = {"steps": steps, "one": [a[s] for s in steps], "four": [b[s] for s in steps],
                     "max_abs_diff": max(abs(a[s] - b[s]) for s in steps)}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="experiments/autoencoder.py:deepmimic")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--modes", default="fp32,fp32_two_level,int8", help=f"comma separated, of {sorted(MODES)}")
    p.add_argument("--threads", type=int, default=8,
                   help="XLA:CPU compute threads per process (NPROC), the same in both runs: a matmul's "
                        "bits depend on it (0: XLA's default, max(cores, devices in the process))")
    p.add_argument("--out", default="results/bench_multiprocess")
    args = p.parse_args()
    out = ROOT / args.out
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        raise SystemExit(f"error: --modes {unknown}: expected some of {sorted(MODES)}")
    every = max(args.steps // 3, 1)
    common = [f"train.steps={args.steps}", f"train.eval_every={every}", f"train.checkpoint_every={every}",
              "train.log_every=10", "data.mirror_prob=0.0", "evals.clip.video_s=0",
              "evals.final.splits=('validation',)"]
    rows = {}
    for mode in modes:
        runs = {}
        for name, processes in (("one", 1), ("four", 4)):
            workdir = out / f"{mode}_{name}"
            workdir.mkdir(parents=True, exist_ok=True)
            flags = [f"--config={args.config}", f"--workdir={workdir}",
                     *(f"--config.{o}" for o in common + MODES[mode])]
            wall = _train(workdir, flags, processes, args.threads)
            runs[name] = dict(json.loads((workdir / "summary.json").read_text()), wall_s=wall)
        rows[mode] = dict(compare(runs["one"], runs["four"]),
                          wall_s={k: round(r["wall_s"], 1) for k, r in runs.items()})
    lines = ["mode  max |loss diff|  validation MPJPE cm (1 x 8 / 4 x 2, per evaluation)       max diff cm"
             "  wall s (1 x 8 / 4 x 2)"]
    for mode, r in rows.items():
        v = r["validation_mpjpe"]
        pairs = " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(v["one"], v["four"], strict=True))
        lines.append(f"{mode:5} {r['loss']['max_abs_diff']:15.2e}  {pairs:58} {v['max_abs_diff']:11.2e}"
                     f"  {r['wall_s']['one']:.0f} / {r['wall_s']['four']:.0f}")
    print("\n".join(lines))
    doc = {"config": args.config, "steps": args.steps, "threads": args.threads, "overrides": common,
           "modes": rows}
    (out / "bench_multiprocess.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'bench_multiprocess.json'}")


if __name__ == "__main__":
    main()
