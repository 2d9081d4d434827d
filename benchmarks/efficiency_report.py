"""The efficiency table and Pareto plot of a trained run (docs/efficiency.md):
``benchmarks/efficiency_report.py --workdir runs/x [--out docs/efficiency]``.

Measures fp32, its StableHLO/ONNX exports, int8 (qwix; onnxruntime), magnitude pruning (sparsity
curve, masked fine-tuning), MLP channel pruning and a distilled vs data-only student (seeds), all in
one process; writes ``efficiency.json`` and ``efficiency_pareto.png`` to ``--out``.
"""


from absl import app, flags, logging

_WORKDIR = flags.DEFINE_string("workdir", None, "trained run directory (checkpoints, config.json)")
_OUT = flags.DEFINE_string("out", "runs/efficiency", "directory for efficiency.json and the plot")
_PRUNE_STEPS = flags.DEFINE_integer("prune_steps", 100, "fine-tuning steps per pruned model (0: skip)")
_SPARSITIES = flags.DEFINE_list("sparsities", ["0.5", "0.7", "0.9"], "unstructured sparsity levels")
_DISTILL_STEPS = flags.DEFINE_integer("distill_steps", 300, "student training steps (0: skip)")
_SEEDS = flags.DEFINE_integer("seeds", 3, "student seeds per arm")
_ALPHA = flags.DEFINE_float("alpha", 0.5, "weight of the teacher's outputs in the distilled loss")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 50, "student steps between validation evaluations")
flags.mark_flag_as_required("workdir")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    from motionjax.efficiency import variants

    r = variants.run(_WORKDIR.value, _OUT.value, prune_steps=_PRUNE_STEPS.value,
                   sparsities=[float(s) for s in _SPARSITIES.value], distill_steps=_DISTILL_STEPS.value,
                   seeds=tuple(range(_SEEDS.value)), alpha=_ALPHA.value, eval_every=_EVAL_EVERY.value)
    print(f"written to {_OUT.value} in {r['wall_s']:.0f} s")


if __name__ == "__main__":
    app.run(main)
