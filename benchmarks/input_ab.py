"""The resident input program before and after a change of its transforms, alternating in one process (#61).

    python -m benchmarks.input_ab --before 4d7cfe1 [--config experiments/deepmimic_denoise.py] [--rounds 20]
                                  [--tier device|stream]

Builds the config's resident input program (the window draw and gather of
:func:`motionjax.data.resident.sample_spans`, then :class:`motionjax.data.augment.Augment`; with
``--tier stream`` the streamed tier's: ``Augment`` on span batches Grain drew, each revision reading
the span leaves its ``Augment`` takes) twice: with
``motionjax/data/augment.py`` and ``transforms.py`` as they are in git revision ``--before`` (loaded
from ``git show`` under other module names; every other module is this tree's), and with this tree's.
Blocks of ``--block`` batches of each, round-robin (:func:`motionjax.timing.time_blocks`): this
process's CPU ms a batch and wall ms a batch, and the after/before ratios, median over rounds [min,
max]. On a shared host the ratio inside one run is what counts. Needs a git checkout.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from motionjax import configs, timing
from motionjax.data import augment, feed, pipeline, resident

ROOT = Path(__file__).resolve().parents[1]
SPAN_BATCHES = 16  # --tier stream: span batches drawn first and cycled


def _module_at(revision: str, path: str, name: str, folder: Path):
    """``path`` of git ``revision`` imported as module ``name``."""
    text = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout
    file = folder / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def program(aug_module, cfg, info, tables, seg_cdf, bisect_steps: int):
    """The compiled resident input program ``(step, tables, seg_cdf) -> {"noisy", "clean", "valid"}``
    with ``aug_module``'s :class:`Augment` (as :class:`motionjax.data.feed.Feed` builds it)."""
    aug = aug_module.Augment(cfg, info)
    keys = ["root_position", "rotations", "length", "offsets"]
    keys += ["lowest"] if getattr(aug, "floor_from_span", False) else []

    def run(step, tables, seg_cdf):
        example = aug_module.example_keys(0, step, cfg.batch_size)
        spans = resident.sample_spans(tables, seg_cdf, aug_module.purpose(example, aug_module._START),
                                      aug.span, bisect_steps)
        batch = aug({k: spans[k] for k in keys}, example)
        return {k: batch[k] for k in ("noisy", "clean", "valid")}

    return jax.jit(run).lower(np.int32(0), tables, seg_cdf).compile()


def stream_program(aug_module, cfg, info, spans: dict):
    """The compiled streamed input program ``(step, spans) -> {"noisy", "clean", "valid"}`` with
    ``aug_module``'s :class:`Augment` on a batch of the stream's spans (device arrays; the leaves its
    Augment reads: "lowest" only where it takes the floor from the spans)."""
    aug = aug_module.Augment(cfg, info)
    keys = ["root_position", "rotations", "length", "offsets"]
    keys += ["lowest"] if getattr(aug, "floor_from_span", False) else []

    def run(step, spans):
        batch = aug({k: spans[k] for k in keys}, aug_module.example_keys(0, step, cfg.batch_size))
        return {k: batch[k] for k in ("noisy", "clean", "valid")}

    return jax.jit(run).lower(np.int32(0), spans).compile()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the 'before' transforms")
    p.add_argument("--config", default="experiments/deepmimic_denoise.py")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--tier", choices=("device", "stream"), default="device",
                   help="device: the resident program (window draw and gather, then the transforms); stream: "
                        "the transforms on the streamed tier's spans (%d batches drawn by Grain first, "
                        "on the device, cycled)" % SPAN_BATCHES)
    args = p.parse_args(argv)
    config = configs.load(args.config)
    info = pipeline.dataset_info(config.data)
    cfg = config.data.copy_and_resolve_references()
    cfg.residency = args.tier
    with tempfile.TemporaryDirectory() as folder:
        old = _module_at(args.before, "motionjax/data/augment.py", "augment_before", Path(folder))
        old.transforms = _module_at(args.before, "motionjax/data/transforms.py", "transforms_before",
                                    Path(folder))
        if args.tier == "device":
            it = feed.Feed(cfg, info, seed=0, mode="device", keys=("noisy", "clean", "valid"))
            steps = resident.bisect_steps(np.asarray(it._tables["window_count"]))  # the feed's own
            args_of = lambda s: (it._tables, it._seg_cdf)  # noqa: E731
            progs = {"before": program(old, cfg, info, it._tables, it._seg_cdf, steps),
                     "after": program(augment, cfg, info, it._tables, it._seg_cdf, steps)}
        else:
            it = pipeline.make_train_iterator(cfg, info, seed=0)
            pool = [jax.device_put(next(it)) for _ in range(SPAN_BATCHES)]
            args_of = lambda s: (pool[s % SPAN_BATCHES],)  # noqa: E731
            progs = {"before": stream_program(old, cfg, info, pool[0]),
                     "after": stream_program(augment, cfg, info, pool[0])}
    # The state passed along is the step the next batch is drawn for.
    calls = {name: lambda s, p=prog: (s + 1, p(np.int32(s), *args_of(s))) for name, prog in progs.items()}
    cpu = {}
    wall = timing.time_blocks(calls, 0, args.block, args.rounds, cpu=cpu)
    times = {name: list(zip(cpu[name], wall[name], strict=True)) for name in progs}
    what = "resident input program" if args.tier == "device" else "streamed input program (on Grain's spans)"
    print(f"{args.config}: the {what}, before = {args.before}'s augment/transforms, after = "
          f"this tree's; {args.rounds} rounds of {args.block} batches, median [min, max]\n")
    print("| | before ms a batch | after ms a batch | ratio after / before |\n|---|---|---|---|")
    for k, what in enumerate(("CPU", "wall")):
        b, a = ([1e3 * t[k] for t in times[name]] for name in ("before", "after"))
        ratio = [y / x for x, y in zip(b, a, strict=True)]
        print(f"| {what} | {statistics.median(b):.3f} | {statistics.median(a):.3f} | "
              f"{statistics.median(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}] |")
    it.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
