"""Time to target accuracy, side by side: wall-clock, steps and frames until validation MPJPE ≤ target.

    python benchmarks/bench_time_to_target.py --config experiments/autoencoder.py:bandai,dynamics \\
        --target 2.3 \\
        [--levers optimized,baseline,uniform,batch2x,dynamics_loss] [--seeds 0,1,2] [--eval-every K] \\
        [--max-steps N] [--max-seconds S] [--out results/time_to_target] [--resume [--report-only]]

Every lever (:data:`benchmarks.time_to_target.LEVERS`) is the config with one change; they run
alternating seed by seed, each from scratch, evaluating ``validation/mpjpe`` every K steps and
stopping at the first evaluation ≤ target (or the budget: ``train.steps``/``--max-steps``, and
``--max-seconds`` of counted time). Declare the target before measuring. Writes
``time_to_target.json``, ``time_to_target.md`` (the table) and ``time_to_target.png`` (validation
MPJPE vs wall-clock and vs steps) to ``--out`` and prints the table. Every finished run is recorded
at once (``time_to_target.partial.json``): ``--resume`` reuses the recorded runs and runs only the
missing (lever, seed) pairs, in ``--levers`` order; ``--report-only`` runs none. Recorded runs that a
resumed comparison does not use (fewer levers or seeds) stay in the partial record.
"""
from __future__ import annotations

from motionjax import malloc

malloc.configure()  # first: it may re-execute the process (motionjax/malloc.py)

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from motionjax import configs as experiment_configs  # noqa: E402


def _recorded_runs(out: Path, args) -> dict:
    """``{lever: [run]}`` recorded in ``out`` (the final record and the partial one of a run that
    stopped, merged), checked to be of the same config and target."""
    runs = {}
    for name in ("time_to_target.json", "time_to_target.partial.json"):
        path = out / name
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        if doc.get("config") != args.config or doc.get("target_cm") != args.target:
            raise SystemExit(f"error: --resume: {path} is of --config {doc.get('config')} --target "
                             f"{doc.get('target_cm')}, not {args.config} {args.target}")
        for lever, rs in doc["runs"].items():
            seeds = {r["seed"] for r in runs.get(lever, [])}
            runs.setdefault(lever, []).extend(r for r in rs if r["seed"] not in seeds)
    if not runs:
        print(f"--resume: no runs recorded in {out}; running all", flush=True)
    return runs


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
    parser.add_argument("--resume", action="store_true",
                        help="reuse the runs recorded in --out (same config and target); run only the rest")
    parser.add_argument("--report-only", action="store_true",
                        help="with --resume: run nothing; the table and plot of the recorded runs")
    args = parser.parse_args(argv)
    if args.report_only and not args.resume:
        parser.error("--report-only goes with --resume")

    from motionjax import parallel
    parallel.initialize()
    from benchmarks import time_to_target as ttt
    from motionjax.data import pipeline

    try:
        config = experiment_configs.load(args.config)
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

    done = _recorded_runs(out, args) if args.resume else {}

    def known(runs):
        """This comparison's runs plus the recorded ones it does not use (other levers or seeds)."""
        return {name: [r for r in done.get(name, []) if r not in runs.get(name, [])] + runs.get(name, [])
                for name in {**done, **runs}}

    def save_partial(runs):
        doc = {"config": args.config, "target_cm": args.target, "runs": known(runs)}
        partial.write_text(json.dumps(ttt.jsonable(doc), indent=1, allow_nan=False))

    result = ttt.compare(configs, args.target, [int(s) for s in args.seeds.split(",")], out,
                         max_seconds=args.max_seconds, on_run=save_partial, done=done,
                         run_missing=not args.report_only)
    result["config"] = args.config
    result["levers"] = {name: ttt.LEVERS[name][0] for name in configs}
    table = ttt.markdown(result, result["levers"])
    (out / "time_to_target.json").write_text(json.dumps(ttt.jsonable(result), indent=2, allow_nan=False))
    (out / "time_to_target.md").write_text(f"`{args.config}`\n\n{table}\n")
    ttt.plot(result, out / "time_to_target.png")
    unused = [name for name, rs in known(result["runs"]).items() if rs != result["runs"].get(name)]
    if unused:  # a --resume with fewer levers or seeds: the other recorded runs stay on record
        save_partial(result["runs"])
        print(f"{partial} keeps the recorded runs this comparison did not use ({', '.join(unused)})")
    else:
        partial.unlink(missing_ok=True)  # its runs are all in time_to_target.json now
    print(table, flush=True)
    print(f"wrote {out / 'time_to_target.json'}, {out / 'time_to_target.md'}, {out / 'time_to_target.png'}")
    return result


if __name__ == "__main__":
    main()
