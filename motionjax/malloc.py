"""Keep the host allocator from handing each step's scratch memory back to the kernel.

XLA:CPU allocates an executable's temporary buffer (~94 MB for the headline autoencoder's step) with
``malloc`` on every execution and frees it at the end. glibc serves a request that large with its own
``mmap`` (above its 32 MB ceiling on the mmap threshold) and unmaps it at ``free``, so every step
touches ~24,000 fresh pages: 25,000 minor page faults a step, 7-15% of the run's CPU time in the kernel
(docs/time_to_target.md, "Page faults"). With one arena, no ``mmap`` and a high trim threshold the
buffer is carved from the heap once and reused.

Call :func:`keep_freed_memory` first thing in a process, before numpy or jax start threads: glibc fixes
the number of arenas when a second thread first allocates. ``MOTIONJAX_MALLOC=system`` leaves the
allocator alone (for comparison); elsewhere than glibc it does nothing.
"""
import ctypes
import ctypes.util
import os

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """One arena, no mmap'd chunks, trim only above 2 GiB; True if glibc took all three."""
    if os.environ.get("MOTIONJAX_MALLOC", "") == "system":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # ARENA_MAX=1: XLA's worker threads would otherwise each take an arena, where large requests
    # always go to mmap; in the main arena MMAP_MAX=0 makes them come from the heap instead.
    return all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                               (_M_TRIM_THRESHOLD, 2**31 - 1)))
