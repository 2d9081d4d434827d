"""The input path, alone and in training (#53): per residency tier, on the headline config.

For each tier (:mod:`motionjax.data.feed`: ``device``, the corpus on the devices; ``stream``, Grain
ships spans; and ``host``, the baseline that augments every window in numpy on the main thread, as
the trainer did before #53 in one process):

- ``batches_per_s``: batches the input delivers alone (no train step competing), after warm-up;
- ``cpu_ms_per_batch``: process CPU time per batch over that loop (on a CPU backend it includes the
  device program's own work, which runs on the same cores; on a GPU it is the host's alone);
- ``program_ms``: the device augmentation program alone on a fixed input (device and stream tiers);
- ``compile_s``: its compile seconds;
- in a real training run of ``steps`` steps: ``data_wait_fraction``, ``steps_per_s`` and the step's
  ``compile_s`` (the trainer's own timing, ``summary.json``), and the host cache's hit rate (stream).

``step_ms``: the train step alone on one batch, for scale: the input keeps up when its batches/s
exceed ``1000 / step_ms``.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import measure
from experiments import autoencoder
from motionjax import parallel, train
from motionjax.configs import base
from motionjax.data import feed, pipeline

TIERS = ("device", "stream", "host")
TARGET_BATCHES_PER_S = 300.0   # the input alone, 32 x 64 windows, 2 cores (#53)
TARGET_DATA_WAIT = 0.02        # in training on the CPU, every tier


def headline_config(steps: int):
    """``experiments/autoencoder.py`` (Bandai-1 when its files are here, else DeepMimic) trimmed to
    ``steps`` steps: one validation evaluation at the end, no references, plots or exports."""
    corpus = "bandai" if Path(base.BANDAI_SOURCE).is_dir() else "deepmimic"
    c = autoencoder.get_config(corpus)
    c.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, references=())
    c.evals.heldout.splits = ("validation",)
    c.train.best_metric = "validation/mpjpe"
    c.evals.final.update(splits=("validation",), references=(), by_label=False)
    del c.evals["clip"]
    return c


def _iterator(config, info, tier: str):
    if tier == "host":
        mesh = parallel.make_mesh(config.mesh)
        shardings = parallel.batch_shardings(mesh, train.batch_keys(config))
        return (pipeline.to_global(shardings, b)
                for b in pipeline.make_naive_train_iterator(config.data, info, seed=config.seed))
    return feed.Feed(config.data, info, parallel.make_mesh(config.mesh), train.batch_keys(config),
                     seed=config.seed, mode=tier)


def input_alone(config, info, tier: str, batches: int) -> dict:
    """Batches/s and CPU ms per batch of ``tier``'s iterator alone; its program's time and compile."""
    it = _iterator(config, info, tier)
    out = {"compile_s": getattr(it, "compile_s", None)}
    live = [jax.block_until_ready(next(it)) for _ in range(3)]  # warm: first batches, caches
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        live = [*live[-2:], next(it)]  # XLA:CPU: a batch lives until its program has run
    jax.block_until_ready(live)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out.update(batches_per_s=batches / wall, cpu_ms_per_batch=1e3 * cpu / batches)
    if tier in ("device", "stream"):
        out["program_ms"] = 1e3 * _program_seconds(it)
        stats = it.stats()
        if stats:
            out["cache"] = stats
    if hasattr(it, "close"):
        it.close()
    return out


def _program_seconds(it: feed.Feed, repeats: int = 20) -> float:
    """The feed's compiled augmentation program alone, on one fixed input."""
    if it.mode == "device":
        args = (np.int32(0), it._tables, it._seg_cdf)
    else:
        args = (np.int32(0), next(it._source))
    return measure.time_call(lambda: it._program(*args), repeats=repeats)


def step_seconds(config, info, repeats: int = 5) -> float:
    """The train step alone on one batch of the feed."""
    mesh = parallel.make_mesh(config.mesh)
    step, state, _, _ = train.build_train_step(config, info, mesh)
    it = feed.Feed(config.data, info, mesh, train.batch_keys(config), seed=config.seed)
    batch = jax.block_until_ready(next(it))
    it.close()
    holder = {"state": state}

    def call():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics

    return measure.time_call(call, repeats=repeats)


