"""Efficiency tools that act on a trained model: one module per concept, above models/train.

- :mod:`.trained`: a run directory's model restored from its orbax checkpoint (mesh-free, eval mode).
- :mod:`.scorecard`: test-split MPJPE, parameter bytes, CPU latency per window.
- :mod:`.variants`: every variant of a trained run measured side by side (the efficiency report).
- :mod:`.export`: StableHLO (``jax.export``) and ONNX (``jax2onnx``) files, onnxruntime sessions.
- :mod:`.quantize`: post-training int8 quantization (qwix).
- :mod:`.prune`: magnitude and channel pruning with masked fine-tuning (optax).
- :mod:`.finetune`: the trainer's step run on a pruned model (masked) or a student (distilled).

The trainer imports none of these; commands and scripts (``motionjax export``, ``scripts/find_batch.py``,
``benchmarks/efficiency_report.py``) call them. (The batch finder, which sizes the trainer's own step,
is :mod:`motionjax.train.batch_finder`.)
"""
