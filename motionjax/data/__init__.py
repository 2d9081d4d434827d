"""The input pipeline: motion files -> ArrayRecord shards -> Grain -> batches on the mesh.

Modules: ``prepare`` (files -> shards + index + stats), ``synthetic`` (procedural corpus of any
size), ``transforms`` (numpy window transforms and their model-side inverse), ``pipeline`` (the
Grain graph, device prefetch, eval batches, the naive baseline loader), ``records``.
"""
from motionjax.data.prepare import HELDOUT_CLIPS, SPLITS, TRAIN_FRACTION, DatasetInfo, load_info

__all__ = ["HELDOUT_CLIPS", "SPLITS", "TRAIN_FRACTION", "DatasetInfo", "load_info"]
