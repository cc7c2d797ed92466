"""Thread count per kernel call: small calls run on the calling thread alone.

Waking Numba's OpenMP workers costs microseconds on an idle machine, and a scheduler time slice
(measured 12-20 ms per call here) while other processes keep the cores busy; so a call whose work is
below PARALLEL_MIN_BYTES (about 25 us of single-thread work) runs its parallel loops on one thread.
Numba's thread count is per calling thread; switching it costs ~1.5 us, so the last value set is
remembered per thread and only changed when a call needs the other one.
"""
from __future__ import annotations

import threading

import numba

# Work (weight bytes x tokens, or bytes written) below which one thread runs a call. Read at each call:
# a process that shares its cores with other busy processes should raise it.
PARALLEL_MIN_BYTES = 256 << 10

_set = threading.local()


def use_threads_for(work_bytes: int) -> None:
    """Set this thread's Numba thread count for a kernel call of work_bytes."""
    want = 1 if work_bytes < PARALLEL_MIN_BYTES else numba.config.NUMBA_NUM_THREADS
    if getattr(_set, "threads", None) != want:
        numba.set_num_threads(want)
        _set.threads = want


def force(threads: int) -> None:
    """Set this thread's Numba thread count directly (benchmarks); later calls re-pick as usual."""
    numba.set_num_threads(threads)
    _set.threads = threads
