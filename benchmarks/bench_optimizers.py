"""What an optimizer adds to the headline train step: seconds a step for each ``train.optimizer``.

    python benchmarks/bench_optimizers.py [--config experiments/autoencoder.py] \\
        [--optimizers adamw,muon,schedule_free] [--torch adamw,muon,muon_bf16] [--torch-threads 1,2] \\
        [--rounds 5] [--steps 20] [--warmup-rounds 1] [--out results/optimizer_step]

Builds the config's jitted train step once per optimizer (same model, batch and loss; the Bandai rig
when the corpus is there, so the feature size is the real one), on fixed random batches, then times
``--rounds`` rounds of ``--steps`` steps, the optimizers taking turns inside each round so they share
whatever else runs on the host: the ratios are the number to read. ``--torch``: the PyTorch twin's
step (``benchmarks/torch_peer.py``, eager, from the same initial weights and batches)
with those optimizers takes its turns too, rows ``torch:NAME`` (``torch:NAME/Nt`` for each of several
``--torch-threads``; torch's thread count is set before each turn). ``--warmup-rounds`` rounds run
first, untimed: eager PyTorch gets faster over its first tens of steps (its allocator and oneDNN's
kernel caches warm up), XLA's step does not. Prints a table (median seconds a step, ÷ the first
optimizer, and PyTorch ÷ motionjax with the same optimizer) and writes ``optimizer_step.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from motionjax import malloc  # noqa: E402

malloc.configure()  # the trainer's host allocator (scripts/train.py): a step costs here what it does there

import jax  # noqa: E402
import numpy as np  # noqa: E402

from motionjax import (  # noqa: E402
    configs,  # noqa: E402
    parallel,
    train,
)
from motionjax.data import synthetic  # noqa: E402


def build(config, info, mesh, optimizer: str, batches):
    """The jitted step of ``config`` with ``optimizer``, compiled, its state, and the batches placed."""
    c = config.copy_and_resolve_references()
    c.train.optimizer = optimizer
    step, state, _, _ = train.build_train_step(c, info, mesh)
    shardings = parallel.batch_shardings(mesh, sorted(batches[0]))
    placed = [parallel.put(b, shardings) for b in batches]
    t0 = time.perf_counter()
    state, metrics = step(state, placed[0])
    jax.block_until_ready(metrics["loss"])
    return step, state, placed, time.perf_counter() - t0


def build_torch(config, info, optimizer: str, batches, threads: int):
    """The PyTorch twin's train step of ``config`` with ``optimizer`` (``muon_bf16``: torch.optim.Muon
    as it ships; ``muon``: its Newton-Schulz in float32) on ``threads`` threads, from motionjax's
    initial weights, and the batches as tensors."""
    import torch

    from benchmarks import torch_peer

    torch.set_num_threads(threads)
    c = config.copy_and_resolve_references()
    c.train.optimizer = optimizer.removesuffix("_bf16")
    _, step = torch_peer.make_train_step(c, info, torch_peer.initial_params(c, info),
                                         muon_bf16=optimizer == "muon_bf16")
    keys = ("noisy", "clean", "offsets", "valid")
    return step, [[torch.as_tensor(b[k]) if k in b else None for k in keys] for b in batches]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="experiments/autoencoder.py", help="experiment file[:variant]")
    parser.add_argument("--optimizers", default="adamw,muon,schedule_free")
    parser.add_argument("--torch", default="", type=lambda v: [n for n in v.split(",") if n],
                        help="comma-separated optimizers of the PyTorch twin to time too (adamw, muon; "
                        "muon_bf16: torch's own bfloat16 Newton-Schulz)")
    parser.add_argument("--torch-threads", default=str(os.cpu_count()),
                        type=lambda v: [int(n) for n in v.split(",")],
                        help="torch.set_num_threads, or several, comma-separated, each timed (default: one a "
                        "core, as XLA's step uses them; the steps take turns, so neither shares the cores)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds before the timed ones")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per optimizer per round")
    parser.add_argument("--out", default="results/optimizer_step")
    args = parser.parse_args(argv)
    config = configs.load(args.config)
    info, _ = synthetic.info_like(config)  # the rig decides the feature size
    mesh = parallel.make_mesh(config.mesh)
    abstract = train.abstract_batch(config, info, mesh)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(4):
        b = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in abstract.items() if k != "valid"}
        if "offsets" in b:
            b["offsets"] = np.broadcast_to(info.skeleton.offsets, b["offsets"].shape).astype(np.float32)
        b["valid"] = np.ones(abstract["valid"].shape, np.float32)
        batches.append(b)
    names = args.optimizers.split(",")
    runs, compile_s = {}, {}
    for name in names:
        step, state, placed, compile_s[name] = build(config, info, mesh, name, batches)
        runs[name] = [step, state, placed]
        print(f"{name}: compiled and first step in {compile_s[name]:.1f} s", flush=True)
    if args.torch:
        import torch
    several = len(args.torch_threads) > 1
    twins = {f"torch:{name}" + (f"/{n}t" if several else ""):  # name -> (threads, step, batches)
             (n, *build_torch(config, info, name, batches, n))
             for name in args.torch for n in args.torch_threads}
    per_step = {name: [] for name in [*names, *twins]}
    for r in range(-args.warmup_rounds, args.rounds):
        for name in names:
            step, state, placed = runs[name]
            t0 = time.perf_counter()
            for i in range(args.steps):
                state, metrics = step(state, placed[i % len(placed)])
            jax.block_until_ready(metrics["loss"])
            per_step[name].append((time.perf_counter() - t0) / args.steps)
            runs[name][1] = state
        for name, (threads, step, placed) in twins.items():
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(*placed[i % len(placed)])  # eager: synchronous
            per_step[name].append((time.perf_counter() - t0) / args.steps)
        print(("warm-up round" if r < 0 else f"round {r + 1}/{args.rounds}") + ": "
              + ", ".join(f"{n} {v[-1]:.3f} s" for n, v in per_step.items()), flush=True)
        if r < 0:
            for v in per_step.values():
                v.pop()
    names = [*names, *twins]
    ref = names[0]
    median = {n: float(np.median(v)) for n, v in per_step.items()}
    # Each round's ratio (the optimizers ran back to back in it), then their median.
    ratio = {n: float(np.median(np.array(per_step[n]) / np.array(per_step[ref]))) for n in names}
    print(f"\n{args.config}: batch {abstract['noisy'].shape}, {args.rounds} rounds x {args.steps} steps\n")
    # PyTorch ÷ motionjax with the same optimizer, round by round.
    same = {n: n.split(":")[1].split("/")[0].removesuffix("_bf16") for n in twins}
    versus = {n: float(np.median(np.array(per_step[n]) / np.array(per_step[m]))) for n, m in same.items()
              if m in per_step}
    print(f"| optimizer | s a step, median | ÷ {ref} (median of rounds) | PyTorch ÷ motionjax | "
          "compile + first step s |")
    print("|---|---|---|---|---|")
    for n in names:
        vs = f"{versus[n]:.2f}" if n in versus else ""
        print(f"| {n} | {median[n]:.3f} | {ratio[n]:.2f} | {vs} | {compile_s.get(n, 0):.0f} |")
    result = {"config": args.config, "batch_shape": list(abstract["noisy"].shape), "rounds": args.rounds,
              "steps": args.steps, "warmup_rounds": args.warmup_rounds, "torch_threads": args.torch_threads,
              "seconds_per_step": per_step, "median_s": median, "ratio": ratio,
              "torch_vs_motionjax": versus, "compile_s": compile_s, "reference": ref}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "optimizer_step.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'optimizer_step.json'}")
    return result


if __name__ == "__main__":
    main()
