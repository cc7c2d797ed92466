"""simd_kernels.jit: a cached kernel loads in a fresh process without Numba's registries, and runs the same."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

from simd_kernels import _cache_guard, jit

KERNELS = textwrap.dedent("""
    import numpy as np
    from numba import prange
    from simd_kernels.jit import njit

    @njit(cache=True, nogil=True)
    def halves(n):  # allocates through the NRT
        out = np.empty(n, np.float32)
        for i in range(n):
            out[i] = i * 0.5
        return out

    @njit(cache=True, nogil=True, parallel=True)
    def total(x):  # a parallel reduction: the threading layer's symbols
        s = 0.0
        for i in prange(x.shape[0]):
            s += x[i]
        return s
""")

RUN = textwrap.dedent("""
    import json, sys
    from simd_kernels import warm
    warm.init_target()  # what a daemon runs at start and the loader before a model: no registries either
    import kernels
    from numba.core.runtime import rtsys
    x = kernels.halves(1000)
    seen = {
        "total": float(kernels.total(x)),
        "hits": sum(kernels.halves.stats.cache_hits.values()) + sum(kernels.total.stats.cache_hits.values()),
        "registries": "numba.np.arraymath" in sys.modules,
        "nrt_compiled": rtsys._init,  # the NRT's own library: each kernel carries a copy
        "bitcode_unparsed": kernels.halves.overloads[kernels.halves.signatures[0]].library._bitcode is not None,
    }

    from numba import njit

    @njit
    def twice(n):  # compiled here, after the loads: links halves' module and asks the engine for symbols
        return kernels.halves(n).sum() * 2

    seen["linked"] = float(twice(10))
    print(json.dumps(seen))
""")


def _run(tmp_path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", RUN], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_fresh_process_loads_cached_kernels_without_the_registries(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    compiled = _run(tmp_path)  # cache miss: Numba's pipeline loads the registries, the NRT, and compiles
    assert compiled == {"total": 249750.0, "hits": 0, "registries": True, "nrt_compiled": True,
                        "bitcode_unparsed": False, "linked": 45.0}
    loaded = _run(tmp_path)  # both kernels from the cache, with neither the registries nor the NRT's library
    assert loaded == {"total": 249750.0, "hits": 2, "registries": False, "nrt_compiled": False,
                      "bitcode_unparsed": True, "linked": 45.0}


def test_every_cached_kernel_of_the_package_gets_the_lean_cache():
    cached = []
    for name in _cache_guard.MODULES:
        module = importlib.import_module(f"simd_kernels.{name}")
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and type(value._cache) is not NullCache:
                assert type(value._cache) is jit.LeanCache, value
                cached.append(value)
    assert len(cached) >= 40
    assert type(jit.njit(lambda x: x)._cache) is NullCache  # without cache=True: numba.njit unchanged
