"""Efficiency tools that act on a trained model: one module per concept, above models/train.

- :mod:`.trained`: a run directory's model restored from its orbax checkpoint (mesh-free, eval mode).
- :mod:`.measure`: test-split MPJPE, parameter bytes, CPU latency per window.
- :mod:`.export`: StableHLO (``jax.export``) and ONNX (``jax2onnx``) files, onnxruntime sessions.
- :mod:`.batch_finder`: the largest per-device batch that fits memory (XLA's compiled memory
  analysis) and the throughput-optimal batch.
- :mod:`.quantize`: post-training int8 quantization (qwix).
- :mod:`.prune`: magnitude and channel pruning with masked fine-tuning (optax).
- :mod:`.distill`: a small student trained on a teacher's outputs.

The trainer imports none of these; thin scripts (``scripts/export.py``, ``scripts/find_batch.py``,
``scripts/efficiency_report.py``) call them.
"""
