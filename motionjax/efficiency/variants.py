"""Every efficiency variant of one trained run, measured alike: the table and Pareto plot of
``docs/efficiency.md`` (``benchmarks/efficiency_report.py``).

Per variant: test-split MPJPE (cm, root-relative, noisy input at ``evals.final.noise_level``: the
denoising task), parameter count, stored bytes (parameters, or the file for exports) and CPU latency
per window at batch 1 (median of many calls, all in this one process, so ratios are meaningful).
"""
from __future__ import annotations

import copy
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from motionjax.efficiency import export, finetune, prune, quantize, scorecard, trained


def _row(name, kind, mpjpe, params, nbytes, latency_s, **extra):
    return {"variant": name, "kind": kind, "test_mpjpe": mpjpe, "params": params, "bytes": nbytes,
            "latency_ms": 1e3 * latency_s, **extra}


class _Rows:
    """The report's rows as they are measured: each variant's test MPJPE, size and latency."""

    def __init__(self, run_, repeats: int, log):
        self.config, self.info = run_.config, run_.info
        self.test = scorecard.eval_batches(run_.config, run_.info, "test")
        self.x, self.repeats, self.log = scorecard.window(run_.window_shape), repeats, log
        self.rows, self.t_start = [], time.perf_counter()

    def add(self, row) -> None:
        self.rows.append(row)
        self.log(f"{row['variant']:34s} MPJPE {row['test_mpjpe']:6.3f} cm  {row['bytes'] / 1e6:7.3f} MB  "
                 f"{row['latency_ms']:7.3f} ms  [{time.perf_counter() - self.t_start:5.0f} s]")

    def mpjpe(self, predict) -> float:
        return scorecard.mpjpe(predict, self.config, self.info, self.test)

    def predictor(self, name, kind, predict, params, nbytes, **kw) -> None:
        """A row of any ``predict`` (a jitted model, an exported file, an onnxruntime session)."""
        self.add(_row(name, kind, self.mpjpe(predict), params, nbytes,
                      scorecard.latency(predict, self.x, self.repeats), **kw))

    def model(self, name, kind, model, **kw) -> None:
        self.predictor(name, kind, scorecard.jit_predict(model), scorecard.param_count(model),
                       scorecard.param_bytes(model), **kw)


def run(workdir, out_dir, *, prune_steps: int = 100, sparsities=(0.5, 0.7, 0.9), distill_steps: int = 300,
        seeds=(0, 1, 2), student=None, alpha: float = 0.5, eval_every: int = 50, repeats: int = 200,
        log=print) -> dict:
    """All variants of run ``workdir``; writes ``efficiency.json`` and ``efficiency_pareto.png`` to
    ``out_dir`` and returns the JSON's content."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_ = trained.load(workdir)
    config, info, teacher = run_.config, run_.info, run_.model
    rows, extra = _Rows(run_, repeats, log), {}
    rows.model("fp32 (JAX jit)", "fp32", teacher)
    _exports(rows, teacher, run_.window_shape)
    rows.model("int8 weights (qwix PTQ)", "int8", quantize.quantize(teacher, rows.x))
    rows.model("int8 weights+activations (qwix)", "int8",
               quantize.quantize(teacher, rows.x, activations=True))
    if prune_steps:
        extra["sparsity_curve"] = _pruning(rows, teacher, prune_steps, sparsities, run_.window_shape)
    if distill_steps:  # a >= 4x smaller student, teacher targets vs data only, same steps and seeds
        validation = scorecard.eval_batches(config, info, "validation")
        extra["distillation"] = distill(config, info, teacher, validation, rows.test, distill_steps, seeds,
                                        student or {}, alpha, eval_every, log)
        d = extra["distillation"]
        for kind in ("distilled", "data_only"):
            best = min(d["runs"][kind], key=lambda r: r["test_mpjpe"])  # the latency/size are the same
            model = d.pop(f"_{kind}_model")
            rows.add(_row(f"student {kind.replace('_', '-')} (mean of {len(seeds)} seeds)", "distillation",
                          float(np.mean([r["test_mpjpe"] for r in d["runs"][kind]])),
                          scorecard.param_count(model), scorecard.param_bytes(model),
                          scorecard.latency(scorecard.jit_predict(model), rows.x, repeats),
                          best_seed_mpjpe=best["test_mpjpe"]))
    result = {"workdir": str(workdir), "step": run_.step, "model": config.model.to_dict(),
              "metric": f"test MPJPE (cm), noisy input level {config.evals.final.noise_level}",
              "rows": rows.rows, **extra, "wall_s": time.perf_counter() - rows.t_start}
    (out_dir / "efficiency.json").write_text(json.dumps(result, indent=2, default=float))
    plot(rows.rows, out_dir / "efficiency_pareto.png")
    (out_dir / "efficiency_table.md").write_text(markdown(result))
    return result


def _exports(rows: _Rows, teacher, window_shape) -> None:
    """fp32 exported to StableHLO and ONNX, and ONNX's dynamic int8, each loaded back and measured."""
    n = scorecard.param_count(teacher)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export.to_stablehlo(teacher, window_shape, tmp / "m.stablehlo")
        rows.predictor("fp32 StableHLO (jax.export)", "export", export.load_stablehlo(tmp / "m.stablehlo"), n,
                       (tmp / "m.stablehlo").stat().st_size)
        try:
            export.to_onnx(teacher, window_shape, tmp / "m.onnx")
            export.quantize_onnx_int8(tmp / "m.onnx", tmp / "m8.onnx")
        except ImportError as e:
            rows.log(f"ONNX rows skipped: {e}")
            return
        for name, f in (("fp32 ONNX (onnxruntime)", "m.onnx"),
                        ("int8 ONNX (onnxruntime dynamic)", "m8.onnx")):
            rows.predictor(name, "export", export.onnx_predict(tmp / f), n, (tmp / f).stat().st_size)


