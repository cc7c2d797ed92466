"""`njit`: numba.njit, except that a cached kernel loads without Numba's compiler start-up.

Numba's cache loader refreshes its CPU target before it reads a kernel from disk: it imports and installs every typing
and lowering registry (numba.np.linalg, arraymath, random, typed containers, jitclass, ...). In a fresh process that
was about half of load-to-first-token (docs/measurements.md), and private memory. Loading machine code needs
none of it, since registries type and lower *source*. What the code needs is symbols:
- the NRT's C entry points (allocation, meminfo): `runtime_symbols`, here. Not the NRT's own library (reference
  counts and atomics, which LLVM compiles anew in each process, touching much of LLVM's code): every
  kernel links a private copy of it (Numba's CPU target does, in `post_lowering`), so its object code defines those
  functions itself. A compile still initializes the NRT in full, in the refresh;
- the helper library's and C math's: registered when the target context is made;
- the threading layer's: a parallel kernel's library launches it when it is unserialized.

`njit(cache=True, ...)` gives its dispatcher a cache that loads that way. A cache miss compiles through Numba's own
pipeline, which refreshes the target first, as before. Without cache=True this is numba.njit unchanged.

A loaded kernel's library is a `LeanLibrary`: it keeps the LLVM bitcode that came with the object code unparsed until
something links against it (a compile that calls the kernel), instead of parsing it at load, and the JIT engine's
table of defined symbols takes its names at the first lookup. Parsing and walking those modules was most of the time
that loading a model's kernels took (docs/measurements.md).

Processes sharing a cache compile a kernel once: a top-level compile of a cache=True kernel holds an advisory lock
file beside its cache index (`OneCompile`), so a second process wanting the same kernel waits, then loads the first
one's result from disk instead of compiling it again (two test workers, or a daemon beside a command, did both
compile the same minute-long kernel at once).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numba
from llvmlite import binding as ll
from numba.core.caching import FunctionCache
from numba.core.codegen import JITCodeLibrary
from numba.core.dispatcher import Dispatcher
from numba.core.registry import CPUDispatcher
from numba.core.runtime import _nrt_python

from . import llvm_pages

_registered: list[bool] = []  # [True] once the NRT's C symbols are known to LLVM


def runtime_symbols() -> None:
    """Make the NRT's C entry points known to LLVM's symbol resolver, as `rtsys.initialize` does first, without
    compiling the NRT's library (idempotent; callers hold Numba's global compiler lock)."""
    if _registered:
        return
    for py_name, address in getattr(_nrt_python, "c_helpers", {}).items():
        ll.add_symbol(py_name if py_name.startswith("_") else "NRT_" + py_name, address)
    _registered.append(True)


class DeferredSymbols(set):
    """The JIT engine's set of defined symbol names, taking a loaded library's names at the first lookup (`in`),
    not at its load. Numba asks it when it compiles, or looks up a function of a library it compiled."""

    def __init__(self, names=()):
        super().__init__(names)
        self.pending: list[LeanLibrary] = []

    def __contains__(self, name) -> bool:
        while self.pending:
            module = self.pending.pop()._get_module_for_linking()
            self.update(
                gv.name for gvs in (module.functions, module.global_variables) for gv in gvs if not gv.is_declaration
            )
        return super().__contains__(name)


class LeanLibrary(JITCodeLibrary):
    """JITCodeLibrary whose cached form loads its object code at once and parses its bitcode when first linked
    against (the same module, later)."""

    _bitcode: bytes | None = None

    @classmethod
    def _unserialize(cls, codegen, state):
        name, kind, data = state
        if kind != "object":
            return super()._unserialize(codegen, state)
        object_code, bitcode = data
        self = codegen.create_library(name)
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._bitcode = bitcode
        self._finalize_final_module()  # the engine loads the object code (its object-cache hook hands it over)
        codegen._engine._defined_symbols.pending.append(self)
        return self

    def get_pointer_to_function(self, name):
        """The address of `name`, defined by code the engine loaded (0 if none). Numba first checks the engine's
        table of defined names, which would parse the bitcode; while it is unparsed, the engine is asked."""
        if self._bitcode is None:
            return super().get_pointer_to_function(name)
        self._ensure_finalized()
        return self._codegen._engine.get_function_address(name)

    def _get_module_for_linking(self):  # the module other libraries link in
        if self._bitcode is not None:
            self._shared_module, self._bitcode = ll.parse_bitcode(self._bitcode), None
        return super()._get_module_for_linking()


# The Numba internals the lean load relies on. Where a Numba lacks one, LeanCache loads as Numba's own FunctionCache
# does: slower, never broken.
_FITS = (
    hasattr(_nrt_python, "c_helpers")
    and hasattr(FunctionCache, "_load_overload")
    and all(
        hasattr(JITCodeLibrary, name)
        for name in (
            "_unserialize",
            "enable_object_caching",
            "_set_compiled_object",
            "_finalize_final_module",
            "_get_module_for_linking",
        )
    )
)


def _lean_codegen(codegen) -> bool:
    """Have `codegen` unserialize into LeanLibrary and its engine defer symbol names (once; libraries it creates
    otherwise behave as JITCodeLibrary). False where this Numba's codegen is not the one LeanLibrary knows."""
    if getattr(codegen, "_library_class", None) is LeanLibrary:
        return True
    engine = getattr(codegen, "_engine", None)
    if not (
        _FITS and codegen._library_class is JITCodeLibrary and type(getattr(engine, "_defined_symbols", None)) is set
    ):
        return False
    engine._defined_symbols = DeferredSymbols(engine._defined_symbols)
    codegen._library_class = LeanLibrary
    return True


