"""What the train step communicates, on meshes of 8 ... 512 devices.

For every mesh the real train step of the config (``motionjax.train.lower_train_step``) is compiled
ahead of time on that many virtual CPU devices, against abstract inputs (nothing is allocated), and
each collective is read back with its mesh axes and bytes (:func:`motionjax.train.diagnostics.collectives`)
from the HLO as the SPMD partitioner leaves it, in the dtypes an accelerator would send (the CPU
executable upcasts bf16 collectives to f32). Per-device batch and window stay fixed (weak scaling): a
data shard holds ``--windows_per_shard`` windows and a time shard ``config.data.window`` frames.

Time per step, stated model (flags): each collective of the executable costs ``alpha *
ceil(log2 group)`` latency, and the bytes go over the bandwidth of the slowest link they cross:
NVLink inside a host of ``--devices_per_host`` accelerators, the network across hosts (the hybrid
mesh puts only ``mesh.across_hosts`` across hosts). Compute: the step's FLOPs (XLA's cost analysis
of the whole unpartitioned step, divided by the devices) at
``--flops_per_s``. The share is communication / (communication + compute), with no overlap: an
upper bound on the wait.

  scripts/comm_report.py --config experiments/synthetic_scale.py --out docs/comm_report.md
"""
from __future__ import annotations

import os

# Enough virtual devices for the largest mesh; set before jax is imported.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=512"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from motionjax import parallel, train  # noqa: E402
from motionjax.data import synthetic  # noqa: E402
from motionjax.train import diagnostics  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/synthetic_scale.py", "experiment config")
_MESHES = flags.DEFINE_list("meshes", ["8x1", "4x2", "64x1", "32x2", "512x1", "256x2"],
                            "data x time meshes")
_WINDOWS = flags.DEFINE_integer("windows_per_shard", 64, "windows per data shard (weak scaling)")
_PER_HOST = flags.DEFINE_integer("devices_per_host", 8, "accelerators per host")
_NVLINK = flags.DEFINE_float("nvlink_gbps", 450.0, "in-host bandwidth per device, GB/s one way (H100 NVLink)")
_NETWORK = flags.DEFINE_float("network_gbps", 50.0, "across-host bandwidth per device, GB/s (400 Gb/s NIC)")
_ALPHA_IN = flags.DEFINE_float("alpha_in_us", 5.0, "latency per collective step inside a host, us")
_ALPHA_OUT = flags.DEFINE_float("alpha_out_us", 15.0, "latency per collective step across hosts, us")
_FLOPS = flags.DEFINE_float("flops_per_s", 400e12, "sustained device FLOP/s (H100 bf16 at ~40% of peak)")
_OUT = flags.DEFINE_string("out", "docs/comm_report.md", "Markdown table; JSON beside it")