def _pruning(rows: _Rows, teacher, steps: int, sparsities, window_shape) -> list:
    """Magnitude pruning at each sparsity (and 0: the fine-tuning control) fine-tuned with the mask, and
    for transformers half the MLP channels removed; returns the sparsity curve (before / after)."""
    config, info, test = rows.config, rows.info, rows.test
    # Fine-tuning a trained model: a tenth of its peak learning rate (the full rate's first adamw
    # steps move every weight by ~lr and undo the training).
    tune_lr = 0.1 * config.train.learning_rate
    loop = finetune.Loop(config, info, teacher, steps, learning_rate=tune_lr)
    params = jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param))
    curve = []
    for s in (0.0, *sparsities):
        mask = prune.magnitude_mask(params, s)
        before = rows.mpjpe(scorecard.jit_predict(loop.model(jax.tree.map(lambda p, m: p * m, params, mask))))
        tuned, _ = loop.run(teacher, seed=config.seed, mask=mask)
        name = f"pruned {int(100 * s)}% + {steps} steps" if s else f"fp32 + {steps} steps (control)"
        rows.model(name, "unstructured" if s else "control", tuned,
                   sparsity=prune.sparsity_of(nnx.state(tuned, nnx.Param)), mpjpe_before_finetune=before)
        curve.append({"sparsity": s, "before": before, "after": rows.rows[-1]["test_mpjpe"]})
    if config.model.name == "transformer" and config.model.mlp_ratio % 2 == 0:
        small, small_cfg = prune.prune_mlp_channels(teacher, config.model, window_shape[-1],
                                                    config.data.chunk, 0.5, info=info)
        before = scorecard.mpjpe(scorecard.jit_predict(small), config, info, test)
        cfg = copy.deepcopy(config)
        with cfg.unlocked():
            cfg.model = small_cfg
        tuned, _ = finetune.Loop(cfg, info, small, steps, learning_rate=tune_lr).run(small, seed=config.seed)
        rows.model(f"50% MLP channels removed + {steps} steps", "structured", tuned,
                   mpjpe_before_finetune=before)
    return curve


STUDENT_RATIO = 4.4  # a tconv student's width: the widest multiple of 8 with this many times fewer parameters


def default_student(config, info, teacher) -> dict:
    """The student's ``model`` overrides: a transformer halves its width and narrows its MLP (4.6x fewer
    parameters than #16's teacher); a tconv model keeps its latent (the rate of an autoencoder) and
    takes the widest stream (a multiple of 8) with :data:`STUDENT_RATIO` times fewer parameters."""
    if config.model.name != "tconv":
        return dict(dim=64, heads=2, mlp_ratio=1, latent_dim=32)
    n = scorecard.param_count(teacher)
    for dim in range(config.model.dim - 8, 0, -8):
        cfg = copy.deepcopy(config)
        with cfg.unlocked():
            cfg.model.dim = dim
        if n / scorecard.param_count(trained.build_model(cfg, info)) >= STUDENT_RATIO:
            return {"dim": dim}
    raise ValueError(f"no tconv width is {STUDENT_RATIO}x smaller than {config.model.dim}")


