"""Numba's one-time start-up, done ahead of the first kernel call.

Loading a cached kernel needs Numba's CPU target context (LLVM's JIT, the helper and C math symbols), its runtime's C
symbols (simd_kernels.jit.runtime_symbols), its threading layer, and the modules its environment names
(numba.np.arrayobj); `init_target` does all of it, and a daemon can pay that at start, on a background
thread, instead of in its first request. Compiling needs more: Numba's pipeline first loads every typing
and lowering registry of the target, a large cost. Our kernels' cached loads skip that (simd_kernels.jit),
so a process pays it only on a cache miss. The figures: docs/measurements.md.
"""

from __future__ import annotations

import gc
import importlib.abc
import sys
import threading

_done = threading.Event()


class _NoBlasProbe(importlib.abc.MetaPathFinder):
    """Finds no scipy.linalg for numba.np.arraymath's import-time `_check_blas`, and defers everything else.

    Part of Numba's start-up is that probe: numba.np.arraymath imports scipy.linalg when the module loads, only
    to choose how np.correlate / np.convolve take inner products. Where SciPy is installed that import alone
    costs time and peak RSS (docs/measurements.md), and no kernel of ours uses either function. Any other import of
    scipy.linalg, Numba's own when it types np.dot included, works as before."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "scipy.linalg" and _in_blas_probe():
            raise ModuleNotFoundError("scipy.linalg is not offered to Numba's import-time BLAS probe", name=fullname)
        # None otherwise: the next finder on sys.meta_path decides


def _in_blas_probe() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_check_blas" and frame.f_globals.get("__name__") == "numba.np.arraymath":
            return True
        frame = frame.f_back
    return False


def refuse_blas_probe() -> None:
    """Install the finder once, first on sys.meta_path (harmless once Numba's registries are loaded)."""
    if not any(isinstance(f, _NoBlasProbe) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoBlasProbe())


def init_target() -> None:
    """What loading a cached kernel needs (simd_kernels.jit), done now: the CPU target context, the runtime's
    symbols, the threading layer, Numba's extension entry points, numba.np.arrayobj (idempotent; safe beside kernel
    loads on other threads). Then LLVM's pages, which all that touched, leave this process (simd_kernels.llvm_pages).

    Then `gc.freeze()`: the imports and start-up state (Numba's and LLVM's objects among them) live as long as the
    process, and every full pass of the cycle collector walked them all; one such pass fell inside the first request
    on a model (the loader's and the first forward's allocations trigger it). Frozen, they are left out of every later
    pass; a cycle among those objects would no longer be reclaimed, which start-up state never needs."""
    if _done.is_set():
        return
    from numba.core import entrypoints
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target
    from numba.np.ufunc.parallel import _launch_threads

    from . import llvm_pages
    from .jit import runtime_symbols

    with global_compiler_lock:  # what a dispatcher holds while it loads or compiles
        cpu_target.target_context  # noqa: B018 (made on first access: LLVM's JIT, the helper and C math symbols)
        runtime_symbols()
        _launch_threads()  # the threading layer, which a parallel kernel's library starts when it loads
    entrypoints.init_all()  # Numba extensions' entry points, which a dispatcher's first call looks up
    importlib.import_module("numba.np.arrayobj")  # what unpickling a cached kernel's environment imports first
    llvm_pages.release()  # what LLVM's start-up touched: a load or compile maps back the pages it needs
    gc.freeze()
    _done.set()


def init_target_in_background() -> threading.Thread:
    """init_target() on a daemon thread; returns it (join() to wait)."""
    thread = threading.Thread(target=init_target, name="numba-init", daemon=True)
    thread.start()
    return thread
