"""Thread count per kernel call: small calls run on the calling thread alone.

Waking Numba's OpenMP workers costs microseconds on an idle machine, and a scheduler time slice
while other processes keep the cores busy; so a call whose work is below PARALLEL_MIN_BYTES (tens of
microseconds of single-thread work) runs its parallel loops on one thread. Numba's thread count is per
calling thread and switching it is not free, so the last value set is remembered per thread and only
changed when a call needs the other one. The figures: docs/measurements.md.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numba

# Work (weight bytes x tokens, or bytes written) below which one thread runs a call. Read at each call:
# a process that shares its cores with other busy processes should raise it.
PARALLEL_MIN_BYTES = 32 << 10

_set = threading.local()


def use_threads_for(work_bytes: int) -> None:
    """Set this thread's Numba thread count for a kernel call of work_bytes (at most its cap, `capped`)."""
    want = 1 if work_bytes < PARALLEL_MIN_BYTES else min(numba.config.NUMBA_NUM_THREADS, cap())
    if getattr(_set, "threads", None) != want:
        numba.set_num_threads(want)
        _set.threads = want


def cap() -> int:
    """The most threads this thread's calls may use (`capped`; else all of Numba's)."""
    return getattr(_set, "cap", None) or numba.config.NUMBA_NUM_THREADS


@contextlib.contextmanager
def capped(n: int):
    """Within: this thread's kernel calls and team runs use at most n threads (0: no cap), Ollama's num_thread.
    A call's numbers do not change with it: a parallel loop's rows, and a team's parts, compute the same way on
    however many threads run them."""
    before = getattr(_set, "cap", None)
    _set.cap = n if n > 0 else None
    try:
        yield
    finally:
        _set.cap = before


def force(threads: int) -> None:
    """Set this thread's Numba thread count directly (benchmarks); later calls re-pick as usual."""
    numba.set_num_threads(threads)
    _set.threads = threads


_BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_blas_lock = threading.Lock()
_blas_single: bool | None = None  # None: not tried yet


def blas_single_thread() -> bool:
    """Make NumPy's OpenBLAS run each call on its calling thread; False where no OpenBLAS is found.

    Prefill runs its BLAS calls from a `Team` of threads instead: OpenBLAS's own workers spin-wait
    after every call, and alternating them with Numba's OpenMP workers on the same cores starved both
    (a prompt's gate/up/GELU ran much slower than the same work split by hand: docs/measurements.md).
    """
    global _blas_single
    with _blas_lock:
        if _blas_single is None:
            _blas_single = _set_blas_threads(1)
        return _blas_single


def _set_blas_threads(n: int) -> bool:
    """Set every loaded OpenBLAS (NumPy's, and SciPy's that Numba imports) to n threads; True if any was."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:  # Linux; elsewhere BLAS keeps its own threads and the team has one member
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return False
    done = False
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, name) for name in _BLAS_SETTERS if hasattr(lib, name)), None)
        if setter is not None:
            setter(ctypes.c_int(n))
            done = True
    return done


def _one_thread() -> None:
    force(1)


class Team:
    """The calling thread plus n - 1 pool threads; each member runs Numba kernels and BLAS single-threaded."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._pool = (
            ThreadPoolExecutor(n - 1, thread_name_prefix="simd-team", initializer=_one_thread) if n > 1 else None
        )

    def run(self, part) -> None:
        """part(i) for i in range(n), member i on its own thread (0 on the caller); re-raises a member's error.
        Under a cap of c < n threads (`capped`), c members run the n parts, member j parts j, j + c, ..."""
        c = min(self.n, cap())

        def parts(j: int) -> None:
            for i in range(j, self.n, c):
                part(i)

        futures = [self._pool.submit(parts, j) for j in range(1, c)] if self._pool is not None else []
        use_threads_for(0)
        try:
            parts(0)
        finally:
            for f in futures:
                f.result()


_team: Team | None = None


def team() -> Team:
    """The process's prefill team: all Numba threads when NumPy's BLAS can be made single-threaded, else one."""
    global _team
    with _blas_lock:
        if _team is not None:
            return _team
    n = numba.config.NUMBA_NUM_THREADS if blas_single_thread() else 1
    with _blas_lock:
        if _team is None:
            _team = Team(n)
        return _team
