"""The resident input program before and after a change of its transforms, alternating in one process (#61).

    python -m benchmarks.input_ab --before 4d7cfe1 [--config experiments/deepmimic_denoise.py] [--rounds 20]
                                  [--tier device|stream]

Builds the config's resident input program (the window draw and gather of
:func:`motionjax.data.resident.sample_spans`, then :class:`motionjax.data.augment.Augment`; with
``--tier stream`` the streamed tier's on span batches Grain drew, each on the wire of its revision:
this tree's feed, and before it ``Augment`` on every span leaf flattened one after another; the
revision given must predate the frame rows) twice: with
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

from motionjax import configs, parallel, timing
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


def stream_programs(old_module, cfg, info):
    """``({"before": program, "after": program}, {"before": wires, "after": wires})``: the streamed tier's
    compiled input programs ``(step, wire) -> {"noisy", "clean", "valid"}`` and :data:`SPAN_BATCHES`
    wires of the same span batches each. After: this tree's feed (:class:`feed.Feed`'s program and the
    wire its Grain source ships). Before: ``old_module``'s :class:`Augment` on the wire of before the
    frame rows (every span leaf flattened one after another, :class:`pipeline.Packed`, with the
    per-frame floor where that revision's ``Augment`` reads it), unpacked in the program as the feed of
    then did."""
    keys = ("noisy", "clean", "valid")
    it = feed.Feed(cfg, info, seed=0, mode="stream", keys=keys)
    after = [it.inputs()[0] for _ in range(SPAN_BATCHES)]
    it.close()
    j, s = info.skeleton.num_joints, it._augment.span
    aug = old_module.Augment(cfg, info)
    leaves = {"root_position": ((s, 3), np.float32), "rotations": ((s, j, 4), np.float32),
              "length": ((), np.int32), "offsets": ((j, 3), np.float32)}
    if getattr(aug, "floor_from_span", False):  # a revision whose streamed spans carried the floor
        leaves["lowest"] = ((s,), np.float32)
    old = pipeline.Packed(leaves, parallel.named_sharding(feed.one_device_mesh(), "batch"))
    spans = pipeline.make_train_iterator(cfg, info, seed=0)
    before = [{"packed": jax.device_put(old.pack(next(spans)), old.sharding)} for _ in range(SPAN_BATCHES)]
    spans.close()

    def run(step, wire):
        batch = aug(old.unpack(wire["packed"]), old_module.example_keys(0, step, cfg.batch_size))
        return {k: batch[k] for k in keys}

    progs = {"before": jax.jit(run).lower(np.int32(0), before[0]).compile(),
             "after": jax.jit(it.draw).lower(np.int32(0), after[0]).compile()}
    return progs, {"before": before, "after": after}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the 'before' transforms")
    p.add_argument("--config", default="experiments/deepmimic_denoise.py")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--tier", choices=("device", "stream"), default="device",
                   help="device: the resident program (window draw and gather, then the transforms); stream: "
                        f"the streamed tier's ({SPAN_BATCHES} span batches drawn by Grain first, on the "
                        "device, cycled)")
    args = p.parse_args(argv)
    config = configs.load(args.config)
    info = pipeline.dataset_info(config.data)
    cfg = config.data.copy_and_resolve_references()
    cfg.update(residency=args.tier, worker_count=0)  # the stream's sampling in this process
    with tempfile.TemporaryDirectory() as folder:
        old = _module_at(args.before, "motionjax/data/augment.py", "augment_before", Path(folder))
        old.transforms = _module_at(args.before, "motionjax/data/transforms.py", "transforms_before",
                                    Path(folder))
        if args.tier == "device":
            it = feed.Feed(cfg, info, seed=0, mode="device", keys=("noisy", "clean", "valid"))
            steps = resident.bisect_steps(np.asarray(it._tables["window_count"]))  # the feed's own
            progs = {"before": program(old, cfg, info, it._tables, it._seg_cdf, steps),
                     "after": program(augment, cfg, info, it._tables, it._seg_cdf, steps)}
        else:
            progs, pools = stream_programs(old, cfg, info)
    # The state passed along is the step the next batch is drawn for.
    if args.tier == "device":
        calls = {name: lambda s, p=prog: (s + 1, p(np.int32(s), it._tables, it._seg_cdf))
                 for name, prog in progs.items()}
    else:
        calls = {name: lambda s, p=prog, w=pools[name]: (s + 1, p(np.int32(s), w[s % SPAN_BATCHES]))
                 for name, prog in progs.items()}
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
    if args.tier == "device":
        it.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
