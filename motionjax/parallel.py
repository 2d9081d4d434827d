"""Where arrays live: the device mesh, logical-axis sharding rules, and the multi-host start.

The mesh comes from ``config.mesh`` (``shape = (("data", -1), ("time", 1))``, -1 fills with the
remaining devices). Its two axes are named once, here (:data:`DATA_AXIS`, :data:`TIME_AXIS`): code
that names a mesh axis (collectives inside ``shard_map``, partition specs) imports them. Array
placement names the *logical* axes of an array (``batch``, ``chunk``, ``frame`` ...) and
:data:`LOGICAL_RULES` maps them onto the mesh, as in MaxText (``flax.linen.logical_to_mesh_axes``
resolves them: rules in order, each mesh axis used at most once per array).

Parameters are replicated by default; with ``fsdp`` each parameter's largest dimension that the
``data`` axis divides is split over ``data`` (big_vision's ``fsdp`` strategy), which needs no
annotations in the model.

Several processes (``jax.distributed``): :func:`initialize` joins them, :func:`make_mesh` lays the
``across_hosts`` axis over them, :func:`put` and :func:`global_batch` place host data on devices
that one process cannot address. What a compiled program sends over the mesh:
:mod:`motionjax.train.diagnostics`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"  # mesh axis of the batch (windows); the one that spans hosts (mesh.across_hosts)
TIME_AXIS = "time"  # mesh axis of the time chunks of a window; halos cross it

# Logical axis -> mesh axis (None: replicated). Parameters are not named: see param_sharding.
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA_AXIS),   # windows of the global batch
    ("chunk", TIME_AXIS),   # time chunks N of a [B, N, C, F] window; halos cross these
    ("time", TIME_AXIS),    # the frame axis T of an unchunked [B, T, ...] window (T = N * C)
    ("frame", None),        # frames inside one chunk (C)
    ("joint", None),        # skeleton joints J
    ("feature", None),      # per-frame features F
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


def manual_axes() -> frozenset[str]:
    """The mesh axes the code being traced is already inside a ``shard_map`` over (empty outside):
    there, code that would open a ``shard_map`` of its own runs its per-device body directly."""
    return frozenset(jax.sharding.get_abstract_mesh().manual_axes)


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


# The logical axes of each batch leaf the train step reads. Time-chunked windows go over data x time;
# a per-window leaf over data only, since every time shard of a window needs all of it.
BATCH_AXES: dict[str, tuple[str | None, ...]] = {
    "noisy": ("batch", "chunk", "frame", "feature"),   # [B, N, C, F] the model's input
    "clean": ("batch", "chunk", "frame", "feature"),   # [B, N, C, F] the target
    "valid": ("batch", "chunk", "frame", "feature"),   # [B, N, C, 1] 0 = padding frame
    "offsets": ("batch", "joint", None),               # [B, J, 3] each window's clip bones
    "segment": ("batch",),                             # [B] int32 each window's training segment
    # Objectives other than reconstruction (train.step's `objective` hook; distillation):
    "target": ("batch", "chunk", "frame", "feature"),  # [B, N, C, F] another target (a teacher's output)
    "target_weight": ("batch",),                       # [B] its weight against the clean target
}


def batch_shardings(mesh: Mesh, keys: Sequence[str]) -> dict[str, NamedSharding]:
    """``{key: sharding}`` of the batch leaves ``keys`` (:data:`BATCH_AXES`)."""
    unknown = [k for k in keys if k not in BATCH_AXES]
    if unknown:
        raise KeyError(f"batch keys {unknown} have no logical axes; known: {sorted(BATCH_AXES)}")
    return {k: named_sharding(mesh, *BATCH_AXES[k]) for k in keys}


def window_sharding(mesh: Mesh) -> NamedSharding:
    """``[B, N, C, F]`` time-chunked windows: batch over ``data``, chunks over ``time``."""
    return named_sharding(mesh, *BATCH_AXES["noisy"])


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """A batch leaf ``[B]``, ``[B, F]`` (per window) or ``[B, T|N, ...]`` (time second, over ``time``)."""
    if ndim <= 2:
        return named_sharding(mesh, "batch", *(None,) * (ndim - 1))
    names = ("batch", "chunk") + (None,) * (ndim - 2)
    return named_sharding(mesh, *names)


def param_sharding(mesh: Mesh, shape: Sequence[int], fsdp: bool = False) -> NamedSharding:
    """Replicated, or with ``fsdp`` the largest dimension that ``data`` divides split over ``data``."""
    data = mesh.shape.get(DATA_AXIS, 1)
    if not fsdp or data == 1 or int(np.prod(shape, dtype=np.int64)) < _FSDP_MIN_SIZE:
        return replicated(mesh)
    for axis in np.argsort(shape)[::-1]:
        if shape[axis] % data == 0:
            spec = [None] * len(shape)
            spec[axis] = DATA_AXIS
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


def to_host(x) -> np.ndarray:
    """A global array -> the whole of it as numpy in every process (small arrays: per-window values)."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


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


def is_main_process() -> bool:
    """Logs, progress bars, plots and summaries come from process 0 only."""
    return jax.process_index() == 0
