"""Joint-dynamics loss + gradient: blocked Jacobian vs jax.jvp/vjp of FK vs dense jax.jacfwd.

For each skeleton size J, frames per batch and dtype, the three backends of
:func:`motionjax.core.dynamics.dynamics_loss` are jitted (loss + gradient w.r.t. the predicted root and
rotations, as training uses it), their lowering and XLA compile seconds kept apart
(:func:`benchmarks.measure.lower_and_compile`), their compiled temp memory read from
``compiled.memory_analysis()``, and timed round-robin: each round times every backend once (after
an untimed call of the same program: steady state, as in training), so a load change on a shared
machine hits all alike; times are medians over rounds and each ratio comes with the spread of its
per-round ratios. Prints a table, writes JSON and a PNG plot.

The library of ``benchmarks/bench_dynamics.py`` (the command line) and of ``benchmarks/bench.py`` part c:
``run``, ``markdown`` and ``plot``.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import measure
from motionjax import malloc
from motionjax.core import dynamics, rotations
from motionjax.core.skeleton import deepmimic_humanoid, random_tree, smpl_like

WEIGHTS = dynamics.DEFAULT_WEIGHTS
FPS = 30.0
WINDOW = 64  # frames per window; batch = frames per batch / WINDOW
FRAMES = (256, 1024, 4096, 65536)
TARGET_FRAMES = (256, 1024, 4096)  # the sizes issue #15's targets name (check_targets)
DTYPES = ("float32", "bfloat16")
# The dense Jacobian holds 3J × num_dof entries per frame (and jacfwd pushes num_dof tangents
# through FK): above this many entries per batch it takes minutes and GBs, so it is skipped.
DENSE_MAX_ENTRIES = 25e6
MAX_TEMP_MB = 8000  # a program needing more temp memory than this is compiled, not run
SECONDS_PER_SIZE = 12.0  # timing budget per (J, frames, dtype): sets the number of rounds


def skeletons():
    """(label, skeleton): J = 13 is the DeepMimic humanoid (15 joints, 13 that rotate)."""
    return [("13 (deepmimic, 15 joints)", deepmimic_humanoid()), ("24 (smpl_like)", smpl_like()),
            ("52 (random_tree)", random_tree(52, seed=0)), ("100 (random_tree)", random_tree(100, seed=0))]


def _motion(skeleton, batch, frames, seed, dtype=jnp.float32):
    """A smooth random motion ``(root [B, T, 3], rotations [B, T, J, 4])`` plus a noisy copy."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 2 * np.pi, frames)[None, :, None, None]
    phase, amp = rng.uniform(0, 6, (batch, 1, skeleton.num_joints, 3)), rng.uniform(0, 0.6, (batch, 1, 1, 3))
    target = rotations.axis_angle_to_quat(jnp.asarray(amp * np.sin(t + phase), jnp.float32))
    root = jnp.asarray(np.cumsum(rng.normal(0, 0.01, (batch, frames, 3)), axis=1), jnp.float32)
    noisy = rotations.quat_normalize(target + 0.02 * jnp.asarray(rng.normal(size=target.shape), jnp.float32))
    return tuple(x.astype(dtype) for x in (root, target, root + 0.005, noisy))


def _loss_and_grad(skeleton, jacobian):
    def loss(pred_root, pred_rot, target_root, target_rot):
        return dynamics.dynamics_loss(skeleton, pred_root, pred_rot, target_root, target_rot, FPS, WEIGHTS,
                                      jacobian=jacobian)[0]
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _time_round_robin(fns: dict, args, budget_s: float, min_rounds: int = 3, max_rounds: int = 9):
    """Per-round seconds of each compiled function (:func:`benchmarks.measure.interleaved_rounds`,
    each timed call after an untimed one of the same program: steady state, as in training). The
    time of one first call each sets the number of rounds within ``budget_s``."""
    calls = {name: functools.partial(fn, *args) for name, fn in fns.items()}
    first = {name: measure.time_call(call, repeats=1, warmup=0) for name, call in calls.items()}
    rounds = int(np.clip(budget_s / max(2 * sum(first.values()), 1e-6), min_rounds, max_rounds))
    return measure.interleaved_rounds(calls, rounds, repeats=1, warmup=1)


