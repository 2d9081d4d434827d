"""What the train step's gradient reduction costs on 8 ... 512 devices, with and without overlap.

Measured from compiled HLO on virtual CPU devices (nothing is allocated), per config at a stated
per-device batch (weak scaling: the per-device program is the same at every mesh size):

1. XLA's own step (``train.grad_reduce = "fp32"``, one level) on ``data = 8``: FLOPs per device
   (XLA's cost analysis), its gradient all-reduce (payload and count from the HLO; at ``n``
   devices a ring sends ``2 (n-1)/n`` of it) and which matmuls it could overlap (none: XLA:CPU
   combines it into one all-reduce after the whole backward pass).
2. The explicit step (``int8``, buckets of ``train.grad_bucket_mb``) on ``data = 8``: for every
   bucket, the matmul FLOPs its collectives neither wait for nor feed
   (:func:`motionjax.train.diagnostics.overlap`): the backward compute left once its gradients exist.
3. The reduction alone (:func:`motionjax.train.grad_reduce.lower_reduction`) for every wire format
   x levels x mesh size: each collective's bytes (partitioned HLO, the dtypes sent), its device
   groups (in a host or across: ``--devices_per_host`` consecutive devices form a host, as the
   hybrid mesh lays them out) and count; bytes are linear in the bucket size, so one bucket is
   compiled and scaled to each.

Model (flags): a collective costs ``alpha * ceil(log2 group)`` + bytes / bandwidth of its link (in a
host or across). Compute ``T = FLOPs / --flops_per_s``. No overlap: exposed = all communication.
Overlap: bucket ``b`` may start once the backward compute it does not depend on remains, i.e. at
``T - T * F_b / F`` (``F_b``: the matmul FLOPs independent of it, ``F``: all matmul FLOPs); one
bucket at a time on the links, in that order; exposed = what ends after ``T``. Share = exposed /
(T + exposed). Collectives and compute are assumed not to slow each other down.

Micro-batches (``--micro_batches``, ``train.micro_batches = k``): the step runs ``k`` slices of the
per-device batch and reduces once; compute ``k T``, the same buckets, and bucket ``b`` ready at
``k T - T F_b / F`` (only the last slice's backward can hide it: the gradient collectives run after
the loop over the others, as ``tests/test_grad_reduce.py`` checks on the compiled step).

  benchmarks/comm_report.py --out docs/comm_report.md
  benchmarks/comm_report.py --measured docs/results/comm_report.json --nvlink_gbps 900  # re-model only
"""
from __future__ import annotations

import os

# Enough virtual devices for the largest mesh; set before jax is imported.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=512"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402
from absl import app, flags  # noqa: E402

from motionjax import parallel, train  # noqa: E402
from motionjax.data import synthetic  # noqa: E402
from motionjax.train import diagnostics, grad_reduce  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["synthetic_scale@64", "autoencoder@32"],
                             "experiments module[:variant]@windows per device")
_DEVICES = flags.DEFINE_list("devices", ["8", "64", "512"], "data-parallel mesh sizes")
_PER_HOST = flags.DEFINE_integer("devices_per_host", 8, "accelerators per host")
_NVLINK = flags.DEFINE_float("nvlink_gbps", 450.0, "in-host bandwidth per device, GB/s one way (H100 NVLink)")
_NETWORK = flags.DEFINE_float("network_gbps", 50.0, "across-host bandwidth per device, GB/s (400 Gb/s NIC)")
_ALPHA_IN = flags.DEFINE_float("alpha_in_us", 5.0, "latency per collective step inside a host, us")
_ALPHA_OUT = flags.DEFINE_float("alpha_out_us", 15.0, "latency per collective step across hosts, us")
_FLOPS = flags.DEFINE_float("flops_per_s", 400e12, "sustained device FLOP/s (H100 bf16 at ~40% of peak)")
_OUT = flags.DEFINE_string("out", "docs/comm_report.md",
                           "Markdown table; its JSON goes to results/ beside it")
_MICRO = flags.DEFINE_list("micro_batches", ["1", "2", "4", "8"],
                           "slices of the per-device batch per reduction (train.micro_batches)")
_MEASURED = flags.DEFINE_string("measured", None, "a report's JSON: model its measured steps again (other "
                                "links, micro-batches) without compiling them")
