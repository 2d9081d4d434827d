"""motionjax.malloc: a large buffer allocated and freed again and again, as XLA:CPU does with a step's
temporary buffer from its worker threads, is faulted in once (``one_arena``) or a huge page at a time
(``hugepages``, the default) instead of 4 KB at a time on every allocation."""
import ctypes.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

# In a fresh interpreter (glibc fixes its arenas when a second thread first allocates): a thread
# mallocs 96 MB, touches every page and frees it, 6 times; minor page faults counted after the first.
_PROBE = """
import ctypes, ctypes.util, json, resource, threading
from motionjax import malloc
tuned = malloc.configure()  # hugepages: re-executes this interpreter once
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size, faults = 96 << 20, []
def loop():
    for i in range(6):
        p = libc.malloc(size)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        ctypes.memset(p, i + 1, size)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        libc.free(p)
t = threading.Thread(target=loop); t.start(); t.join()
print(json.dumps({"tuned": tuned, "faults": faults, "pages": size // resource.getpagesize(),
                  "tunables": __import__("os").environ.get("GLIBC_TUNABLES")}))
"""


def _probe(malloc_env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True,
                         env={**{k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"},
                              "MOTIONJAX_MALLOC": malloc_env}).stdout
    return json.loads(out)


_GLIBC = platform.system() == "Linux" and "libc.so" in str(ctypes.util.find_library("c"))
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt")
def test_a_reused_large_buffer_is_faulted_in_once():
    system, tuned = _probe("system"), _probe("one_arena")
    assert system["tuned"] == "system" and tuned["tuned"] == "one_arena"
    # As glibc is left: every allocation is a fresh mmap, every page faults again.
    assert min(system["faults"][1:]) > 0.5 * system["pages"], system
    # One arena: the heap keeps the freed buffer, the later allocations reuse its pages.
    assert max(tuned["faults"][1:]) < 0.01 * tuned["pages"], tuned


@pytest.mark.skipif(not _GLIBC or not _THP.exists() or "[never]" in _THP.read_text(),
                    reason="glibc and transparent huge pages")
def test_the_default_maps_the_buffer_in_huge_pages():
    huge = _probe("")  # the default: the process re-executed itself with the tunable
    assert huge["tuned"] == "hugepages" and "glibc.malloc.hugetlb=1" in huge["tunables"].split(":"), huge
    # Still mapped afresh every time, but 2 MB a fault: 48 for 96 MB where 4 KB pages take 24,576.
    assert max(huge["faults"]) < 0.05 * huge["pages"], huge


def test_an_unknown_setting_is_an_error():
    out = subprocess.run([sys.executable, "-c", "from motionjax import malloc; malloc.configure()"],
                         capture_output=True, text=True, env=dict(os.environ, MOTIONJAX_MALLOC="arena"))
    assert out.returncode != 0 and "MOTIONJAX_MALLOC='arena': expected one of hugepages, one_arena, system" \
        in out.stderr