def _ratio(times, name):
    """Median and (min, max) over rounds of ``name``'s time ÷ blocked's in the same round."""
    per_round = np.asarray(times[name]) / np.asarray(times["blocked"])
    return float(np.median(times[name]) / np.median(times["blocked"])), [float(per_round.min()),
                                                                         float(per_round.max())]


def measure_size(label, skeleton, frames, dtype, budget_s=SECONDS_PER_SIZE, dense=True):
    """One row: the three backends at ``frames`` frames per batch (``frames / WINDOW`` windows)."""
    start = time.perf_counter()
    window = min(WINDOW, frames)
    batch = frames // window
    target_root, target_rot, pred_root, pred_rot = _motion(skeleton, batch, window, seed=0,
                                                           dtype=jnp.dtype(dtype))
    args = (pred_root, pred_rot, target_root, target_rot)
    row = {"J": label, "joints": skeleton.num_joints, "depth": len(skeleton.levels), "dof": skeleton.num_dof,
           "frames": frames, "batch": batch, "window": window, "dtype": dtype, "skipped": {}}
    entries = frames * 3 * skeleton.num_joints * skeleton.num_dof
    fns = {}
    for jacobian in dynamics.JACOBIANS:
        row[f"{jacobian}_ms"] = None
        if jacobian == "dense" and (not dense or entries > DENSE_MAX_ENTRIES):
            row["skipped"][jacobian] = f"{entries / 1e6:.0f}M Jacobian entries per batch"
            continue
        lower = lambda j=jacobian: _loss_and_grad(skeleton, j).lower(*args)
        compiled, seconds = measure.lower_and_compile(lower)
        row.update({f"{jacobian}_{k}": v for k, v in seconds.items()})  # lower_s, compile_s, ...
        memory = compiled.memory_analysis()
        temp = memory.temp_size_in_bytes / 2**20 if memory is not None else None
        row[f"{jacobian}_temp_mb"] = temp
        if (temp or 0) > MAX_TEMP_MB:
            row["skipped"][jacobian] = f"{temp:.0f} MB temp memory"
            continue
        fns[jacobian] = compiled
    times = _time_round_robin(fns, args, budget_s)
    row["rounds"] = len(times["blocked"])
    for name, t in times.items():
        row[f"{name}_ms"] = 1e3 * float(np.median(t))
        row[f"{name}_ms_rounds"] = [1e3 * x for x in t]
    for name in ("jvp", "dense"):
        row[f"{name}_over_blocked"], row[f"{name}_over_blocked_range"] = (
            _ratio(times, name) if name in times else (None, None))
    row["wall_s"] = time.perf_counter() - start  # compiles included: what a row costs the grid
    return row