def compiled_step(config, data_size: int, time_size: int):
    """The train step of ``config`` compiled for a ``data x time`` mesh, its partitioned HLO, FLOPs
    per device, mesh, batch shape and parameter bytes."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.mesh.shape = ((parallel.DATA_AXIS, data_size), (parallel.TIME_AXIS, time_size))
        config.data.window *= time_size
        config.data.batch_size = _WINDOWS.value * data_size
    mesh = parallel.make_mesh(config.mesh, devices=jax.devices()[: data_size * time_size])
    info = synthetic.synthetic_info(4, window=config.data.window, frames=2 * config.data.window)
    lowered, state = train.lower_train_step(config, info, mesh)
    shape = train.abstract_batch(config, info, mesh)["noisy"].shape
    param_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state["params"]))
    flops = float(lowered.cost_analysis()["flops"]) / mesh.size  # XLA:CPU's executable omits library matmuls
    compiled, partitioned = diagnostics.compile_partitioned(lowered)
    return compiled, partitioned, flops, mesh, shape, param_bytes


def _across_hosts(c: diagnostics.Collective, mesh) -> bool:
    # The hybrid mesh puts only 'data' across hosts, and only once the mesh outgrows one host.
    return mesh.size > _PER_HOST.value and parallel.DATA_AXIS in c.axes


def bandwidth(c: diagnostics.Collective, mesh) -> float:
    """Bytes/s of the slowest link the collective crosses."""
    return (_NETWORK if _across_hosts(c, mesh) else _NVLINK).value * 1e9


def latency(c: diagnostics.Collective, mesh) -> float:
    """Seconds of latency: ``alpha`` per step of a log-depth algorithm."""
    alpha = (_ALPHA_OUT if _across_hosts(c, mesh) else _ALPHA_IN).value * 1e-6
    return alpha * max(math.ceil(math.log2(c.group_size)), 1)


def report(config) -> list[dict]:
    rows = []
    for spec in _MESHES.value:
        data_size, time_size = (int(v) for v in spec.split("x"))
        t0 = time.perf_counter()
        compiled, partitioned, flops, mesh, shape, param_bytes = compiled_step(config, data_size, time_size)
        # Bytes from the partitioned HLO (dtypes as sent); counts, for latency, from the executable,
        # where XLA has combined the per-tensor gradient all-reduces into a few.
        sent = [c for c in diagnostics.collectives(partitioned, mesh) if c.group_size > 1]
        executed = [c for c in diagnostics.collectives(compiled.as_text(), mesh) if c.group_size > 1]
        per_kind = defaultdict(lambda: {"count": 0, "wire_bytes": 0.0, "seconds": 0.0})
        for c in sent:
            kind = per_kind[f"{c.op} over {'x'.join(c.axes)}"]
            kind["wire_bytes"] += c.wire_bytes
            kind["seconds"] += c.wire_bytes / bandwidth(c, mesh)
        for c in executed:
            kind = per_kind[f"{c.op} over {'x'.join(c.axes)}"]
            kind["count"] += 1
            kind["seconds"] += latency(c, mesh)
        comm = sum(k["seconds"] for k in per_kind.values())
        compute = flops / _FLOPS.value
        rows.append({"mesh": spec, "devices": mesh.size, "batch_shape": shape, "param_bytes": param_bytes,
                     "flops_per_device": flops, "collectives": dict(per_kind),
                     "wire_bytes": sum(k["wire_bytes"] for k in per_kind.values()),
                     "comm_s": comm, "compute_s": compute, "comm_share": comm / max(comm + compute, 1e-30)})
        count = sum(k["count"] for k in per_kind.values())
        print(f"{spec:>7s}: {count} collectives, {rows[-1]['wire_bytes'] / 2**20:.2f} MiB/device, "
              f"comm {1e3 * comm:.3f} ms vs compute {1e3 * compute:.3f} ms "
              f"(compiled in {time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def markdown(rows: list[dict], config_path: str) -> str:
    lines = [
        f"# Communication per train step: `{config_path}`",
        "",
        "Read from the partitioned HLO of the real train step, compiled on virtual CPU devices "
        "(`scripts/comm_report.py`). Bytes: what one device sends per step with ring algorithms. "
        f"Links: {_PER_HOST.value} devices per host; {_NVLINK.value:g} GB/s inside a host, "
        f"{_NETWORK.value:g} GB/s across hosts; latency {_ALPHA_IN.value:g} / {_ALPHA_OUT.value:g} us "
        f"per log2 step; compute at {_FLOPS.value / 1e12:g} TFLOP/s; no overlap.",
        "",
        "| mesh (data x time) | batch [B, N, C, F] | params MiB | collectives (count) | MiB sent / device "
        "| comm ms | compute ms | comm share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kinds = "<br>".join(f"{k} ({v['count']}): {v['wire_bytes'] / 2**20:.2f} MiB"
                            for k, v in sorted(r["collectives"].items()))
        params = r["param_bytes"] / 2**20
        lines.append(f"| {r['mesh']} ({r['devices']}) | {list(r['batch_shape'])} | {params:.2f} "
                     f"| {kinds} | {r['wire_bytes'] / 2**20:.2f} | {1e3 * r['comm_s']:.3f} "
                     f"| {1e3 * r['compute_s']:.3f} | {100 * r['comm_share']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    config = _CONFIG.value
    rows = report(config)
    out = Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(rows, config_flags.get_config_filename(flags.FLAGS["config"])))
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(out.read_text())


if __name__ == "__main__":
    app.run(main)
