"""motionjax.malloc: a large buffer allocated and freed again and again, as XLA:CPU does with a step's
temporary buffer from its worker threads, is faulted in once instead of on every allocation."""
import ctypes.util
import json
import os
import platform
import subprocess
import sys

import pytest

# In a fresh interpreter (glibc fixes its arenas when a second thread first allocates): a thread
# mallocs 96 MB, touches every page and frees it, 6 times; minor page faults counted after the first.
_PROBE = """
import ctypes, ctypes.util, json, resource, threading
from motionjax import malloc
tuned = malloc.keep_freed_memory()
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
print(json.dumps({"tuned": tuned, "faults": faults, "pages": size // resource.getpagesize()}))
"""


def _probe(malloc_env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True,
                         env=dict(os.environ, MOTIONJAX_MALLOC=malloc_env)).stdout
    return json.loads(out)


@pytest.mark.skipif(platform.system() != "Linux" or "libc.so" not in str(ctypes.util.find_library("c")),
                    reason="glibc's mallopt")
def test_a_reused_large_buffer_is_faulted_in_once():
    system, tuned = _probe("system"), _probe("")
    assert not system["tuned"] and tuned["tuned"]
    # As glibc is left: every allocation is a fresh mmap, every page faults again.
    assert min(system["faults"][1:]) > 0.5 * system["pages"], system
    # Tuned: the heap keeps the freed buffer, the later allocations reuse its pages.
    assert max(tuned["faults"][1:]) < 0.01 * tuned["pages"], tuned
