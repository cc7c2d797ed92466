"""Keep freed activation memory in the process's heap instead of handing it back to the kernel after every op.

A forward allocates its buffers per op (np.empty: linears' outputs, attention's, the prompt kernels' shares), a few
MiB each at prompt sizes. glibc serves such blocks by mmap, or from the top of the heap, which it trims as soon as
128 KiB-32 MiB lie free there (its thresholds adapt as blocks come and go): each next op then faults its pages in
again and the kernel zeroes them: a prompt piece pays those faults in every op (docs/measurements.md has the
counts and times). llama.cpp allocates its compute buffers once, up front.

`retain_freed_memory()` fixes glibc's thresholds (mallopt): blocks under MMAP_THRESHOLD come from the heap, and
the heap is trimmed only past TRIM_THRESHOLD free at its top. The cost is that freed activation memory stays
resident until reused (peak RSS does not change: it is the same blocks at the same time), and that a model's own
arrays under MMAP_THRESHOLD (KV blocks, buffers) live in the heap too, where freeing them returns nothing by itself:
`release_freed_memory()` (malloc_trim) hands every free page back, which the daemon does once a model is unloaded.
Both are no-ops elsewhere than glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc documents on 64-bit (its adaptive threshold's cap)
TRIM_THRESHOLD = 128 << 20

_lock = threading.Lock()
_done: bool | None = None  # None: not tried; True: set; False: not glibc


def retain_freed_memory() -> bool:
    """Set glibc's thresholds once per process; whether they are set (False where the C library is not glibc)."""
    global _done
    with _lock:
        if _done is None:
            _done = _mallopt()
        return _done


def release_freed_memory() -> None:
    """Hand the free pages of every heap back to the kernel (malloc_trim(0): whole free pages anywhere in an arena,
    not only at its top), after a model's arrays were dropped; a no-op before retain_freed_memory() or off glibc."""
    if _done:
        _glibc().malloc_trim(ctypes.c_size_t(0))


@functools.cache
def _glibc():
    """The C library if it is glibc (musl's mallopt is a stub), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def _mallopt() -> bool:
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