def in_training(config, tier: str, workdir: Path) -> dict:
    """A real training run of ``config`` with the input of ``tier``: the trainer's own timing."""
    c = config.copy_and_resolve_references()
    if tier == "host":
        c.data.loader = "naive"
    else:
        c.data.residency = tier
    shutil.rmtree(workdir, ignore_errors=True)
    summary = train.train_and_evaluate(c, workdir)
    out = {k: summary[k] for k in ("data_wait_fraction", "steps_per_s", "frames_per_s", "compile_s")}
    out.update({k: v for k, v in summary.get("input", {}).items() if k != "residency"})
    return out


def run(steps: int, batches: int, out: Path, tiers=TIERS, log=print) -> dict:
    """Every tier of :data:`TIERS`: the input alone, then a ``steps``-step training run, each tier in
    turn (one run: their ratios hold on a shared machine)."""
    config = headline_config(steps)
    info = pipeline.dataset_info(config.data)
    corpus = "bandai" if "bandai" in config.data.dir else "deepmimic"
    result = {"config": f"experiments/autoencoder.py:{corpus}",
              "batch": config.data.batch_size, "window": config.data.window, "steps": steps,
              "batches": batches, "backend": jax.default_backend(), "devices": jax.device_count(),
              "cores": len(os.sched_getaffinity(0)), "corpus_mb": feed.resident.corpus_nbytes(info) / 2**20,
              "residency_auto": feed.choose_residency(config.data, info)[0], "tiers": {}}
    start = time.perf_counter()
    result["step_ms"] = 1e3 * step_seconds(config, info)
    log(f"input: the train step alone {result['step_ms']:.1f} ms ({time.perf_counter() - start:.0f} s)")
    for tier in tiers:
        t = time.perf_counter()
        # The host loader makes ~5 batches/s here: a few tens of them say as much as hundreds.
        row = {"alone": input_alone(config, info, tier, batches if tier != "host" else min(batches, 30))}
        row["training"] = in_training(config, tier, out / "runs" / f"input_{tier}")
        result["tiers"][tier] = row
        wait = row["training"]["data_wait_fraction"]
        log(f"input: {tier}: {row['alone']['batches_per_s']:.0f} batches/s alone, data wait "
            f"{100 * wait:.1f}% in training ({time.perf_counter() - t:.0f} s)")
    alone = {t: r["alone"]["batches_per_s"] for t, r in result["tiers"].items()}
    waits = {t: r["training"]["data_wait_fraction"] for t, r in result["tiers"].items() if t != "host"}
    result["targets"] = {
        "batches_per_s": TARGET_BATCHES_PER_S, "data_wait": TARGET_DATA_WAIT,
        "met_batches_per_s": {t: alone[t] >= TARGET_BATCHES_PER_S for t in alone if t != "host"},
        "met_data_wait": {t: w <= TARGET_DATA_WAIT for t, w in waits.items()}}
    if "host" in alone:
        result["speedup_vs_host"] = {t: alone[t] / alone["host"] for t in alone if t != "host"}
    result["met"] = bool(all(result["targets"]["met_batches_per_s"].values())
                         and all(result["targets"]["met_data_wait"].values()))
    return result


def markdown(result: dict) -> str:
    """The input table: a row per tier."""
    lines = [f"Input path ({result['config']}, {result['batch']} x {result['window']} frames, "
             f"{result['backend']} x {result['devices']}, {result['cores']} cores; the train step alone "
             f"{result['step_ms']:.1f} ms; corpus {result['corpus_mb']:.1f} MB, data.residency='auto' picks "
             f"'{result['residency_auto']}')", "",
             "| tier | batches/s alone | CPU ms / batch | program ms | compile s | data wait (training) "
             "| steps/s (training) | cache hit rate |", "|---|---|---|---|---|---|---|---|"]
    for tier, row in result["tiers"].items():
        a, t = row["alone"], row["training"]
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        hit = (a.get("cache") or {}).get("hit_rate")
        lines.append(f"| {tier} | {a['batches_per_s']:.0f} | {a['cpu_ms_per_batch']:.1f} | "
                     f"{fmt(a.get('program_ms'), '.2f')} | {fmt(a.get('compile_s'), '.1f')} | "
                     f"{100 * t['data_wait_fraction']:.1f}% | {t['steps_per_s']:.2f} | {fmt(hit, '.1%')} |")
    tg = result["targets"]
    lines += ["", f"Targets: >= {tg['batches_per_s']:.0f} batches/s alone ("
              + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in tg["met_batches_per_s"].items())
              + f"); data wait <= {100 * tg['data_wait']:.0f}% in training ("
              + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in tg["met_data_wait"].items()) + ")"]
    return "\n".join(lines)
