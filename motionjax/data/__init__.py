"""The input pipeline: motion files -> ArrayRecord shards -> Grain -> batches on the mesh.

Modules: ``corpus`` (units, root folding, performers, labels, split rules), ``dedup`` (exact and
near-duplicate clips), ``prepare`` (files -> shards + index + stats), ``info`` (the index's schema:
``DatasetInfo``, ``load_info``), ``synthetic`` (procedural corpus of any
size), ``transforms`` (numpy window transforms and their model-side inverse), ``pipeline`` (the
Grain graph, device prefetch, eval batches, the naive baseline loader), ``records``.
"""
from motionjax.data.info import DatasetInfo, load_info
from motionjax.data.prepare import DEEPMIMIC_SPLITS, Settings

__all__ = ["DEEPMIMIC_SPLITS", "DatasetInfo", "Settings", "load_info"]
