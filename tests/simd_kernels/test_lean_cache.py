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

from simd_kernels import _cache_guard, jit, llvm_pages

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
        "bitcode_unparsed": getattr(kernels.halves.overloads[kernels.halves.signatures[0]].library, "_bitcode",
                                    None) is not None,
    }

    from simd_kernels import llvm_pages

    def resident_kb(ranges):  # of these mappings, resident in this process
        kb, counted = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split()
            if not head[0].endswith(":"):
                counted = tuple(int(x, 16) for x in head[0].split("-")) in ranges
            elif head[0] == "Rss:" and counted:
                kb += int(head[1])
        return kb

    seen["llvm_kb"] = resident_kb(llvm_pages.clean_mappings())  # LLVM's code and read-only data, given back

    from numba import njit

    @njit
    def twice(n):  # compiled here, after the loads: links halves' module and asks the engine for symbols
        return kernels.halves(n).sum() * 2

    seen["linked"] = float(twice(10))
    print(json.dumps(seen))
""")


def _run(tmp_path, prelude: str = "") -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", prelude + RUN],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_fresh_process_loads_cached_kernels_without_the_registries(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    compiled = _run(tmp_path)  # cache miss: Numba's pipeline loads the registries, the NRT, and compiles
    assert compiled.pop("llvm_kb") > 0  # a compile runs LLVM after the last load gave its pages back
    assert compiled == {
        "total": 249750.0,
        "hits": 0,
        "registries": True,
        "nrt_compiled": True,
        "bitcode_unparsed": False,
        "linked": 45.0,
    }
    loaded = _run(tmp_path)  # both kernels from the cache, with neither the registries nor the NRT's library
    assert loaded == {
        "total": 249750.0,
        "hits": 2,
        "registries": False,
        "nrt_compiled": False,
        "bitcode_unparsed": True,
        "llvm_kb": 0,
        "linked": 45.0,
    }


def test_a_numba_without_the_internals_loads_the_cache_its_own_way(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    _run(tmp_path)
    unfit = "import simd_kernels.jit\nsimd_kernels.jit._FITS = False\n"  # as if an internal had gone
    loaded = _run(tmp_path, unfit)
    assert loaded.pop("llvm_kb") > 0
    assert loaded == {
        "total": 249750.0,
        "hits": 2,
        "registries": True,
        "nrt_compiled": True,
        "bitcode_unparsed": False,
        "linked": 45.0,
    }


SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 11 /site-packages/llvmlite/binding/libllvmlite.so
Rss:                 400 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
7f0000100000-7f0005000000 r-xp 00100000 fd:01 11 /site-packages/llvmlite/binding/libllvmlite.so
Rss:               35000 kB
Anonymous:             0 kB
7f0005000000-7f0005200000 r--p 05000000 fd:01 11 /site-packages/llvmlite/binding/libllvmlite.so
Rss:                1800 kB
Anonymous:          1800 kB
7f0005200000-7f0005210000 rw-p 05200000 fd:01 11 /site-packages/llvmlite/binding/libllvmlite.so
Anonymous:             0 kB
7f0006000000-7f0006100000 r-xp 00000000 fd:01 12 /usr/lib/libc.so.6
Anonymous:             0 kB
7f0007000000-7f0007100000 rw-p 00000000 00:00 0
Anonymous:           100 kB
"""


def test_only_llvms_clean_mappings_are_given_back(tmp_path):
    (tmp_path / "smaps").write_text(SMAPS)
    # headers and code, not the relocated read-only data (private pages), the writable data or another library
    assert llvm_pages.clean_mappings(str(tmp_path / "smaps")) == [
        (0x7F0000000000, 0x7F0000100000),
        (0x7F0000100000, 0x7F0005000000),
    ]
    # a kernel whose smaps does not count private pages: nothing can be shown clean, so nothing is given back
    (tmp_path / "smaps").write_text("".join(line + "\n" for line in SMAPS.splitlines() if "Anonymous" not in line))
    assert llvm_pages.clean_mappings(str(tmp_path / "smaps")) == []


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
