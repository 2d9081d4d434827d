"""Where arrays live: the device mesh, logical-axis sharding rules, and the multi-host start.

The mesh comes from ``config.mesh`` (``shape = (("data", -1), ("time", 1))``, -1 fills with the
remaining devices). Code never names mesh axes directly: it names the *logical* axes of an array
(``batch``, ``chunk``, ``embed`` ...) and :data:`LOGICAL_RULES` maps them onto the mesh, as in
MaxText (``flax.linen.logical_to_mesh_axes`` resolves them: rules in order, each mesh axis used at
most once per array).

Parameters are replicated by default; with ``fsdp`` each parameter's largest dimension that the
``data`` axis divides is split over ``data`` (big_vision's ``fsdp`` strategy), which needs no
annotations in the model.

Several processes (``jax.distributed``): :func:`initialize` joins them, :func:`make_mesh` lays the
``across_hosts`` axis over them, :func:`put` and :func:`global_batch` place host data on devices
that one process cannot address. :func:`collectives` and :func:`compile_partitioned` account for
what a compiled program sends (``scripts/comm_report.py``, ``tests/test_parallel.py``).
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

# Logical axis -> mesh axis (None: replicated).
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),      # windows of the global batch
    ("chunk", "time"),      # time chunks N of a [B, N, C, F] window; halos cross these
    ("time", "time"),       # the frame axis T of an unchunked [B, T, ...] window (T = N * C)
    ("frame", None),        # frames inside one chunk (C)
    ("joint", None),        # skeleton joints J
    ("feature", None),      # per-frame features F
    ("embed", None),        # model width
    ("mlp", None),          # MLP hidden width
    ("heads", None),        # attention heads
    ("head_dim", None),     # per-head width
)
_FSDP_MIN_SIZE = 2**12  # smaller parameters stay replicated under FSDP: gathering costs more than it saves


# --------------------------------------------------------------------------------------------
# Mesh
# --------------------------------------------------------------------------------------------
def mesh_shape(shape: Sequence[tuple[str, int]], num_devices: int) -> dict[str, int]:
    """``(("data", -1), ("time", 2))``, 8 devices -> ``{"data": 4, "time": 2}``: one -1 fills."""
    names = [name for name, _ in shape]
    sizes = [int(size) for _, size in shape]
    if len(set(names)) != len(names):
        raise ValueError(f"mesh.shape {tuple(shape)}: repeated axis name")
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh.shape {tuple(shape)}: sizes must be positive, with at most one -1")
    fixed = int(np.prod([s for s in sizes if s != -1]))
    if num_devices % fixed:
        raise ValueError(f"mesh.shape {tuple(shape)} does not divide {num_devices} devices")
    sizes = [num_devices // fixed if s == -1 else s for s in sizes]
    if int(np.prod(sizes)) != num_devices:
        used = int(np.prod(sizes))
        raise ValueError(f"mesh.shape {tuple(shape)} -> {sizes} uses {used} of {num_devices} devices")
    return dict(zip(names, sizes, strict=True))


def make_mesh(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of ``mesh_config.shape`` over ``devices`` (default: all), with Auto axis types.

    With several processes the ``mesh_config.across_hosts`` axis spans the processes (slow
    network) and every other axis stays inside one process (fast links): a hybrid mesh.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_shape(mesh_config.shape, len(devices))
    names = tuple(sizes)
    axis_types = (AxisType.Auto,) * len(names)
    num_processes = len({d.process_index for d in devices})
    if num_processes == 1:
        return jax.make_mesh(tuple(sizes.values()), names, axis_types=axis_types, devices=devices)
    across = mesh_config.across_hosts
    if sizes[across] % num_processes:
        raise ValueError(f"mesh axis {across!r} (size {sizes[across]}) cannot span {num_processes} processes")
    dcn = tuple(num_processes if n == across else 1 for n in names)
    ici = tuple(s // d for s, d in zip(sizes.values(), dcn, strict=True))
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    return Mesh(grid, names, axis_types=axis_types)


# --------------------------------------------------------------------------------------------
# Logical axes -> shardings
# --------------------------------------------------------------------------------------------
def logical_to_mesh(names: Sequence[str | None]) -> PartitionSpec:
    """``("batch", "chunk", "frame", "feature")`` -> ``P("data", "time", None, None)``."""
    known = {name for name, _ in LOGICAL_RULES}
    unknown = [n for n in names if n is not None and n not in known]
    if unknown:
        raise KeyError(f"unknown logical axes {unknown}; known: {sorted(known)}")
    return nn.logical_to_mesh_axes(tuple(names), LOGICAL_RULES)


def named_sharding(mesh: Mesh, *names: str | None) -> NamedSharding:
    """The sharding of an array whose dimensions have logical ``names``."""
    return NamedSharding(mesh, logical_to_mesh(names))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def window_sharding(mesh: Mesh) -> NamedSharding:
    """``[B, N, C, F]`` time-chunked windows: batch over ``data``, chunks over ``time``."""
    return named_sharding(mesh, "batch", "chunk", "frame", "feature")


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """A batch leaf ``[B]``, ``[B, F]`` (per window) or ``[B, T|N, ...]`` (time second, over ``time``)."""
    if ndim <= 2:
        return named_sharding(mesh, "batch", *(None,) * (ndim - 1))
    names = ("batch", "chunk") + (None,) * (ndim - 2)
    return named_sharding(mesh, *names)


def param_sharding(mesh: Mesh, shape: Sequence[int], fsdp: bool = False) -> NamedSharding:
    """Replicated, or with ``fsdp`` the largest dimension that ``data`` divides split over ``data``."""
    data = mesh.shape.get("data", 1)
    if not fsdp or data == 1 or int(np.prod(shape, dtype=np.int64)) < _FSDP_MIN_SIZE:
        return replicated(mesh)
    for axis in np.argsort(shape)[::-1]:
        if shape[axis] % data == 0:
            spec = [None] * len(shape)
            spec[axis] = "data"
            return NamedSharding(mesh, PartitionSpec(*spec))
    return replicated(mesh)


def state_shardings(mesh: Mesh, state, fsdp: bool = False):
    """Shardings for a pytree of parameters / optimizer state (same tree, NamedSharding leaves)."""
    return jax.tree.map(lambda x: param_sharding(mesh, np.shape(x), fsdp), state)


def put(tree, shardings):
    """``jax.device_put`` that also works with several processes, where every process holds the
    whole value of each leaf (same seed, same host data) and keeps the pieces its devices own.
    Under tracing (``jax.eval_shape``, ``jit``) it is a sharding constraint."""
    def one(x, sharding):
        if isinstance(x, jax.core.Tracer):
            return jax.lax.with_sharding_constraint(x, sharding)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # keys travel as their raw bits
            bits = one(jax.random.key_data(x), sharding)
            return jax.random.wrap_key_data(bits, impl=jax.random.key_impl(x))
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree, shardings)


def global_batch(local_batch, mesh: Mesh):
    """This process's slice of the batch (numpy leaves ``[B / P, ...]``) -> global arrays on ``mesh``.

    Each process reads only its own share of the data; the global batch is their concatenation
    along ``B`` in process order (the order of the ``data`` axis in :func:`make_mesh`).
    """
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(x)), np.asarray(x)),
        local_batch,
    )


# --------------------------------------------------------------------------------------------
# Multi-host start
# --------------------------------------------------------------------------------------------
def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Join the multi-controller runtime (``jax.distributed``); a no-op for one process.

    Call before anything touches a device. Arguments left ``None`` come from the environment:
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` (set by
    ``scripts/launch_local.sh``), else JAX's own cluster detection (SLURM, Open MPI, Kubernetes).
    On CPU the cross-process collectives run over gloo.
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and "JAX_NUM_PROCESSES" in env:
        num_processes = int(env["JAX_NUM_PROCESSES"])
    if process_id is None and "JAX_PROCESS_ID" in env:
        process_id = int(env["JAX_PROCESS_ID"])
    if num_processes is None:
        num_processes = int(env.get("SLURM_NTASKS", env.get("OMPI_COMM_WORLD_SIZE", 1)))
    if num_processes <= 1 or jax.distributed.is_initialized():
        return
    # The default CPU client has no cross-process collectives; must be set before backends start.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


def retain_host_memory() -> bool:
    """Keep freed host memory in the process for reuse instead of handing it back to the OS.

    XLA:CPU allocates each execution's temporaries afresh (~40 MB for the default train step).
    glibc serves blocks over its 32 MB mmap ceiling with freshly mapped pages and trims freed heap
    tops, so every step page-faults through zeroed memory again: a quarter of the default CPU
    step's time (loss + gradient 22.6 vs 30.6 ms, measured with and without). With mmap and
    trimming off, freed blocks are reused. Process-wide; torch's CPU allocator gets it too.
    Returns False (and changes nothing) where the C library is not glibc.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def is_main_process() -> bool:
    """Logs, progress bars, plots and summaries come from process 0 only."""
    return jax.process_index() == 0