_VARIANTS = [(w, lv) for w in ("fp32", "bf16", "int8") for lv in (1, 2)]


def load_config(spec: str):
    """``"module[:variant]@windows"`` -> (config on an 8 x 1 mesh, windows per device, info)."""
    name, windows = spec.split("@")
    module, _, variant = name.partition(":")
    config = importlib.import_module(f"experiments.{module}").get_config(variant or None)
    with config.unlocked():
        config.mesh.shape = ((parallel.DATA_AXIS, 8), (parallel.TIME_AXIS, 1))
        config.data.batch_size = int(windows) * 8
    info, bandai = synthetic.info_like(config)  # the rig decides the feature size
    return config, int(windows), info, bandai


def measure_step(config, info):
    """Yields what is known of the step on data = 8 after each stage (later stages compile the whole
    step, minutes each on 2 busy cores): FLOPs and buckets (lowered only); each bucket's overlap (the
    explicit int8 step compiled); XLA's own gradient all-reduce (its step compiled)."""
    mesh = parallel.make_mesh(config.mesh, devices=jax.devices()[:8])
    t0 = time.perf_counter()
    lowered, state = train.lower_train_step(config, info, mesh)
    explicit = config.copy_and_resolve_references()
    explicit.train.grad_reduce = "int8"
    plan = grad_reduce.make_plan(explicit.train, mesh, state["params"])
    params = jax.tree.leaves(state["params"])
    step = {"flops_per_device": float(lowered.cost_analysis()["flops"]) / mesh.size,
            "param_bytes": sum(math.prod(x.shape) * x.dtype.itemsize for x in params),
            "bucket_elements": list(plan.sizes), "batch_shape": list(abstract_noisy(config, info, mesh)),
            "matmul_flops": None, "bucket_free_flops": None, "xla_payload_bytes": None, "xla_count": None,
            "xla_overlap_flops": None}
    print(f"  lowered in {time.perf_counter() - t0:.0f} s: {step['flops_per_device'] / 1e9:.1f} "
          f"GFLOP/device, {len(plan.sizes)} buckets", flush=True)
    yield step

    compiled = train.lower_train_step(explicit, info, mesh)[0].compile()
    found = diagnostics.overlap(compiled.as_text(), mesh)
    # Each bucket's int8 all-to-all carries the bucket's size in bytes (+ its scales): its readiness.
    payload = [(c.result_bytes, f) for c, _, f in found if c.op == "all-to-all" and c.dtype == "s8"]
    free = []
    for size in plan.sizes:
        match = next(i for i, (b, _) in enumerate(payload) if b == size * (1 + 4 / 256))
        free.append(payload.pop(match)[1])
    step.update(matmul_flops=diagnostics.matmul_flops(compiled.as_text()), bucket_free_flops=free)
    print(f"  explicit step compiled ({time.perf_counter() - t0:.0f} s)", flush=True)
    yield step

    compiled, partitioned = diagnostics.compile_partitioned(lowered)
    grads = [c for c in diagnostics.collectives(partitioned, mesh)
             if "data" in c.axes and c.op == "all-reduce" and c.result_bytes > 64]  # the loss's scalars aside
    step.update(xla_payload_bytes=sum(c.result_bytes for c in grads),
                xla_count=sum(1 for c in diagnostics.collectives(compiled.as_text(), mesh)
                              if "data" in c.axes and c.result_bytes > 64),
                xla_overlap_flops=[f for c, _, f in diagnostics.overlap(compiled.as_text(), mesh)
                                   if c.result_bytes > 64])
    print(f"  XLA step compiled ({time.perf_counter() - t0:.0f} s)", flush=True)
    yield step


def abstract_noisy(config, info, mesh):
    return train.abstract_batch(config, info, mesh)["noisy"].shape


def seconds(c: diagnostics.Collective) -> tuple[float, bool]:
    """(seconds, across hosts) of one collective on its slowest link."""
    across = c.crosses(_PER_HOST.value)
    bandwidth = (_NETWORK if across else _NVLINK).value * 1e9
    alpha = (_ALPHA_OUT if across else _ALPHA_IN).value * 1e-6
    return c.wire_bytes / bandwidth + alpha * max(math.ceil(math.log2(c.group_size)), 1), across