def distill(config, info, teacher, validation, test, steps, seeds, student, alpha, eval_every, log) -> dict:
    """Student trained with teacher targets (``alpha``) vs from the data alone, per seed, both from the
    same start: a tconv teacher's width-pruned copy (:func:`prune.prune_width`; the seed then only
    changes the data order), else a fresh model of each seed."""
    s_cfg = copy.deepcopy(config)
    with s_cfg.unlocked():
        s_cfg.model.update(dict(student) or default_student(config, info, teacher))
    changed = {k for k in s_cfg.model if s_cfg.model[k] != config.model[k]}
    if config.model.name == "tconv" and changed <= {"dim"}:  # only narrower: start from the teacher
        start, _ = prune.prune_width(teacher, config.model, info.feature_dim, config.data.chunk,
                                     s_cfg.model.dim, info=info)
        init = "width-pruned teacher"
        make = lambda seed: start
    else:
        init = "fresh"
        make = lambda seed: trained.build_model(s_cfg, info, seed=seed)
    ratio = scorecard.param_count(teacher) / scorecard.param_count(make(0))
    log(f"student {dict(s_cfg.model)} from a {init}: {ratio:.1f}x fewer parameters than the teacher")
    # One program for both arms (alpha is an input): the data-only arm computes the teacher's output
    # and weighs it 0, so both pay the same per step and train seconds compare like steps.
    loop = finetune.Loop(s_cfg, info, make(0), steps, teacher=teacher)
    runs = {"distilled": [], "data_only": []}
    models_ = {}
    for seed in seeds:  # alternate the two arms seed by seed: machine load hits both alike
        for kind, a in (("distilled", alpha), ("data_only", 0.0)):
            model, history = loop.run(make(seed), seed=seed, alpha=a, eval_batches=validation,
                                             eval_every=eval_every)
            t = scorecard.mpjpe(scorecard.jit_predict(model), s_cfg, info, test)
            runs[kind].append({"seed": seed, "test_mpjpe": t, "history": history})
            models_[kind] = model
            log(f"  {kind:9s} seed {seed}: test {t:.3f} cm, validation {history[-1]['mpjpe']:.3f} cm, "
                f"{history[-1]['train_s']:.0f} s")
    # The same validation target for both: the data-only students' median final validation MPJPE.
    target = float(np.median([r["history"][-1]["mpjpe"] for r in runs["data_only"]]))
    for rs in runs.values():
        for r in rs:
            hit = next((h for h in r["history"] if h["mpjpe"] <= target), None)
            r["time_to_target_s"] = hit["train_s"] if hit else None
            r["steps_to_target"] = hit["step"] if hit else None
    return {"student": dict(s_cfg.model), "init": init, "param_ratio": ratio, "alpha": alpha, "steps": steps,
            "validation_target": target, "runs": runs,
            "_distilled_model": models_["distilled"], "_data_only_model": models_["data_only"]}


def markdown(result: dict) -> str:
    """The table (and the distillation and sparsity details) as Markdown."""
    fp32 = result["rows"][0]
    lines = ["| variant | test MPJPE (cm) | vs fp32 | params | stored bytes | size vs fp32 | ms/window |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        delta = 100 * (r["test_mpjpe"] / fp32["test_mpjpe"] - 1)
        lines.append(f"| {r['variant']} | {r['test_mpjpe']:.3f} | {delta:+.1f}% "
                     f"| {r['params']:,} | {r['bytes']:,} | {fp32['bytes'] / r['bytes']:.2f}x smaller "
                     f"| {r['latency_ms']:.3f} |")
    if "sparsity_curve" in result:
        lines += ["", "| sparsity (kernels) | test MPJPE before fine-tuning | after |", "|---:|---:|---:|"]
        lines += [f"| {100 * c['sparsity']:.0f}% | {c['before']:.3f} | {c['after']:.3f} |"
                  for c in result["sparsity_curve"]]
    if "distillation" in result:
        d = result["distillation"]
        lines += ["", f"Students ({d['param_ratio']:.1f}x fewer parameters, from a {d.get('init', 'fresh')} "
                  f"model), {d['steps']} steps, alpha {d['alpha']}; validation target "
                  f"{d['validation_target']:.3f} cm (the data-only median):",
                  "", "| arm | seed | test MPJPE (cm) | final validation (cm) | train s to target "
                  "| steps to target |",
                  "|---|---:|---:|---:|---:|---:|"]
        for kind, runs in d["runs"].items():
            for r in runs:
                t = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
                st = "never" if r["steps_to_target"] is None else str(r["steps_to_target"])
                lines.append(f"| {kind} | {r['seed']} | {r['test_mpjpe']:.3f} "
                             f"| {r['history'][-1]['mpjpe']:.3f} | {t} | {st} |")
    return "\n".join(lines) + "\n"


def plot(rows, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, label in ((axes[0], "latency_ms", "CPU latency per window, batch 1 (ms)"),
                           (axes[1], "bytes", "stored size (bytes)")):
        for i, r in enumerate(rows):
            ax.scatter(r[key], r["test_mpjpe"], color=f"C{i % 10}", marker="os^D"[i // 10 % 4],
                       label=r["variant"])
        pts = sorted((r[key], r["test_mpjpe"]) for r in rows)
        front, best = [], np.inf
        for p in pts:  # the Pareto front: no variant both smaller/faster and more accurate
            if p[1] < best:
                front.append(p)
                best = p[1]
        ax.step(*zip(*front, strict=True), where="post", color="k", alpha=0.4, lw=1)
        ax.set(xlabel=label, xscale="log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test MPJPE, noisy input (cm)")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
