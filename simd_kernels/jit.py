"""`njit`: numba.njit, except that a cached kernel loads without Numba's compiler start-up.

Numba's cache loader refreshes its CPU target before it reads a kernel from disk: it imports and installs every typing
and lowering registry (numba.np.linalg, arraymath, random, typed containers, jitclass, ...). In a fresh process that
took 0.11-0.15 s of a 0.24-0.35 s load-to-first-token here, and 11 MB of private memory. Loading machine code needs
none of it, since registries type and lower *source*. What the code needs is symbols:
- the NRT's (allocation, reference counts): `rtsys.initialize`, done here;
- the helper library's and C math's: registered when the target context is made;
- the threading layer's: a parallel kernel's library launches it when it is unserialized.

`njit(cache=True, ...)` gives its dispatcher a cache that loads that way. A cache miss compiles through Numba's own
pipeline, which refreshes the target first, as before. Without cache=True this is numba.njit unchanged.
"""
from __future__ import annotations

import numba
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher
from numba.core.runtime import rtsys


class LeanCache(FunctionCache):
    """FunctionCache whose load skips the target refresh (the NRT is initialized instead)."""

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)  # idempotent; the dispatcher holds the global compiler lock here
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


def lean(dispatcher: Dispatcher) -> Dispatcher:
    """Give a cache=True dispatcher the lean loader (in place); returns it (a plain function, under
    NUMBA_DISABLE_JIT, as it is)."""
    if isinstance(dispatcher, Dispatcher) and type(dispatcher._cache) is FunctionCache:  # what cache=True makes
        dispatcher._cache.__class__ = LeanCache
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
