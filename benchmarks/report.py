"""The benchmark report of ``benchmarks/bench.py``: targets, machine description, the Markdown table
and the plots, from the results dict its part runners fill (``{"quick", "date", "wall_s",
"machine", "parts": {name: result}}``)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import jax
import numpy as np

from motionjax.core.dynamics import JACOBIANS

TARGETS = {"speedup": 5.0, "t_exponent": 1.1}  # growth: "linear" = exponent <= 1.1
MPJPE_TOLERANCE = 0.02  # "equal" held-out MPJPE: within 2% (same batches and weights, other arithmetic)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    versions = {"python": platform.python_version(), "jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "grain"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    device = jax.devices()[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "backend": jax.default_backend(),
            "device": getattr(device, "device_kind", str(device)), "devices": jax.device_count(),
            "versions": versions, "load_average": os.getloadavg()}



def _table(header: list[str], rows: list[list]) -> list[str]:
    """Markdown table lines."""
    line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"
    return [line(header), line(["---"] * len(header)), *(line(r) for r in rows)]


def _yes(flag) -> str:
    return "yes" if flag else "**no**"


def _num(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def _ms(seconds) -> str:
    return f"{1e3 * seconds:.0f}"


def markdown(results: dict) -> str:
    """The whole report: the run's header, the claims table, then one section per part measured."""
    p = results["parts"]
    tr, mf, gr, dy, ip = (p.get(k, {}) for k in ("train", "mfu", "growth", "dynamics", "input"))
    lines = _header(results)
    claims = [*_input_claims(ip), *_train_claims(tr), *_dynamics_claims(dy),
              *_growth_claims(gr), *_mfu_claims(mf)]
    lines += _table(["claim", "measured", "target", "met"], claims)
    lines += (["## Input path", "", ip["markdown"], ""] if "markdown" in ip else [])
    lines += _train_section(tr) + _dynamics_section(dy) + _mfu_section(mf) + \
        _growth_section(gr) + _compile_section(p)
    return "\n".join(lines) + "\n"


def _compile_section(parts: dict) -> list:
    """Seconds to lower (trace to StableHLO) and to compile (XLA) each program the parts compiled:
    the train steps (``compile`` of each part) and the dynamics grid's programs (its rows)."""
    rows = [[name, c["program"], f"{c['lower_s']:.1f}", f"{c['compile_s']:.1f}",
             f"{c['compile_cpu_s']:.1f}", "yes" if c["cache_hit"] else ""]
            for name, part in parts.items() for c in part.get("compile", [])]
    for r in parts.get("dynamics", {}).get("results", {}).get("rows", []):
        rows += [["dynamics", f"loss + gradient, {j}, J = {r['J']}, {r['frames']} frames, {r['dtype']}",
                  f"{r[f'{j}_lower_s']:.1f}", f"{r[f'{j}_compile_s']:.1f}", f"{r[f'{j}_compile_cpu_s']:.1f}",
                  "yes" if r[f"{j}_cache_hit"] else ""] for j in JACOBIANS if f"{j}_lower_s" in r]
    if not rows:
        return []
    return ["", "## Compile seconds per program", "",
            "Lowering (tracing to StableHLO) and XLA compilation, wall seconds, and the compile's CPU "
            "seconds (all threads); cache: loaded from this run's compilation cache (compiled earlier in "
            "the run).",
            "", *_table(["part", "program", "lower s", "compile s", "compile CPU s", "cache"], rows)]


def _header(results: dict) -> list:
    """Title, command, machine, time per part, and the parts that failed."""
    m, p = results["machine"], results["parts"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    mode = results.get("mode", "quick" if results["quick"] else "default")
    command = results.get("command", "python -m benchmarks.bench" + (" --quick" if results["quick"] else ""))
    lines = [f"# motionjax benchmarks{'' if mode == 'default' else f' (--{mode})'}", "",
             f"`{command}` on {m['cpu']}, {m['cores']} "
             f"cores, backend {m['backend']} ({m['devices']} × {m['device']}); {versions}. "
             f"{results['date']}, {results['wall_s']:.0f} s; load average {m['load_average'][0]:.1f} at the "
             "start.", ""]
    if times := results.get("part_wall_s"):
        lines += ["Time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + ".", ""]
    for name, part in p.items():
        if "error" in part:
            lines += [f"**{name}: failed** ({part['error']}); the other parts are complete.", ""]

    return lines


def _input_claims(ip: dict) -> list:
    """Claims of part g: the input overhead (fed vs fixed batch) of each case and tier."""
    return [[f"input overhead, fed vs fixed batch ({key}): {r['check']['figure']}",
             f"**{100 * r[r['check']['figure']]:.1f}%**", f"≤ {100 * r['check']['threshold']:.0f}%",
             _yes(r["check"]["ok"])] for key, r in ip.get("rows", {}).items()]


def _train_claims(tr: dict) -> list:
    """Claims of parts a, b: speedup, equal MPJPE, the input pipeline."""
    claims = []
    if "rows" in tr:
        o, b = tr["rows"]["optimized"], tr["rows"]["baseline"]
        claims.append(["optimized ÷ baseline training frames/s",
                       f"**{tr['speedup']:.2f}×** ({o['frames_per_s']:.0f} vs {b['frames_per_s']:.0f})",
                       f"≥ {TARGETS['speedup']:g}×", _yes(tr["speedup"] >= TARGETS["speedup"])])
        paired = tr["same_stream_mpjpe_mean_cm"]
        claims.append([f"held-out MPJPE after {o['frames']} frames, same batches and initial weights (cm, "
                       "validation clean/noisy)", f"{paired['optimized']:.3f} vs {paired['baseline']:.3f}",
                       f"≤ baseline + {MPJPE_TOLERANCE:.0%}", _yes(tr["mpjpe_equal_or_better"])])
        spread = lambda r: "{:.2f}–{:.2f}".format(min(r["heldout_mpjpe_mean_cm_per_seed"]),
                                                  max(r["heldout_mpjpe_mean_cm_per_seed"]))
        claims.append([f"the same, each config's own loader, mean of {len(o['seeds'])} seed(s) (cm, splits × "
                       "clean/noisy)", f"{o['heldout_mpjpe_mean_cm']:.2f} ({spread(o)}) vs "
                       f"{b['heldout_mpjpe_mean_cm']:.2f} ({spread(b)})", "", ""])
        bd = o["breakdown"]
        claims.append(["input pipeline of the optimized config: loader alone vs step alone; data wait",
                       f"{_ms(bd['loader_s'])} vs {_ms(bd['step_s'])} ms "
                       f"({bd['step_s'] / bd['loader_s']:.1f}×); "
                       f"{100 * o['data_wait_fraction']:.0f}% of training", "", ""])
    return claims


def _dynamics_claims(dy: dict) -> list:
    """Claims of part c: the dynamics loss, blocked vs dense and jvp."""
    claims = []
    if "results" in dy:
        t, at = dy["results"]["targets"], lambda key: t[key] is not None
        joints = "/".join(str(j) for j in t["joints"])
        if at("dense_over_blocked_J24_4096"):
            claims.append(["dynamics loss + gradient, dense `jax.jacfwd` ÷ blocked (J = 24, 4,096 frames)",
                           f"**{t['dense_over_blocked_J24_4096']:.1f}×**", "≥ 50×",
                           _yes(t["dense_over_blocked_J24_4096"] >= 50)])
        if at("jvp_over_blocked_min_at_1024_4096"):
            claims.append(["the same, `jax.jvp`/`vjp` ÷ blocked at 1,024 and 4,096 frames "
                           f"(worst of J = {joints})",
                           f"{t['jvp_over_blocked_min_at_1024_4096']:.2f}×", "≥ 1.5×",
                           _yes(t["jvp_over_blocked_min_at_1024_4096"] >= 1.5)])
        if at("jvp_over_blocked_min_at_256"):
            claims.append([f"the same at 256 frames (worst of J = {joints})",
                           f"{t['jvp_over_blocked_min_at_256']:.2f}×", "≥ 1×",
                           _yes(t["jvp_over_blocked_min_at_256"] >= 1)])
    return claims


def _growth_claims(gr: dict) -> list:
    """Claims of part f: step time against T (and J)."""
    claims = []
    if "fit_T" in gr:
        tail, full = gr["fit_T_tail"]["exponent"], gr["fit_T"]["exponent"]
        sizes = list(gr["by_T"])
        claims.append(["step time ∝ T^k", f"k = {tail:.2f} (T ≥ {sizes[len(sizes) > 2]}); {full:.2f} (all T)",
                       f"k ≤ {TARGETS['t_exponent']}", _yes(gr["met"])])
        if "fit_J" in gr:
            claims.append(["step time ∝ J^k", f"k = {gr['fit_J']['exponent']:.2f}", "", ""])
    return claims


def _mfu_claims(mf: dict) -> list:
    """Claims of part e: MFU."""
    if "mfu" not in mf:
        return []
    achieved, peak = mf["rows"]["optimized"]["achieved_flops"], max(mf["peak_flops"].values())
    return [["MFU of the optimized step",
             f"{100 * mf['mfu']:.1f}% ({achieved / 1e9:.1f} of {peak / 1e9:.0f} GFLOP/s)", "", ""]]


def _train_section(tr: dict) -> list:
    """Section (a, b): end to end, config by config."""
    lines = []
    if "rows" in tr:
        first = tr["rows"]["optimized"]
        splits = list(first["heldout_mpjpe_cm"])
        lines += ["", f"## (a, b) End to end: {tr['steps']} steps of {first['config']['batch']} windows × "
                  f"{first['config']['window']} frames, same data and model", ""]
        rows = []
        for name, r in tr["rows"].items():
            c, bd = r["config"], r["breakdown"]
            rows.append([name, c["jacobian"], c["loader"], c["dtype"], f"{r['frames_per_s']:.0f}",
                         _ms(r["step_s"]), f"{100 * r['data_wait_fraction']:.0f}%", _ms(bd["loader_s"]),
                         _ms(bd["step_s"]), _ms(bd["model_s"]) if "model_s" in bd else "—",
                         _ms(bd["loss_s"]) if "loss_s" in bd else "—", f"{bd['comm_bytes_per_step']:.0f}",
                         f"{r['compile_s']:.0f}", *(f"{v:.2f}" for v in r["heldout_mpjpe_cm"].values())])
        lines += _table(["config", "jacobian", "loader", "dtype", "frames/s", "ms/step", "data wait",
                         "loader ms alone", "step ms alone", "model ms", "loss ms", "comm B/step",
                         "compile s", *(f"MPJPE {s}" for s in splits)], rows)
        lines += ["", "ms/step and data wait: end-to-end training (the trainer's own clock). Alone: the "
                  "input iterator by itself (ms/batch), the compiled step by itself on a fixed batch, and "
                  "the model's and the loss's forward + backward each jitted alone. comm: bytes each device "
                  "sends in the step's collectives. MPJPE (cm) from clean and noised input."]
        for name, r in tr["rows"].items():
            bd = r["breakdown"]
            lines.append(f"- {name}: loader alone {_ms(bd['loader_s'])} + step alone {_ms(bd['step_s'])} = "
                         f"{_ms(bd['loader_s'] + bd['step_s'])} ms vs {_ms(r['step_s'])} ms/step end to end "
                         f"({100 * r['data_wait_fraction']:.0f}% of it waiting for data).")
    return lines


def _dynamics_section(dy: dict) -> list:
    """Section (c): the dynamics grid."""
    lines = []
    if "skipped" in dy:
        lines += ["", f"## (c) Dynamics loss across J: skipped ({dy['skipped']})"]
    elif "results" in dy:
        t = dy["results"]["targets"]
        joints = ", ".join(str(j) for j in t.get("joints", []))
        lines += ["", f"## (c) Dynamics loss + gradient across J and frames per batch (windows of "
                  f"{dy['results']['window']} frames; benchmarks/bench_dynamics.py)", "",
                  f"Targets (float32, J = {joints}): jvp ÷ blocked ≥ 1.5× at 1,024 and 4,096 frames, min "
                  f"{_num(t['jvp_over_blocked_min_at_1024_4096'])}×; ≥ 1× at 256, min "
                  f"{_num(t['jvp_over_blocked_min_at_256'])}×; dense ÷ blocked ≥ 50× at J = 24, 4,096 "
                  f"frames: {_num(t['dense_over_blocked_J24_4096'], '.1f')}× — met: {_yes(t['met'])}"
                  f"{'' if len(t.get('measured', [0, 0, 0])) == 3 else ' (of those measured)'}."]
        lines += dy["markdown"]
    return lines


def _mfu_section(mf: dict) -> list:
    """Section (e): MFU."""
    lines = []
    if "mfu" in mf:
        lines += ["", "## (e) MFU: the jitted step alone on a fixed batch", ""]
        lines += _table(["config", "activations", "GFLOP/step (XLA)", "step ms", "GFLOP/s", "MFU"],
                        [[name, r["model_dtype"], f"{r['flops_per_step'] / 1e9:.2f}", _ms(r["step_s"]),
                          f"{r['achieved_flops'] / 1e9:.1f}", f"{100 * r['mfu']:.1f}%"]
                         for name, r in mf["rows"].items()])
        peaks = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in mf["peak_flops"].items())
        lines += ["", f"Peak: a large matmul in this run, {peaks} GFLOP/s. The baseline's FLOPs include the "
                  "dense Jacobian's, work the blocked form does not do."]
    return lines


def _growth_section(gr: dict) -> list:
    """Section (f): cost growth with T and J."""
    lines = []
    if "fit_T" in gr:
        lines += ["", f"## (f) Cost growth of the optimized step (batch {gr['batch']})", ""]
        lines += _table([f"T (B = {gr['batch']})", *gr["by_T"]],
                        [["step ms", *(_ms(v) for v in gr["by_T"].values())]])
        if fixed := gr.get("by_T_at_1024_frames"):
            lines += [""] + _table(["T (B·T = 1024 frames)", *fixed],
                                   [["step ms", *(_ms(v) for v in fixed.values())]])
        fits = (f"Log-log least squares: T^{gr['fit_T']['exponent']:.2f} (r² {gr['fit_T']['r2']:.3f}), "
                f"T^{gr['fit_T_tail']['exponent']:.2f} without the smallest T")
        if "fit_J" in gr:
            lines += [""] + _table(["J", *gr["by_J"]], [["step ms", *(_ms(v) for v in gr["by_J"].values())]])
            fits += f"; J^{gr['fit_J']['exponent']:.2f} (r² {gr['fit_J']['r2']:.3f}), random trees"
        lines += ["", fits + "."]
    return lines


def _plain_ticks(ax, x):
    """Log-axis ticks at the measured sizes, written plainly (no 3×10¹ minor labels)."""
    from matplotlib.ticker import NullFormatter
    ax.set_xticks(list(x), [f"{v:g}" for v in x])
    ax.xaxis.set_minor_formatter(NullFormatter())


def plots(results: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    gr = results["parts"].get("growth", {})
    if "fit_T" in gr:
        panels = [("by_T", gr["fit_T_tail"], "window length T (frames)")]
        if "fit_J" in gr:
            panels.append(("by_J", gr["fit_J"], "joints J (random trees)"))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
        for ax, (key, fit, label) in zip(axes[0], panels, strict=True):
            x, y = np.array(list(gr[key]), float), 1e3 * np.array(list(gr[key].values()))
            ax.loglog(x, y, "o-", label="measured")
            ax.loglog(x, 1e3 * fit["coefficient"] * x ** fit["exponent"], "--",
                      label=f"fit ∝ x^{fit['exponent']:.2f}")
            _plain_ticks(ax, x)
            ax.set_xlabel(label)
            ax.set_ylabel("step time (ms)")
            ax.legend()
            ax.grid(True, which="both", alpha=0.3)
        fig.suptitle("Cost growth of the optimized train step")
        fig.tight_layout()
        fig.savefig(out / "growth.png", dpi=120)
        plt.close(fig)
        written.append("growth.png")
    if "results" in results["parts"].get("dynamics", {}):
        written.append("dynamics.png")  # part c drew it (benchmarks/bench_dynamics.py)
    bars = {}
    for name, r in results["parts"].get("train", {}).get("rows", {}).items():
        bars[f"motionjax\n{name}"] = r["frames_per_s"]
    if bars:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.bar(list(bars), list(bars.values()), color=["C0", "C1", "C2", "C3"][:len(bars)])
        ax.set_yscale("log"), ax.set_ylabel("training frames/s (end to end)")
        for i, v in enumerate(bars.values()):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
        written.append("throughput.png")
    return written
