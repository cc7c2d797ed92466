"""libc's madvise on raw addresses (mmap.mmap.madvise takes only a mapping Python made itself)."""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc_madvise():
    """The C library's madvise(addr, length, advice) -> int (errno kept for ctypes.get_errno), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn
