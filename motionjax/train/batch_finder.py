"""The batch size: the largest per-device batch that fits memory, and the throughput-optimal one.

Fit is decided without running anything: XLA's compiled memory analysis of the trainer's own step
(``jax.jit(step).lower(state, batch).compile().memory_analysis()``) gives, per device, the bytes of
the arguments (state + batch), outputs, the buffers outputs alias (the donated state) and the
temporaries; the step needs ``argument + output - alias + temp`` bytes at its peak. Compiling costs
seconds per size, an OOM never happens, and the search (doubling, then bisection) compiles
``~2·log2(batch)`` sizes.

The memory limit is the device's (``memory_stats()["bytes_limit"]`` on GPU/TPU) or, on CPU where
devices report none, a byte budget: given, or a fraction of the host's physical memory shared by its
local devices. The throughput-optimal batch comes from timing the compiled step at each power of two
that fits (frames/s vs batch): past some size a bigger batch buys no more frames per second.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from motionjax import parallel, timing
from motionjax.core.features import feature_dim
from motionjax.train import step as train_step

HOST_FRACTION = 0.5  # of physical memory a CPU run may plan for (the data pipeline and OS need the rest)


def device_memory_limit(device: jax.Device | None = None, host_fraction: float = HOST_FRACTION) -> int:
    """Bytes one device may use: its allocator's limit, or on CPU ``host_fraction`` of the host's
    physical memory divided over the local devices."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total * host_fraction / jax.local_device_count())


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Per-device bytes of one compiled train step (XLA's memory analysis)."""

    per_device_batch: int
    argument: int
    output: int
    alias: int
    temp: int

    @property
    def peak(self) -> int:
        """Live bytes at the step's peak: inputs, outputs not written in place, temporaries."""
        return self.argument + self.output - self.alias + self.temp


class StepProbe:
    """A jitted train step ``step(state, batch) -> (state, metrics)`` (state donated) lowered and
    compiled at any per-device batch. ``batch_spec(global_batch) -> {key: ShapeDtypeStruct}`` says
    what a batch holds (default: ``noisy`` and ``clean`` ``[B, *window_shape]`` windows sharded by
    ``parallel.window_sharding(mesh)``). :meth:`for_trainer` makes the trainer's own step and batch."""

    def __init__(self, step, state, window_shape, mesh, batch_spec=None):
        self.step, self.state, self.mesh = step, state, mesh
        self.window_shape = tuple(window_shape)
        self.data_size = mesh.shape["data"]
        self.batch_spec = batch_spec or self._windows
        self._memory: dict[int, StepMemory] = {}
        self._compiled: dict[int, object] = {}

    @classmethod
    def for_trainer(cls, config, info, mesh=None) -> StepProbe:
        """:func:`motionjax.train.build_train_step` for ``config`` and the batches it reads
        (:func:`motionjax.train.abstract_batch`: windows, ``valid``, ``offsets``) at any size."""
        mesh = mesh if mesh is not None else parallel.make_mesh(config.mesh)
        step, state, _, _ = train_step.build_train_step(config, info, mesh)
        d = config.data

        def batch_spec(global_batch):
            sized = config.copy_and_resolve_references()
            sized.data.batch_size = global_batch
            return train_step.abstract_batch(sized, info, mesh)

        return cls(step, state, (d.window // d.chunk, d.chunk, feature_dim(info.skeleton)), mesh, batch_spec)

    def global_batch(self, per_device: int) -> int:
        return per_device * self.data_size

    def _windows(self, global_batch: int) -> dict:
        spec = jax.ShapeDtypeStruct((global_batch, *self.window_shape), jnp.float32,
                                    sharding=parallel.window_sharding(self.mesh))
        return {"noisy": spec, "clean": spec}

    def _batch_spec(self, per_device: int) -> dict:
        return self.batch_spec(self.global_batch(per_device))

    def compile(self, per_device: int):
        if per_device not in self._compiled:
            self._compiled[per_device] = self.step.lower(self.state, self._batch_spec(per_device)).compile()
        return self._compiled[per_device]

    def memory(self, per_device: int) -> StepMemory:
        """Per-device bytes of the step at ``per_device`` windows per device (cached)."""
        if per_device not in self._memory:
            m = self.compile(per_device).memory_analysis()
            self._memory[per_device] = StepMemory(per_device, int(m.argument_size_in_bytes),
                                                  int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                                                  int(m.temp_size_in_bytes))
        return self._memory[per_device]

    def step_time(self, per_device: int, steps: int = 5, seed: int = 0) -> float:
        """Median seconds of one step at ``per_device`` (random standardized windows; the compiled
        step's cost does not depend on the values)."""
        compiled = self.compile(per_device)
        rng = np.random.default_rng(seed)
        # Windows random, real frames everywhere (valid = 1), bones of unit length: values do not
        # change the cost of the compiled step.
        fill = {"valid": np.ones, "offsets": np.ones}
        batch = {k: jax.device_put(fill.get(k, rng.standard_normal)(s.shape).astype(np.float32), s.sharding)
                 for k, s in self._batch_spec(per_device).items()}
        # The step donates its state: run on a copy, then drop it.
        state = jax.tree.map(lambda a: a.copy(), self.state)

        def step():
            nonlocal state
            state, metrics = compiled(state, batch)
            return metrics

        return timing.time_call(step, repeats=steps, warmup=1)


def largest_fitting(fits, max_batch: int = 1 << 16) -> int:
    """The largest ``b`` in ``[1, max_batch]`` with ``fits(b)`` for a monotone predicate (doubling,
    then bisection); 0 when even ``b = 1`` does not fit."""
    if not fits(1):
        return 0
    lo = 1
    while lo < max_batch and fits(min(2 * lo, max_batch)):
        lo = min(2 * lo, max_batch)
    if lo == max_batch:
        return lo
    hi = min(2 * lo, max_batch)  # does not fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_batch(probe: StepProbe, limit_bytes: int, max_per_device: int = 1 << 14) -> int:
    """The largest per-device batch whose step needs at most ``limit_bytes`` per device."""
    return largest_fitting(lambda b: probe.memory(b).peak <= limit_bytes, max_per_device)


def throughput_curve(probe: StepProbe, largest: int, steps: int = 5, smallest: int = 1) -> list[dict]:
    """``[{per_device_batch, global_batch, step_s, frames_per_s}]`` at the powers of two from
    ``smallest`` to ``largest`` (and ``largest`` itself)."""
    sizes = sorted({*(2**k for k in range(20) if smallest <= 2**k <= largest), largest})
    rows = []
    for b in sizes:
        t = probe.step_time(b, steps)
        g = probe.global_batch(b)
        rows.append({"per_device_batch": b, "global_batch": g, "step_s": t,
                     "frames_per_s": g * int(np.prod(probe.window_shape[:2])) / t,
                     "peak_bytes": probe.memory(b).peak})
    return rows


def best_throughput(rows: list[dict], tolerance: float = 0.05) -> int:
    """The smallest per-device batch within ``tolerance`` of the best frames/s: a larger one buys
    (almost) no speed and costs memory and gradient noise."""
    best = max(r["frames_per_s"] for r in rows)
    return min(r["per_device_batch"] for r in rows if r["frames_per_s"] >= (1 - tolerance) * best)


def plot_curve(rows: list[dict], path, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["per_device_batch"] for r in rows], [r["frames_per_s"] for r in rows], "o-")
    ax.set(xscale="log", xlabel="per-device batch (windows)", ylabel="train frames/s", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def find(config, info, mode: str = "memory", limit_bytes: int | None = None, steps: int = 5,
         out_dir=None) -> dict:
    """The batch of ``mode`` (``"memory"``: the largest that fits; ``"throughput"``: the fastest
    that fits) as ``{"per_device_batch", "global_batch", "limit_bytes", ...}``; with ``out_dir``
    also ``batch_finder.json`` and (throughput) ``batch_curve.png`` there."""
    if mode not in ("memory", "throughput"):
        raise ValueError(f"batch finder mode {mode!r}: expected 'memory' or 'throughput'")
    limit = int(limit_bytes) if limit_bytes else device_memory_limit()
    probe = StepProbe.for_trainer(config, info)
    largest = max_batch(probe, limit)
    if largest == 0:
        raise ValueError(f"a per-device batch of 1 needs {probe.memory(1).peak} bytes, over the limit "
                         f"of {limit} bytes per device")
    result = {"mode": mode, "limit_bytes": limit, "max_per_device_batch": largest,
              "max_global_batch": probe.global_batch(largest),
              "peak_bytes": probe.memory(largest).peak,
              "memory": [dataclasses.asdict(m) | {"peak": m.peak} for _, m in sorted(probe._memory.items())]}
    chosen = largest
    if mode == "throughput":
        rows = throughput_curve(probe, largest, steps)
        chosen = best_throughput(rows)
        result["curve"] = rows
    result.update(per_device_batch=chosen, global_batch=probe.global_batch(chosen))
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "batch_finder.json").write_text(json.dumps(result, indent=2))
        if "curve" in result:
            plot_curve(result["curve"], out_dir / "batch_curve.png",
                       f"{config.model.name} dim {config.model.dim}, window {config.data.window}")
    return result


def resolve_auto_batch(config, info) -> dict | None:
    """With ``config.data.auto_batch`` (``"memory"`` | ``"throughput"``) set, replace
    ``config.data.batch_size`` by the found global batch; returns the finder's result (or None).

    The trainer calls it before it builds its step, so every entry point (scripts, notebooks,
    benchmarks) honours the setting. With several processes process 0's choice is everyone's (the
    throughput mode times steps, which differ between hosts)."""
    mode = config.data.auto_batch
    if not mode:
        return None
    result = find(config, info, mode)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        chosen = int(multihost_utils.broadcast_one_to_all(np.int32(result["per_device_batch"])))
        result.update(per_device_batch=chosen, global_batch=chosen * config_data_size(config))
    config.data.batch_size = result["global_batch"]
    return result


def config_data_size(config) -> int:
    """The size of the ``data`` mesh axis of ``config.mesh`` on this run's devices."""
    return parallel.mesh_shape(config.mesh.shape, jax.device_count())[parallel.DATA_AXIS]
