"""Numba's one-time start-up, done ahead of the first kernel call.

The first kernel a process runs, even one whose machine code sits in the on-disk cache, first makes Numba load
every typing and lowering registry of its CPU target (numba.np.arraymath imports scipy.linalg for BLAS, among
others): measured 0.2-0.6 s of CPU here, more than loading the cached kernels of a whole model. A daemon can
pay it at start, on a background thread, instead of in its first request.
"""
from __future__ import annotations

import threading

_done = threading.Event()


def init_target() -> None:
    """Load Numba's CPU target registries now (idempotent; safe beside kernel loads on other threads)."""
    if _done.is_set():
        return
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:  # what a dispatcher holds while it loads or compiles: no refresh runs twice at once
        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
    _done.set()


def init_target_in_background() -> threading.Thread:
    """init_target() on a daemon thread; returns it (join() to wait)."""
    thread = threading.Thread(target=init_target, name="numba-init", daemon=True)
    thread.start()
    return thread