class LeanCache(FunctionCache):
    """FunctionCache whose load skips the target refresh and the NRT's compile (its C symbols are registered
    instead), and unserializes into LeanLibrary; then LLVM's pages leave this process (simd_kernels.llvm_pages)."""

    def load_overload(self, sig, target_context):
        if not _lean_codegen(target_context.codegen()):  # the dispatcher holds the global compiler lock here
            return super().load_overload(sig, target_context)
        runtime_symbols()
        try:
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        finally:
            llvm_pages.release()  # LLVM's code, which the load ran, back out of this process


try:
    import fcntl
except ImportError:  # not a POSIX system: each process compiles on its own, as Numba does
    fcntl = None

_nesting = threading.local()  # .depth: compiles this thread is inside (a kernel's callees compile within it)


@contextmanager
def _compile_lock(cache):
    """An exclusive lock on `<cache index>.lock` in the kernel's cache directory, held while the body runs; nothing
    where the directory cannot be written (Numba then caches elsewhere or not at all) or there is no flock."""
    path = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    fd = None
    if fcntl is not None and path:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by close, or by the kernel if this process dies
        yield
    finally:
        if fd is not None:
            os.close(fd)


class OneCompile:
    """Mixed into a cache=True kernel's dispatcher class: a top-level compile (a cache load, or a compile and save)
    runs under the kernel's lock file, so it waits for another process compiling the same kernel and then loads its
    result. Only top-level: a callee compiled inside a caller's compile (under Numba's in-process compiler lock) takes
    no file lock, so no thread ever waits for a file lock while holding Numba's."""

    def compile(self, sig):
        if getattr(_nesting, "depth", 0):
            return super().compile(sig)
        _nesting.depth = 1
        try:
            with _compile_lock(self._cache):
                return super().compile(sig)
        finally:
            _nesting.depth = 0


class OneCompileDispatcher(OneCompile, CPUDispatcher):
    """numba.njit's CPU dispatcher with OneCompile (a module-level class, so a pickled kernel names it)."""


def lean(dispatcher: Dispatcher) -> Dispatcher:
    """Give a cache=True dispatcher the lean loader and the one-compile lock (in place); returns it (a plain
    function, under NUMBA_DISABLE_JIT, as it is)."""
    if isinstance(dispatcher, Dispatcher) and type(dispatcher._cache) is FunctionCache:  # what cache=True makes
        dispatcher._cache.__class__ = LeanCache
        if type(dispatcher) is CPUDispatcher:
            dispatcher.__class__ = OneCompileDispatcher
    return dispatcher


def njit(*args, **options):
    """numba.njit, with `lean` applied when cache=True: the same three call forms (bare, with options, with a
    function)."""
    made = numba.njit(*args, **options)
    if not options.get("cache"):
        return made
    if isinstance(made, Dispatcher):
        return lean(made)
    return lambda fn: lean(made(fn))
