"""How the gradient is summed over the ``data`` axis: XLA's all-reduce, or an explicit one in buckets,
compressed (bf16 / int8 with error feedback) and flat or two-level (inside hosts, then across).

``config.train``: ``grad_reduce`` is the wire format (``"fp32"`` | ``"bf16"`` | ``"int8"``),
``grad_reduce_levels`` 1 (one reduction over all of ``data``) or 2 (reduce-scatter inside each host,
the ``1/d`` slices summed across hosts, all-gather inside the host), ``grad_reduce_host_size`` the
``data`` devices per host (0: per process), ``grad_bucket_mb`` the bucket size; ``micro_batches > 1``
sums that many slices' gradients on each device before the one reduction (any wire format).

fp32 with one level is the step as the partitioner makes it: ``jax.value_and_grad`` of the sharded
loss, XLA inserts the all-reduce (exact, unchanged). Anything else is two ``shard_map`` over the whole
mesh: the loss and gradient per device (parameters cast to *varying* over the mesh, so their
transpose sums nothing), laid out ``[data, time, ...]``; then the sum bucket by bucket (over
``time`` in fp32 inside the host, then over ``data``) (leaves concatenated up
to ``grad_bucket_mb``), each bucket's collectives depending only on its own gradients, so on an
accelerator a bucket's reduction can run while the backward pass still computes the others
(:mod:`motionjax.core.reduce` has the math). The residuals of the compression live in the train state
(``state["grad_residual"]``, ``[data, L]`` per bucket, split over ``data``: each device holds its own),
so they are checkpointed and restored with it.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from motionjax import parallel
from motionjax.core import reduce


def is_explicit(wire: str, levels: int, micro_batches: int) -> bool:
    """False: XLA's own fp32 all-reduce (the default step). Anything else is the step's explicit
    reduction: another wire format, two levels, or micro-batches (XLA's would all-reduce inside the
    loop over them, once per slice). The one test of this, for :class:`Plan` and the config checks."""
    return wire != "fp32" or levels == 2 or micro_batches > 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """The gradient reduction of one run: wire format, levels, and the buckets of parameter leaves."""

    wire: str                              # "fp32" | "bf16" | "int8"
    levels: int                            # 1: flat over data; 2: inside hosts, then across
    data: int                              # size of the data axis
    host_size: int                         # data devices per host (levels 2)
    buckets: tuple[tuple[int, ...], ...]   # indices into jax.tree.leaves(params), per bucket
    sizes: tuple[int, ...]                 # elements per bucket, padded to a multiple of data * BLOCK
    ordered: bool = False                  # fp32 two-level: across hosts in device order, not a psum
    micro_batches: int = 1                 # slices of the step's batch summed before the one reduction

    @property
    def explicit(self) -> bool:
        """:func:`is_explicit` of this plan."""
        return is_explicit(self.wire, self.levels, self.micro_batches)

    @property
    def hosts(self) -> int:
        return self.data // self.host_size if self.levels == 2 else 1

    def describe(self) -> str:
        """One log line: which reduction the run uses."""
        if not self.explicit:
            return f"gradient reduction: fp32 all-reduce over data ({self.data} devices), XLA's (exact)"
        where = (f"two-level: reduce-scatter inside {self.hosts} hosts of {self.host_size}, {self.wire} "
                 f"across hosts, all-gather inside" if self.levels == 2 else f"flat, {self.wire}")
        ordered = ", summed in device order" if self.ordered else ""
        feedback = ", error feedback" if self.wire != "fp32" else ordered
        micro = f", once per {self.micro_batches} micro-batches" if self.micro_batches > 1 else ""
        mib = sum(self.sizes) * 4 / 2**20
        return (f"gradient reduction: {where} over data ({self.data} devices), {len(self.sizes)} buckets "
                f"({mib:.2f} MiB fp32){feedback}{micro}")


def make_plan(cfg: ml_collections.ConfigDict, mesh, params) -> Plan:
    """The plan of ``cfg`` = ``config.train`` on ``mesh`` for the parameter tree ``params`` (arrays
    or shape structs)."""
    data = mesh.shape[parallel.DATA_AXIS]
    host_size = cfg.grad_reduce_host_size or data // jax.process_count()
    if cfg.grad_reduce_levels == 2 and (host_size <= 0 or data % host_size):
        raise ValueError(f"train.grad_reduce_host_size={host_size} does not divide the data axis ({data})")
    cap = max(int(cfg.grad_bucket_mb * 2**20 / 4), 1)
    buckets, current, filled = [], [], 0
    for i, leaf in enumerate(jax.tree.leaves(params)):
        size = math.prod(leaf.shape)
        if current and filled + size > cap:
            buckets.append(tuple(current))
            current, filled = [], 0
        current.append(i)
        filled += size
    if current:
        buckets.append(tuple(current))
    shapes = [leaf.shape for leaf in jax.tree.leaves(params)]
    unit = data * reduce.BLOCK
    sizes = tuple(-(-sum(math.prod(shapes[i]) for i in b) // unit) * unit for b in buckets)
    return Plan(cfg.grad_reduce, cfg.grad_reduce_levels, data, host_size, tuple(buckets), sizes,
                cfg.grad_reduce_ordered, cfg.micro_batches)


def init_residual(plan: Plan) -> dict:
    """The error-feedback state: ``{"worker": {bucket: [data, L or L/d]}, "server": {bucket: [data,
    L/data]}}`` fp32 zeros (empty for fp32: nothing to feed back)."""
    if plan.wire == "fp32":
        return {}
    d = plan.host_size if plan.levels == 2 else 1
    zeros = lambda div: {f"{b:03d}": np.zeros((plan.data, n // div), np.float32)  # noqa: E731
                         for b, n in enumerate(plan.sizes)}
    return {"worker": zeros(d), "server": zeros(plan.data)}


def residual_shardings(mesh, residual):
    """Each device holds its own row of every residual: ``[data, ...]`` split over ``data``."""
    return jax.tree.map(lambda _: NamedSharding(mesh, P(parallel.DATA_AXIS)), residual)


def _reducer(plan: Plan, mesh):
    """``shard_map`` of (grads ``[data, time, ...]`` per leaf, residual) -> (summed grads, residual)."""
    data, time = parallel.DATA_AXIS, parallel.TIME_AXIS

    def reduce_all(grads, residual):
        leaves, treedef = jax.tree.flatten(grads)
        leaves = [g[0, 0] for g in leaves]
        out, worker, server = list(leaves), {}, {}
        for b, (members, size) in enumerate(zip(plan.buckets, plan.sizes, strict=True)):
            key = f"{b:03d}"
            flat = jnp.concatenate([leaves[i].astype(jnp.float32).ravel() for i in members])
            flat = jnp.pad(flat, (0, size - flat.size))
            if mesh.shape[time] > 1:  # time shards of one window: fp32 inside the host, bucket by bucket
                flat = jax.lax.psum(flat, time)
            w, s = (residual["worker"][key][0], residual["server"][key][0]) if residual else (None, None)
            if plan.levels == 2:
                total, w, s = reduce.two_level_psum(flat, w, s, plan.wire, data, plan.hosts, plan.ordered)
            else:
                total, w, s = reduce.compressed_psum(flat, w, s, plan.wire, data, ordered=plan.ordered)
            if residual:
                worker[key], server[key] = w[None], s[None]
            offset = 0
            for i in members:
                g = leaves[i]
                out[i] = total[offset:offset + g.size].reshape(g.shape).astype(g.dtype)
                offset += g.size
        return treedef.unflatten(out), ({"worker": worker, "server": server} if residual else {})

    # The sum: its all-gathers over device groups leave the same value on every device of data.
    return jax.shard_map(reduce_all, mesh=mesh, in_specs=(P(data, time), P(data)), out_specs=(P(), P(data)),
                         check_vma=False)


def lower_reduction(plan: Plan, mesh) -> jax.stages.Lowered:
    """The reduction alone, lowered for abstract per-device gradients: one ``[data, time, L]`` leaf
    per bucket of ``plan`` (what ``benchmarks/comm_report.py`` reads the bytes of, without the model)."""
    time = mesh.shape[parallel.TIME_AXIS]
    grads = [jax.ShapeDtypeStruct((plan.data, time, n), np.float32) for n in plan.sizes]
    one = dataclasses.replace(plan, buckets=tuple((i,) for i in range(len(plan.sizes))))
    residual = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), init_residual(one))
    return jax.jit(_reducer(one, mesh)).lower(grads, residual)


def value_and_grad(loss_and_grads, plan: Plan, mesh, batch_specs: dict):
    """``loss_and_grads(params, rest, batch) -> ((loss, aux), grads)`` (one device's, inside
    ``shard_map``) -> ``f(params, rest, batch, residual) -> ((loss, aux), grads, residual)`` with the
    gradient summed over ``data`` as ``plan`` says; ``batch_specs``: ``{key: PartitionSpec}`` of every
    batch key the step may get."""
    axes = (parallel.DATA_AXIS, parallel.TIME_AXIS)

    def per_device(params, rest, batch):
        (loss, aux), grads = loss_and_grads(jax.lax.pcast(params, axes, to="varying"), rest, batch)
        return (loss, aux), jax.tree.map(lambda g: g[None, None], grads)

    reduce_fn = _reducer(plan, mesh)

    def f(params, rest, batch, residual):
        # Gradients per device: vma-checked, so psum / broadcast transpose exactly (see the module doc).
        specs = {k: batch_specs[k] for k in batch}
        grads_fn = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), specs), out_specs=(P(), P(*axes)),
                                 check_vma=True)
        out, grads = grads_fn(params, rest, batch)
        grads, residual = reduce_fn(grads, residual)
        return out, grads, residual

    return f
