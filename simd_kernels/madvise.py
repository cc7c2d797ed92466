"""libc's madvise on raw addresses (mmap.mmap.madvise takes only a mapping Python made itself)."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc_madvise():
    """The C library's madvise(addr, length, advice) -> int (errno kept for ctypes.get_errno), or None where there
    is none: no C library to open (OSError), no madvise in it (AttributeError), or Windows, where ctypes.CDLL(None)
    raises TypeError. The answer is remembered (functools.cache), so the lookup is tried once per process and every
    caller's madvise is a no-op there."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, TypeError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn
