"""Batches/s of the trainer's own input iterator alone, for whichever motionjax is on ``PYTHONPATH``:
run it from two checkouts in turn to compare the input path of two commits in one session.

    git worktree add /tmp/before b858da4 && ln -s $PWD/data_cache /tmp/before/data_cache
    for tree in /tmp/before $PWD /tmp/before $PWD; do
      (cd $tree && PYTHONPATH=$tree python $OLDPWD/benchmarks/input_rate.py --batches 100); done

Prints one JSON line: ``batches_per_s`` and ``cpu_ms_per_batch`` (process CPU time: on a CPU backend it
includes the device program's work) over ``--batches`` batches after 5, for ``--config`` (default the
headline autoencoder on Bandai-1). Used for docs/results/input_before_after.json (#53).
"""
import argparse
import json
import time

import jax

from motionjax import configs, parallel
from motionjax.data import pipeline
from motionjax.train import loop


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/autoencoder.py:bandai", help="experiment[:variant]")
    p.add_argument("--batches", type=int, default=100)
    args = p.parse_args()
    c = configs.load(args.config)
    info = pipeline.dataset_info(c.data)
    it = loop.make_iterator(c, info, parallel.make_mesh(c.mesh))
    live = [jax.block_until_ready(next(it)) for _ in range(5)]
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        live = [*live[-2:], next(it)]  # XLA:CPU: a batch lives until its program has run
    jax.block_until_ready(live)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"batches_per_s": args.batches / wall, "cpu_ms_per_batch": 1e3 * cpu / args.batches}))
    if hasattr(it, "close"):
        it.close()


if __name__ == "__main__":
    main()