def run(quick: bool = False, budget_s: float | None = None, partial: Path | None = None, joints=None,
        frames=None, dtypes=None, grid_budget_s: float | None = None) -> dict:
    """Every (dtype, J, frames) row, printed as it completes; returns the JSON-able results.

    ``quick``: J = 13 and 24 at 256 and 1,024 frames, float32 only. ``joints``, ``frames``,
    ``dtypes``: subsets of the grid (default: all of it, hours on 2 cores: each row compiles three
    programs, ~0.5–2 min at J ≤ 24 and several at J = 100). ``budget_s``: timing seconds per row (sets
    the rounds). ``grid_budget_s``: no row starts once the grid has run this long; the rows left are
    listed under ``not_run`` (the row running then finishes, so the grid can overrun by one row).
    ``partial``: a JSON file rewritten after every row (a long run interrupted keeps what it measured).

    Rows run in order of what the #15 targets need: float32 at 256–4,096 frames first (per J, the
    largest size first), then the other sizes, then the other dtypes.
    """
    sizes = tuple(frames or (FRAMES[:2] if quick else FRAMES))
    dtypes = tuple(dtypes or (DTYPES[:1] if quick else DTYPES))
    chosen = [s for s in (skeletons()[:2] if quick else skeletons())
              if not joints or int(s[0].split()[0]) in joints]
    budget_s = budget_s or (4.0 if quick else SECONDS_PER_SIZE)
    # One arena (motionjax.malloc): freed temporaries stay in the process. Without it, every call after the
    # dense backend's ~GB of temporaries page-faults its own buffers afresh (blocked at J = 24,
    # 1,024 frames measured ~3x slower that way).
    malloc.keep_freed_memory()
    grid = sorted(((dtype, i, frames) for dtype in dtypes for i in range(len(chosen)) for frames in sizes),
                  key=lambda g: (DTYPES.index(g[0]) if g[0] in DTYPES else len(DTYPES),
                                 g[2] not in TARGET_FRAMES, g[1], -g[2]))
    print(HEADER, flush=True)
    rows, not_run, start = [], [], time.perf_counter()
    for dtype, i, frames in grid:
        if grid_budget_s is not None and time.perf_counter() - start >= grid_budget_s:
            not_run.append({"J": chosen[i][0], "frames": frames, "dtype": dtype})
            continue
        rows.append(measure_size(*chosen[i], frames, dtype, budget_s))
        print(_format_row(rows[-1]), flush=True)
        if partial is not None:
            partial.write_text(json.dumps({"rows": rows}, indent=1))
    if not_run:
        print(f"grid budget of {grid_budget_s:.0f} s spent: {len(not_run)} row(s) not run", flush=True)
    return {"window": WINDOW, "frames": list(sizes), "dtypes": list(dtypes), "backend": jax.default_backend(),
            "devices": jax.device_count(), "dense_max_entries": DENSE_MAX_ENTRIES, "rows": rows,
            "not_run": not_run, "grid_budget_s": grid_budget_s, "wall_s": time.perf_counter() - start,
            "targets": check_targets(rows)}


def check_targets(rows) -> dict:
    """Issue #15's criteria on these rows (float32): jvp ÷ blocked ≥ 1.5 at 1,024 and 4,096 frames
    and ≥ 1 at 256 for every J measured; dense ÷ blocked ≥ 50 at J = 24 and 4,096 frames.

    ``met``: every target these rows measure is met (and at least one is measured); ``measured``:
    which targets the rows cover; ``joints``: the J of the float32 rows (a grid of J = 24 alone says
    nothing about J = 100)."""
    fp32 = [r for r in rows if r["dtype"] == "float32"]
    speed = [r for r in fp32 if r["frames"] in (1024, 4096) and r["jvp_over_blocked"] is not None]
    small = [r for r in fp32 if r["frames"] == 256 and r["jvp_over_blocked"] is not None]
    dense = [r for r in fp32 if r["joints"] == 24 and r["frames"] == 4096 and r["dense_over_blocked"]]
    out = {"jvp_over_blocked_min_at_1024_4096": min((r["jvp_over_blocked"] for r in speed), default=None),
           "jvp_over_blocked_min_at_256": min((r["jvp_over_blocked"] for r in small), default=None),
           "dense_over_blocked_J24_4096": dense[0]["dense_over_blocked"] if dense else None}
    thresholds = {"jvp_over_blocked_min_at_1024_4096": 1.5, "jvp_over_blocked_min_at_256": 1.0,
                  "dense_over_blocked_J24_4096": 50.0}
    out["measured"] = [k for k in thresholds if out[k] is not None]
    out["joints"] = sorted({r["joints"] for r in fp32})
    out["met"] = bool(out["measured"]) and all(out[k] >= thresholds[k] for k in out["measured"])
    return out


HEADER = (f"{'dtype':>8} {'J':>26} {'frames':>6} | {'blocked ms':>10} {'jvp ms':>9} {'dense ms':>9} | "
          f"{'jvp/blk (range)':>19} {'dense/blk':>9} | {'temp MB blk/jvp/dense':>21} "
          f"{'compile s blk/jvp/dense':>23} {'rounds':>6} {'row s':>6}")


def _num(x, spec):
    return "skipped" if x is None else format(x, spec)


