"""What a compiled program sends over the mesh: its collectives read back from HLO text.

:func:`collectives` lists each collective of compiled HLO with the mesh axes its device groups
span and the bytes it moves; :func:`compile_partitioned` also returns the HLO right after SPMD
partitioning, in the dtypes an accelerator would send; :func:`overlap` says, from the dependencies,
how much matrix work each collective could run beside. Used by ``benchmarks/comm_report.py``,
``benchmarks/bench.py`` and ``tests/test_parallel.py``; the mesh itself is :mod:`motionjax.parallel`'s.
"""
from __future__ import annotations

import dataclasses
import math
import re
import tempfile
import uuid
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

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
    groups: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), compare=False)  # mesh positions

    def crosses(self, block: int) -> bool:
        """Whether a group joins devices of different blocks of ``block`` consecutive mesh positions
        (hosts, when each host holds ``block`` consecutive devices of the flattened mesh)."""
        return any(len({i // block for i in g}) > 1 for g in self.groups)

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


def _bytes(arrays) -> int:
    """Bytes of ``[(dtype, "d0,d1,...")]`` arrays."""
    return sum(_BITS[t] // 8 * math.prod(int(d) for d in dims.split(",") if d) for t, dims in arrays)


def compile_partitioned(lowered: jax.stages.Lowered) -> tuple[jax.stages.Compiled, str]:
    """Compile ``lowered``; also return its HLO text right after SPMD partitioning.

    That is where the partitioner has placed every collective, in the dtype it chose, before
    backend passes: XLA:CPU then upcasts bf16 collectives to f32 (GPUs and TPUs reduce in bf16), so
    the partitioned HLO, not the CPU executable, tells what an accelerator would send.
    """
    with tempfile.TemporaryDirectory() as tmp:
        # A persistent-cache hit runs no passes and dumps nothing, and most dump options are not in
        # the cache key; xla_dump_emitter_re is: a unique value (matching no emitter) always compiles.
        dump = {"xla_dump_to": tmp, "xla_dump_hlo_pass_re": "spmd-partitioning",
                "xla_dump_emitter_re": f"^motionjax-{uuid.uuid4().hex}$"}
        compiled = lowered.compile(compiler_options=dump)
        found = list(Path(tmp).glob("*after_spmd-partitioning*.txt"))
        if len(found) != 1:
            raise RuntimeError(f"compile_partitioned: {len(found)} partitioned HLO dumps, expected one")
        return compiled, found[0].read_text()


def collectives(hlo_text: str, mesh: Mesh) -> list[Collective]:
    """The collectives of compiled HLO text (``jitted.lower(...).compile().as_text()``) on ``mesh``.

    Device ids in the HLO are positions in the mesh's flattened device order, which locates each
    group on the mesh axes. Reads the synchronous collectives the CPU compiler emits; each is
    counted once, so one inside a loop body would count once, not once per iteration.
    """
    coords = _coords(mesh)
    return [c for line in hlo_text.splitlines() if (c := _collective(line, mesh, coords)) is not None]


def _coords(mesh: Mesh):
    return np.stack(np.unravel_index(np.arange(mesh.size), mesh.devices.shape), axis=1)  # [D, axes]


def _collective(line: str, mesh: Mesh, coords) -> Collective | None:
    m = _COLLECTIVE.search(line)
    if m is None:
        return None
    arrays = _ARRAY.findall(m.group("type"))
    groups = _groups(line) or [list(range(mesh.size))]
    spans = {i for g in groups for i in np.flatnonzero(np.ptp(coords[g], axis=0) > 0)}
    axes = tuple(mesh.axis_names[i] for i in sorted(spans))
    return Collective(m.group("op"), arrays[0][0], _bytes(arrays), axes, max(len(g) for g in groups),
                      tuple(tuple(g) for g in groups))


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)"
_MATMUL = ("dot", "convolution")


@dataclasses.dataclass(frozen=True)
class _Op:
    name: str
    op: str
    dims: tuple[int, ...]       # of the (first) result array
    operands: tuple[str, ...]
    called: tuple[str, ...]
    line: str


def _computations(hlo_text: str) -> tuple[dict[str, list[_Op]], str]:
    """``({computation: [instructions]}, entry name)`` of HLO text."""
    comps, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        if current is None:
            if (m := _COMPUTATION.match(line)) and "=" not in line.split("(")[0]:
                current = m.group(1)
                comps[current] = []
                entry = current if line.startswith("ENTRY") else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        if m := _INSTRUCTION.match(line):
            rest = m.group(4)
            head = rest.split("), ")[0] if "), " in rest else rest
            arrays = _ARRAY.findall(m.group(2))
            dims = tuple(int(d) for d in arrays[0][1].split(",") if d) if arrays else ()
            comps[current].append(_Op(m.group(1), m.group(3), dims, tuple(re.findall(r"%([\w.\-]+)", head)),
                                      tuple(re.findall(_CALLED, rest)), line))
    return comps, entry


def _matmul_flops(op: _Op, shapes: dict[str, tuple[int, ...]]) -> float:
    """FLOPs of one dot (2 x output x contracted size) or convolution (2 x output x kernel / its
    output features)."""
    if op.op == "dot":
        lhs = shapes.get(op.operands[0], ())
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", op.line)
        contracted = math.prod(lhs[int(i)] for i in m.group(1).split(",") if i) if m and lhs else 1
        return 2.0 * math.prod(op.dims) * contracted
    kernel = shapes.get(op.operands[1], ())
    m = re.search(r"dim_labels=\w+_(\w+)->", op.line)
    if not kernel or not m or "o" not in m.group(1):
        return 0.0
    return 2.0 * math.prod(op.dims) * math.prod(kernel) / kernel[m.group(1).index("o")]


def _flops(comps):
    """``flops(computation)``: its matmul FLOPs, called computations included (memoized)."""
    memo: dict[str, float] = {}

    def flops(comp: str) -> float:
        if comp not in memo:
            memo[comp] = 0.0
            body = comps.get(comp, [])
            shapes = {o.name: o.dims for o in body}
            memo[comp] = sum((_matmul_flops(o, shapes) if o.op in _MATMUL else 0.0)
                             + sum(flops(c) for c in o.called if c in comps) for o in body)
        return memo[comp]

    return flops


def matmul_flops(hlo_text: str) -> float:
    """Matmul FLOPs (dots and convolutions) per device of compiled HLO text, fusions included."""
    comps, entry = _computations(hlo_text)
    return _flops(comps)(entry)


def looped_collectives(hlo_text: str, mesh: Mesh) -> list[Collective]:
    """The collectives of HLO text that run inside a ``while`` loop (its body or condition, or what
    they call): once per iteration, where :func:`collectives` counts them once."""
    comps, _ = _computations(hlo_text)
    todo = [c for ops in comps.values() for o in ops if o.op == "while" for c in o.called]
    inside: set[str] = set()
    while todo:
        if (comp := todo.pop()) in comps and comp not in inside:
            inside.add(comp)
            todo += [c for o in comps[comp] for c in o.called]
    coords = _coords(mesh)
    return [c for comp in inside for o in comps[comp] if (c := _collective(o.line, mesh, coords)) is not None]


def overlap(hlo_text: str, mesh: Mesh) -> list[tuple[Collective, int, float]]:
    """For every collective of the entry computation of compiled HLO text: ``(collective, matmuls,
    flops)``, the matrix products (dots and convolutions, also inside fusions and calls) it neither
    waits for nor feeds, and their FLOPs per device: work a scheduler may run while the collective
    is in flight (none for a gradient reduction that only starts after the whole backward pass)."""
    comps, entry = _computations(hlo_text)
    flops = _flops(comps)
    instructions = comps[entry]
    shapes = {o.name: o.dims for o in instructions}
    work = {o.name: (_matmul_flops(o, shapes) if o.op in _MATMUL else 0.0)
            + sum(flops(c) for c in o.called if c in comps) for o in instructions}
    matmuls = {name for name, w in work.items() if w > 0}
    operands = {o.name: [x for x in o.operands if x in work] for o in instructions}
    users: dict[str, list[str]] = {name: [] for name in operands}
    for name, ops in operands.items():
        for x in ops:
            users[x].append(name)

    def reach(start: str, edges) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    coords, found = _coords(mesh), []
    for o in instructions:
        if (c := _collective(o.line, mesh, coords)) is not None:
            free = matmuls - reach(o.name, operands) - reach(o.name, users)
            found.append((c, len(free), sum(work[n] for n in free)))
    return found
