"""JAX's persistent compilation cache for training runs (``config.train.compile_cache``).

On 2 CPU cores a run spends ~25 s compiling its train step before the first step; a second run of
the same config (a resume, a rerun, the next seed of a benchmark) loads the compiled programs from
disk instead. Cache entries are keyed by the program, the jax/jaxlib version, the XLA flags and the
devices, so a stale entry is never used; the cache is trusted code (do not point it at a directory
others can write). It grows without bound (a train step's entry is a few MB): jax evicts only
with ``jax_compilation_cache_max_size``, which needs the ``filelock`` package; delete the directory
to reclaim the space.
"""
from __future__ import annotations

import os

import jax


def configure(path: str | None) -> str | None:
    """Turn the persistent compilation cache on at ``path`` (``~`` expanded, created if missing);
    ``""``/None leaves jax as it is. A cache the process has already (``JAX_COMPILATION_CACHE_DIR``,
    as the test suite sets, or ``jax_compilation_cache_dir`` set by the caller, as the benchmark's
    per-run cache) wins over ``path``. Returns the directory in use, or None."""
    current = jax.config.jax_compilation_cache_dir
    if current or not path:
        return current or None
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    return path