# --------------------------------------------------------------------------------------------
# Communication accounting: what a compiled step sends
# --------------------------------------------------------------------------------------------
_COLLECTIVE = re.compile(
    r"=\s*(?P<type>\([^)]*\)|\w+\[[^\]]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)\("
)
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_BITS = {"pred": 8, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32,
         "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program, as seen by one device."""

    op: str                 # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    dtype: str              # element type of the (first) buffer, e.g. "f32"
    result_bytes: int       # bytes of the op's result on one device
    axes: tuple[str, ...]   # mesh axes its device groups span
    group_size: int         # devices per group (2 for a permute pair)

    @property
    def wire_bytes(self) -> float:
        """Bytes one device sends, with bandwidth-optimal (ring) algorithms."""
        n, s = self.group_size, self.result_bytes
        if n <= 1:
            return 0.0
        ring = (n - 1) / n
        return {"all-reduce": 2 * ring * s, "all-gather": ring * s, "reduce-scatter": (n - 1) * s,
                "all-to-all": ring * s, "collective-permute": s}[self.op]


def _groups(line: str) -> list[list[int]]:
    """Device groups of a collective: pairs, iota ``[2,2]<=[2,2]T(1,0)``, named ``mesh[...] {axes}``, or
    explicit ``{{0,2},{1,3}}``."""
    if m := re.search(r"source_target_pairs=\{(\{[\d,{}]*\})\}", line):
        return [[int(v) for v in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", m.group(1))]
    if m := re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line):
        shape, dims = [int(v) for v in m.group(1).split(",")], [int(v) for v in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return ids.reshape(-1, shape[-1]).tolist()
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line):
        # Named form: the groups run along the listed axes of an iota device mesh.
        if ":(" in m.group(2):
            raise ValueError(f"sub-axis replica groups are not supported: {m.group(0)}")
        names, sizes = zip(*[(n, int(v)) for n, v in re.findall(r"'(\w+)'=(\d+)", m.group(1))], strict=True)
        along = [names.index(n) for n in re.findall(r"'(\w+)'", m.group(2))]
        across = [i for i in range(len(names)) if i not in along]
        ids = np.arange(math.prod(sizes)).reshape(sizes).transpose(across + along)
        return ids.reshape(-1, math.prod(sizes[i] for i in along)).tolist()
    if m := re.search(r"replica_groups=\{(\{[\d,{}]*\})\}", line):
        return [[int(v) for v in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", m.group(1))]
    return []  # replica_groups={}: one group of every device


def compile_partitioned(lowered: jax.stages.Lowered) -> tuple[jax.stages.Compiled, str]:
    """Compile ``lowered``; also return its HLO text right after SPMD partitioning.

    That is where the partitioner has placed every collective, in the dtype it chose, before
    backend passes: XLA:CPU then upcasts bf16 collectives to f32 (GPUs and TPUs reduce in bf16), so
    the partitioned HLO, not the CPU executable, tells what an accelerator would send.
    """
    with tempfile.TemporaryDirectory() as tmp:
        dump = {"xla_dump_to": tmp, "xla_dump_hlo_pass_re": "spmd-partitioning"}
        compiled = lowered.compile(compiler_options=dump)
        (path,) = Path(tmp).glob("*after_spmd-partitioning*.txt")
        return compiled, path.read_text()


def collectives(hlo_text: str, mesh: Mesh) -> list[Collective]:
    """The collectives of compiled HLO text (``jitted.lower(...).compile().as_text()``) on ``mesh``.

    Device ids in the HLO are positions in the mesh's flattened device order, which locates each
    group on the mesh axes. Reads the synchronous collectives the CPU compiler emits; each is
    counted once, so one inside a loop body would count once, not once per iteration.
    """
    coords = np.stack(np.unravel_index(np.arange(mesh.size), mesh.devices.shape), axis=1)  # [D, axes]
    found = []
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if m is None:
            continue
        arrays = _ARRAY.findall(m.group("type"))
        nbytes = sum(_BITS[t] // 8 * math.prod(int(d) for d in dims.split(",") if d) for t, dims in arrays)
        groups = _groups(line) or [list(range(mesh.size))]
        spans = {i for g in groups for i in np.flatnonzero(np.ptp(coords[g], axis=0) > 0)}
        axes = tuple(mesh.axis_names[i] for i in sorted(spans))
        found.append(Collective(m.group("op"), arrays[0][0], nbytes, axes, max(len(g) for g in groups)))
    return found