def _format_row(row):
    temps = "/".join(f"{row[f'{n}_temp_mb']:.0f}" if row.get(f"{n}_temp_mb") is not None else "-"
                     for n in dynamics.JACOBIANS)
    compiles = "/".join(f"{row[f'{n}_compile_s']:.1f}" if row.get(f"{n}_compile_s") is not None else "-"
                        for n in dynamics.JACOBIANS)
    spread = row["jvp_over_blocked_range"]
    jvp = (f"{row['jvp_over_blocked']:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"
           if row["jvp_over_blocked"] is not None else "skipped")
    return (f"{row['dtype']:>8} {row['J']:>26} {row['frames']:>6} | {row['blocked_ms']:>10.1f} "
            f"{_num(row['jvp_ms'], '9.1f'):>9} {_num(row['dense_ms'], '9.1f'):>9} | {jvp:>19} "
            f"{_num(row['dense_over_blocked'], '8.1f'):>8}x | {temps:>21} {compiles:>23} {row['rounds']:>6} "
            f"{row['wall_s']:>6.0f}")


def markdown(results: dict) -> list[str]:
    """The results as markdown table lines (one table per dtype)."""
    lines = []
    for dtype in results["dtypes"]:
        lines += ["", f"{dtype}, loss + gradient, ms per call (median of interleaved rounds); ratio ranges "
                  "are the per-round min–max", "",
                  "| J | frames | blocked ms | jvp/vjp ms | dense ms | jvp ÷ blocked (range) | "
                  "dense ÷ blocked |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        rows = sorted((r for r in results["rows"] if r["dtype"] == dtype),
                      key=lambda r: (r["joints"], r["frames"]))
        for r in rows:
            jvp = (f"{r['jvp_over_blocked']:.2f}× ({r['jvp_over_blocked_range'][0]:.2f}–"
                   f"{r['jvp_over_blocked_range'][1]:.2f})" if r["jvp_over_blocked"] is not None else "—")
            dense = (f"{r['dense_over_blocked']:.1f}×" if r["dense_over_blocked"] is not None
                     else f"skipped: {r['skipped'].get('dense', '')}")
            lines.append(f"| {r['J']} | {r['frames']} | {r['blocked_ms']:.1f} | {_num(r['jvp_ms'], '.1f')} | "
                         f"{_num(r['dense_ms'], '.1f')} | {jvp} | {dense} |")
    if results.get("not_run"):
        rows = ", ".join(f"J = {r['J'].split()[0]} × {r['frames']} ({r['dtype']})"
                         for r in results["not_run"])
        lines += ["", f"Not run (grid budget of {results['grid_budget_s']:.0f} s spent): {rows}."]
    return lines


def plot(results: dict, path: Path) -> None:
    """Left: ms per call vs frames per batch (float32; blocked solid, jvp dashed, dense dotted).
    Right: jvp/vjp ÷ blocked per J and dtype, with the 1.5× target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(dict.fromkeys(r["J"] for r in results["rows"]))
    for i, label in enumerate(labels):
        for dtype, marker in zip(results["dtypes"], "os", strict=False):
            rows = [r for r in results["rows"] if r["J"] == label and r["dtype"] == dtype]
            if dtype == "float32":
                for name, style in (("blocked", "-"), ("jvp", "--"), ("dense", ":")):
                    points = [(r["frames"], r[f"{name}_ms"]) for r in rows if r[f"{name}_ms"]]
                    if points:
                        left.loglog(*zip(*points, strict=True), style, marker=marker, color=f"C{i}",
                                    label=f"J={label.split()[0]} {name}")
            points = [(r["frames"], r["jvp_over_blocked"]) for r in rows if r["jvp_over_blocked"]]
            if points:
                right.semilogx(*zip(*points, strict=True), "-" if dtype == "float32" else "--", marker=marker,
                               color=f"C{i}", label=f"J={label.split()[0]} {dtype}")
    right.axhline(1.5, color="k", lw=0.8, ls=":", label="target 1.5×")
    for ax in (left, right):
        ax.set_xticks(results["frames"], [f"{f:,}" for f in results["frames"]])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("frames per batch")
        ax.grid(True, which="both", alpha=0.3)
    left.set_ylabel("loss + gradient (ms), float32")
    left.legend(fontsize=6, ncol=2)
    right.set_ylabel("jvp/vjp ÷ blocked")
    right.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Dynamics loss + gradient, {jax.default_backend()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
