"""Time to target accuracy, side by side: wall-clock, steps and frames until validation MPJPE ≤ target.

    python scripts/time_to_target.py --config experiments/autoencoder.py:bandai,dynamics --target 2.3 \\
        [--levers optimized,baseline,uniform,batch2x,dynamics_loss] [--seeds 0,1,2] [--eval-every K] \\
        [--max-steps N] [--max-seconds S] [--out results/time_to_target]

Every lever (:data:`benchmarks.time_to_target.LEVERS`) is the config with one change; they run
alternating seed by seed, each from scratch, evaluating ``validation/mpjpe`` every K steps and
stopping at the first evaluation ≤ target (or the budget: ``train.steps``/``--max-steps``, and
``--max-seconds`` of counted time). Declare the target before measuring. Writes
``time_to_target.json``, ``time_to_target.md`` (the table) and ``time_to_target.png`` (validation
MPJPE vs wall-clock and vs steps) to ``--out`` and prints the table.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import experiments


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="experiment file[:variant]")
    parser.add_argument("--target", type=float, required=True, help="validation MPJPE target (cm)")
    parser.add_argument("--levers", default="optimized,baseline,uniform,batch2x,dynamics_loss",
                        help="comma-separated; the first is the reference of the ratios")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (K)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="step budget (default: the config's train.steps; also the LR schedule's length)")
    parser.add_argument("--max-seconds", type=float, default=None, help="budget of counted seconds per run")
    parser.add_argument("--out", default="results/time_to_target")
    args = parser.parse_args(argv)

    from motionjax import parallel
    parallel.initialize()
    from benchmarks import time_to_target as ttt
    from motionjax.data import pipeline

    try:
        config = experiments.load(args.config)
    except FileNotFoundError as e:
        raise SystemExit(f"error: --config: {e}") from None
    if args.max_steps:
        config.train.steps = args.max_steps
    configs = ttt.variants(config, [x for x in args.levers.split(",") if x], args.eval_every)
    if "uniform" in configs and config.data.dynamics_sampling == 0:
        print("warning: the config samples uniformly already (data.dynamics_sampling = 0): "
              "'uniform' is the same as the config", flush=True)
    pipeline.dataset_info(config.data)  # prepare once, before anything is timed
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "time_to_target.partial.json"  # every finished run, rewritten after each one

    def save_partial(runs):
        doc = {"config": args.config, "target_cm": args.target, "runs": runs}
        partial.write_text(json.dumps(ttt.jsonable(doc), indent=1, allow_nan=False))

    result = ttt.compare(configs, args.target, [int(s) for s in args.seeds.split(",")], out,
                         max_seconds=args.max_seconds, on_run=save_partial)
    partial.unlink(missing_ok=True)
    result["config"] = args.config
    result["levers"] = {name: ttt.LEVERS[name][0] for name in configs}
    table = ttt.markdown(result, result["levers"])
    (out / "time_to_target.json").write_text(json.dumps(ttt.jsonable(result), indent=2, allow_nan=False))
    (out / "time_to_target.md").write_text(f"`{args.config}`\n\n{table}\n")
    ttt.plot(result, out / "time_to_target.png")
    print(table, flush=True)
    print(f"wrote {out / 'time_to_target.json'}, {out / 'time_to_target.md'}, {out / 'time_to_target.png'}")
    return result


if __name__ == "__main__":
    main()