def reduction_cost(n: int, wire: str, levels: int, size: int) -> dict:
    """Seconds and bytes (in host / across) of one bucket of ``size`` elements reduced over ``n``."""
    shape = ((parallel.DATA_AXIS, n), (parallel.TIME_AXIS, 1))
    mesh = parallel.make_mesh(ml_collections.ConfigDict({"shape": shape, "across_hosts": parallel.DATA_AXIS}),
                              devices=jax.devices()[:n])
    host = min(_PER_HOST.value, n)
    unit = n * 256
    size = -(-size // unit) * unit
    plan = grad_reduce.Plan(wire, levels, n, host, ((0,),), (size,))
    _, hlo = diagnostics.compile_partitioned(grad_reduce.lower_reduction(plan, mesh))
    out = {"elements": size, "count": 0, "seconds": 0.0, "bandwidth_s": 0.0, "in_host_bytes": 0.0,
           "across_bytes": 0.0}
    for c in diagnostics.collectives(hlo, mesh):
        if c.group_size <= 1:
            continue
        s, across = seconds(c)
        out["count"] += 1
        out["seconds"] += s
        out["bandwidth_s"] += s - (_ALPHA_OUT if across else _ALPHA_IN).value * 1e-6 * max(
            math.ceil(math.log2(c.group_size)), 1)
        out["across_bytes" if across else "in_host_bytes"] += c.wire_bytes
    return out


def exposed(compute: float, buckets: list[tuple[float, float]]) -> float:
    """Communication left after ``compute`` s: buckets ``(ready at, seconds)`` one at a time, in order."""
    t = 0.0
    for ready, cost in sorted(buckets):
        t = max(t, ready) + cost
    return max(0.0, t - compute)


def rows_for(spec: str, costs: dict):
    """Yields the report of one config after each stage of :func:`measure_step`."""
    config, windows, info, bandai = load_config(spec)
    print(f"{spec}: ", flush=True)
    for step in measure_step(config, info):
        yield {"config": spec, "windows_per_device": windows, "bandai_skeleton": bandai,
               "window": config.data.window, **step, "rows": _rows(step, costs)}


def _rows(step: dict, costs: dict) -> list[dict]:
    return [row for k in (int(v) for v in _MICRO.value) for row in _rows_at(step, costs, k)]


def _rows_at(step: dict, costs: dict, k: int) -> list[dict]:
    """The rows of one step measurement with ``k`` micro-batches a reduction."""
    one = step["flops_per_device"] / _FLOPS.value  # one slice
    compute = k * one
    elements = step["bucket_elements"]
    ready = None if step["bucket_free_flops"] is None else \
        [compute - one * f / step["matmul_flops"] for f in step["bucket_free_flops"]]
    rows = []
    for n in (int(v) for v in _DEVICES.value):
        for wire, levels in _VARIANTS:
            if (wire, levels) == ("fp32", 1):
                if step["xla_payload_bytes"] is None:
                    continue
                # XLA's all-reduce: its payload from the HLO at 8, a ring over all n, its count of
                # (combined) collectives; for overlap, split into the explicit buckets (one
                # all-reduce each, readiness as theirs).
                ring = 2 * (n - 1) / n * step["xla_payload_bytes"]
                across = n > _PER_HOST.value
                bw = (_NETWORK if across else _NVLINK).value * 1e9
                alpha = (_ALPHA_OUT if across else _ALPHA_IN).value * 1e-6 * math.ceil(math.log2(n))
                costs_b = [ring / bw * e / sum(elements) + alpha for e in elements]
                comm = ring / bw + alpha * step["xla_count"]
                sent = {"in_host_bytes": 0.0 if across else ring, "across_bytes": ring if across else 0.0}
                count = step["xla_count"]
            else:
                key = (n, wire, levels)
                if key not in costs:
                    costs[key] = reduction_cost(n, wire, levels, max(elements))
                one = costs[key]
                scale = [e / one["elements"] for e in elements]
                latency = one["seconds"] - one["bandwidth_s"]
                costs_b = [one["bandwidth_s"] * x + latency for x in scale]
                sent = {k: one[k] * sum(scale) for k in ("in_host_bytes", "across_bytes")}
                count = one["count"] * len(elements)
                comm = sum(costs_b)
            on = None if ready is None else exposed(compute, list(zip(ready, costs_b, strict=True)))
            rows.append({"devices": n, "hosts": max(n // _PER_HOST.value, 1), "micro_batches": k,
                         "wire": wire, "levels": levels,
                         "collectives": count, **sent, "comm_s": comm, "compute_s": compute,
                         "exposed_off_s": comm, "exposed_on_s": on, "share_off": comm / (compute + comm),
                         "share_on": None if on is None else on / (compute + on)})
    return rows


def markdown(reports: list[dict]) -> str:
    lines = [
        "# Gradient reduction per train step: bytes, time, and what overlap hides",
        "",
        "`benchmarks/comm_report.py` (model and method in its docstring and in docs/scale.md). Links: "
        f"{_PER_HOST.value} devices per host; {_NVLINK.value:g} GB/s inside a host, {_NETWORK.value:g} GB/s "
        f"across; latency {_ALPHA_IN.value:g} / {_ALPHA_OUT.value:g} us per log2 step; compute at "
        f"{_FLOPS.value / 1e12:g} TFLOP/s. Weak scaling: the per-device batch is fixed.",
    ]
    for r in reports:
        pending = "not measured yet"
        ready = pending if r["bucket_free_flops"] is None else \
            ", ".join(f"{100 * f / r['matmul_flops']:.0f}%" for f in r["bucket_free_flops"])
        xla = pending if r["xla_overlap_flops"] is None or r["matmul_flops"] is None else \
            f"{100 * max(r['xla_overlap_flops'] + [0]) / r['matmul_flops']:.0f}%"
        per_device = f"{r['windows_per_device']} windows x {r['window']} frames per device"
        lines += ["", f"## `{r['config']}`: {per_device}",
                  "", f"Batch per 8 devices {r['batch_shape']}; "
                  f"parameters {r['param_bytes'] / 2**20:.2f} MiB; "
                  f"{r['flops_per_device'] / 1e9:.1f} GFLOP per device per step "
                  f"({1e3 * r['rows'][0]['compute_s']:.3f} ms); {len(r['bucket_elements'])} buckets; "
                  f"matmul work left when each bucket is ready: {ready}; when XLA's own all-reduce is: "
                  f"{xla}" + (" (Bandai skeleton)" if r["bandai_skeleton"] else ""),
                  "", "| devices (hosts) | micro-batches | wire | levels | collectives | MiB in host "
                  "| MiB across | comm ms | exposed, no overlap | exposed, overlap |", "|---" * 10 + "|"]
        for x in r["rows"]:
            flat32 = (x["wire"], x["levels"]) == ("fp32", 1)  # one psum a bucket when micro-batched
            wire = x["wire"] + ((" (XLA)" if x.get("micro_batches", 1) == 1 else " flat") if flat32 else "")
            lines.append(
                f"| {x['devices']} ({x['hosts']}) | {x.get('micro_batches', 1)} | {wire} "
                f"| {x['levels']} | {x['collectives']} | {x['in_host_bytes'] / 2**20:.2f} "
                f"| {x['across_bytes'] / 2**20:.2f} | {1e3 * x['comm_s']:.3f} "
                f"| {1e3 * x['exposed_off_s']:.3f} ms ({100 * x['share_off']:.0f}%) | "
                + ("not measured yet |" if x["exposed_on_s"] is None else
                   f"{1e3 * x['exposed_on_s']:.3f} ms ({100 * x['share_on']:.1f}%) |"))
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    costs: dict = {}
    out = Path(_OUT.value)
    data = out.parent / "results" / out.with_suffix(".json").name  # docs/results/comm_report.json
    data.parent.mkdir(parents=True, exist_ok=True)
    done = []
    if _MEASURED.value:
        done = [dict(r, rows=_rows(r, costs)) for r in json.loads(Path(_MEASURED.value).read_text())]
        out.write_text(markdown(done))
        data.write_text(json.dumps(done, indent=1))
        print(out.read_text())
        return
    for spec in _CONFIGS.value:  # written after each stage: a long run keeps what it has measured
        for report in rows_for(spec, costs):
            out.write_text(markdown(done + [report]))
            data.write_text(json.dumps(done + [report], indent=1))
        done.append(report)
    print(out.read_text())


if __name__ == "__main__":
    app.run(main)
