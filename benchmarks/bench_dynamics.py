"""Joint-dynamics loss + gradient: blocked Jacobian vs jax.jvp/vjp of FK vs dense jax.jacfwd, over
J × frames per batch × dtype (:mod:`benchmarks.dynamics_grid`). Prints a table, writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_dynamics.py [--quick] [--joints 24,52] [--frames 1024,4096] \\
        [--dtypes float32] [--budget 8] [--grid-budget 600] [--out results/bench_dynamics]

The whole grid (4 J × 4 sizes × 2 dtypes) takes hours on 2 cores, most of it XLA compiling three
programs per row; ``--grid-budget`` starts no row after that many seconds (target rows run first).

    .venv/bin/python benchmarks/bench_dynamics.py --train-step experiments/predict.py:alone [--weight 0.005]

times instead a task's whole train step (its config, a batch of its shape) with the loss off and on with
each backend, round-robin (``benchmarks.suite.train_step_cost``), and writes ``train_step.json``.
"""
import argparse
import json
from pathlib import Path

import jax

from benchmarks.dynamics_grid import markdown, plot, run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="J = 13, 24 at 256 and 1,024 frames, float32")
    parser.add_argument("--budget", type=float, default=None, help="timing seconds per size (sets rounds)")
    parser.add_argument("--grid-budget", type=float, default=None, metavar="SECONDS",
                        help="start no row after this long (default: none)")
    parser.add_argument("--out", default="results/bench_dynamics", help="folder for the JSON and PNG")
    parser.add_argument("--joints", default=None, help="subset of J, e.g. 52,100")
    parser.add_argument("--frames", default=None, help="subset of frames per batch, e.g. 256,1024")
    parser.add_argument("--dtypes", default=None, help="subset of float32,bfloat16")
    parser.add_argument("--train-step", default=None, metavar="CONFIG[:VARIANT]",
                        help="time this experiment's train step per backend instead of the grid")
    parser.add_argument("--weight", type=float, default=0.005, help="dynamics weight for --train-step")
    args = parser.parse_args()
    print(f"dynamics loss + grad, backend {jax.default_backend()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.train_step:
        return train_step(args.train_step, args.weight, out)
    ints = lambda text: [int(x) for x in text.split(",")] if text else None
    results = run(args.quick, args.budget, partial=out / "bench_dynamics.partial.json",
                  joints=ints(args.joints), frames=ints(args.frames),
                  dtypes=args.dtypes.split(",") if args.dtypes else None, grid_budget_s=args.grid_budget)
    (out / "bench_dynamics.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "dynamics.png")
    print("\n".join(markdown(results)))
    print(f"targets: {results['targets']}")
    print(f"wrote {out}/bench_dynamics.json, dynamics.png")


def train_step(spec: str, weight: float, out: Path) -> None:
    """``--train-step``: the table of :func:`benchmarks.suite.train_step_cost` for one experiment."""
    from benchmarks.suite import train_step_cost
    from motionjax import configs
    from motionjax.data import pipeline

    config = configs.load(spec)
    result = train_step_cost(config, pipeline.dataset_info(config.data), weight=weight)
    print(f"{spec}: train step, batch {config.data.batch_size} x {config.data.window} frames, "
          f"dynamics weight {weight}")
    print("dynamics  ms/step  x off")
    for name, ms in result["ms"].items():
        print(f"{name:8} {ms:8.1f} {result['vs_off'][name]:6.2f}")
    doc = {"config": spec, "weight": weight, "batch": config.data.batch_size, "window": config.data.window,
           "backend": jax.default_backend(), **result}
    (out / "train_step.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}/train_step.json")


if __name__ == "__main__":
    main()
