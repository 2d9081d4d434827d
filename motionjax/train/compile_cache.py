"""JAX's persistent compilation cache for training runs (``config.train.compile_cache``).

On 2 CPU cores a run spends ~25 s compiling its train step before the first step; a second run of
the same config (a resume, a rerun, the next seed of a benchmark) loads the compiled programs from
disk instead. Cache entries are keyed by the program, the jax/jaxlib version, the XLA flags and the
devices, so a stale entry is never used; the cache is trusted code (do not point it at a directory
others can write). It grows without bound (a train step's entry is a few MB): jax evicts only
with ``jax_compilation_cache_max_size``, which needs the ``filelock`` package; delete the directory
to reclaim the space.

Several processes on CPUs (``scripts/launch_local.sh``, a CPU cluster job): jax writes entries from
process 0 only, but on CPUs an entry's key includes the devices' topology, which differs from process to
process, so processes 1..N-1 never found an entry and compiled every program on every launch (the
two-process runlocal run: 28 user CPU s in process 1 against 14 in process 0, with the cache warm).
:func:`configure` lets each CPU process write its own entries (distinct keys: no two processes write
one file); a resumed or resubmitted run then reads them in every process. GPUs and TPUs keep jax's rule
(their keys are one for all processes, written by process 0).
"""
from __future__ import annotations

import functools
import os
import warnings

import jax


def configure(path: str | None) -> str | None:
    """Turn the persistent compilation cache on at ``path`` (``~`` expanded, created if missing);
    ``""``/None leaves jax as it is. A cache the process has already (``JAX_COMPILATION_CACHE_DIR``,
    as the test suite sets, or ``jax_compilation_cache_dir`` set by the caller, as the benchmark's
    per-run cache) wins over ``path``. Returns the directory in use, or None."""
    _every_cpu_process_writes()
    current = jax.config.jax_compilation_cache_dir
    if current or not path:
        return current or None
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    return path


def _every_cpu_process_writes() -> bool:
    """Let a CPU process other than process 0 write its cache entries (module docstring), by wrapping
    jax's private ``compiler._cache_write`` (jax 0.11-0.12); where that is not there, jax as it is.
    Returns whether the wrapper is in place. Idempotent."""
    try:
        from jax._src import compilation_cache, compiler, distributed
    except ImportError:
        return False
    write = getattr(compiler, "_cache_write", None)
    if write is None or getattr(write, "every_cpu_process", False):
        return write is not None

    @functools.wraps(write)
    def every_cpu_process_writes(cache_key, compile_time_secs, module_name, backend, executable, *args,
                                 **kwargs):
        if not distributed.global_state.process_id or getattr(backend, "platform", None) != "cpu":
            return write(cache_key, compile_time_secs, module_name, backend, executable, *args, **kwargs)
        if compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
            return None
        try:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                      int(compile_time_secs))
        except Exception as e:  # noqa: BLE001 - as jax does: a failed write is a warning, not an error
            warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': "
                          f"{type(e).__name__}: {e}", stacklevel=2)
        return None

    every_cpu_process_writes.every_cpu_process = True
    compiler._cache_write = every_cpu_process_writes
    return True
