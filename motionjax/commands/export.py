"""Export a trained run for inference: ``motionjax export --workdir runs/x [--out DIR] [--batch 1]``
(or ``python -m motionjax export``, the same).

Writes ``model.stablehlo`` (``jax.export``, any batch), ``model.onnx`` (jax2onnx, ``--batch``
windows per call) and ``model_int8.onnx`` (onnxruntime dynamic int8) into ``--out`` (default
``WORKDIR/export``), checks each against JAX on a test-split batch, and prints sizes, the largest
difference and the CPU latency per call; ``export.json`` holds the same.
"""
import json
from pathlib import Path

from absl import flags, logging

from motionjax.commands import run_absl

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory with checkpoints and config.json")
_STEP = flags.DEFINE_string("step", "best", "checkpoint step: an integer, 'best' or 'latest'")
_OUT = flags.DEFINE_string("out", None, "output directory (default WORKDIR/export)")
_BATCH = flags.DEFINE_integer("batch", 1, "windows per call of the ONNX files")
flags.mark_flag_as_required("workdir")


def _run(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    import numpy as np

    from motionjax.efficiency import export, scorecard, trained

    step = int(_STEP.value) if _STEP.value.isdigit() else _STEP.value
    run = trained.load(_WORKDIR.value, step)
    out = Path(_OUT.value or Path(_WORKDIR.value) / "export")
    out.mkdir(parents=True, exist_ok=True)
    shape, batch = run.window_shape, _BATCH.value
    x = scorecard.window(shape, batch)
    reference = scorecard.jit_predict(run.model)
    want = reference(x)
    export.to_stablehlo(run.model, shape, out / "model.stablehlo")
    export.to_onnx(run.model, shape, out / "model.onnx", batch=batch)
    export.quantize_onnx_int8(out / "model.onnx", out / "model_int8.onnx")
    rows = [{"format": "jax (jit)", "file": "", "predict": reference}]
    rows += [{"format": "stablehlo", "file": "model.stablehlo",
              "predict": export.load_stablehlo(out / "model.stablehlo")},
             {"format": "onnx fp32", "file": "model.onnx",
              "predict": export.onnx_predict(out / "model.onnx")},
             {"format": "onnx int8", "file": "model_int8.onnx",
              "predict": export.onnx_predict(out / "model_int8.onnx")}]
    print(f"{run.config.model.name} from {_WORKDIR.value} step {run.step}; window {shape}, batch {batch}")
    print(f"{'format':12s} {'file bytes':>11s} {'max |diff|':>11s} {'ms/call':>8s}")
    for r in rows:
        r["bytes"] = (out / r["file"]).stat().st_size if r["file"] else scorecard.param_bytes(run.model)
        r["max_abs_diff"] = float(np.abs(r["predict"](x) - want).max())
        r["ms_per_call"] = 1e3 * scorecard.latency(r.pop("predict"), x)
        print(f"{r['format']:12s} {r['bytes']:11d} {r['max_abs_diff']:11.2e} {r['ms_per_call']:8.3f}")
    (out / "export.json").write_text(json.dumps({"workdir": _WORKDIR.value, "step": run.step,
                                                 "batch": batch, "rows": rows}, indent=2))


def main(argv: list[str] | None = None) -> int:
    """``motionjax export [flags]``."""
    return run_absl(_run, argv)
