"""The host allocator, set up so that XLA:CPU's per-step scratch memory is not faulted in afresh.

XLA:CPU allocates an executable's temporary buffer (~94 MB for the headline autoencoder's step) with
``malloc`` on every execution, from its worker threads, and frees it at the end. glibc serves a request
that large with its own ``mmap`` (over its 32 MB ceiling on the mmap threshold; a worker thread's arena
cannot hold it at all) and unmaps it at ``free``, so every step touches ~24,000 fresh 4 KB pages:
25,000 minor page faults a step (docs/time_to_target.md, "Page faults"). ``MOTIONJAX_MALLOC`` picks:

- ``hugepages`` (the default): glibc as it is, its mmapped chunks advised for transparent huge pages
  (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``): the buffer is still mapped every step, but faults in
  2 MB at a time (48 faults for 96 MB, not 24,576) and every thread keeps its own arena. glibc reads
  tunables only when a process starts, so :func:`configure` re-executes the process once with it set.
  Where the kernel has transparent huge pages off it changes nothing.
- ``one_arena``: one arena, no mmapped chunks, no trimming: the buffer is carved from the heap once and
  reused (no faults at all), but every thread then allocates under one lock: the headline Muon step
  measured at 0.75x the steps/s of ``hugepages`` (1.33x slower).
- ``system``: the allocator as glibc leaves it.
"""
import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

MODES = ("hugepages", "one_arena", "system")
_HUGETLB = "glibc.malloc.hugetlb=1"
# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def mode() -> str:
    """``MOTIONJAX_MALLOC``, checked; ``hugepages`` when unset."""
    chosen = os.environ.get("MOTIONJAX_MALLOC") or "hugepages"
    if chosen not in MODES:
        raise ValueError(f"MOTIONJAX_MALLOC={chosen!r}: expected one of {', '.join(MODES)}")
    return chosen


def _mallopt():
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl): nothing to tune
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def _huge_pages_available() -> bool:
    try:  # "always [madvise] never": the bracketed word is in force
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def configure() -> str:
    """Set the allocator up as ``MOTIONJAX_MALLOC`` says; call it first thing in a script's process.

    ``hugepages`` re-executes the process (same interpreter, same arguments, same pid) once with the
    tunable added to ``GLIBC_TUNABLES``, unless it is there already, glibc is not the C library, the
    kernel has transparent huge pages off, or the program cannot be run again (an interactive
    interpreter, a program read from stdin). ``one_arena`` must run before numpy or jax start threads
    (glibc fixes a thread's arena at its first allocation). Returns what is in force.
    """
    chosen = mode()
    if chosen == "system" or _mallopt() is None:
        return "system"
    if chosen == "one_arena":
        return "one_arena" if keep_freed_memory() else "system"
    if _HUGETLB in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        return "hugepages"
    # Not from an interactive interpreter or a program read from stdin: it could not be run again.
    if not _huge_pages_available() or sys.argv[0] in ("", "-"):
        return "system"
    tunables = ":".join(filter(None, (os.environ.get("GLIBC_TUNABLES"), _HUGETLB)))
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, dict(os.environ, GLIBC_TUNABLES=tunables))


def keep_freed_memory() -> bool:
    """One arena, no mmapped chunks, trim only above 2 GiB (``one_arena``); True if glibc took all three.

    Called late (threads already running, as the benchmarks do) it only reaches threads started after.
    ``MOTIONJAX_MALLOC=system`` makes it do nothing.
    """
    mallopt = _mallopt()
    if mallopt is None or mode() == "system":
        return False
    # ARENA_MAX=1: XLA's worker threads would otherwise each take an arena, where large requests
    # always go to mmap; in the main arena MMAP_MAX=0 makes them come from the heap instead.
    return all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                               (_M_TRIM_THRESHOLD, 2**31 - 1)))
