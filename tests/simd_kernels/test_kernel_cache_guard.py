"""simd_kernels._cache_guard hashes every source a cached kernel may be compiled from."""

from __future__ import annotations

import re
from pathlib import Path

from simd_kernels import _cache_guard

PACKAGE = Path(_cache_guard.__file__).parent


def test_every_module_with_kernels_or_intrinsics_is_hashed():
    # A kernel inlines @njit helpers and @intrinsic codegen from other modules (ops from vmath, attend from
    # vmath, ...): a source left out of the hash would leave stale machine code in the cache when it changes.
    compiled = {
        p.stem
        for p in PACKAGE.glob("*.py")
        if p.stem != "_cache_guard" and re.search(r"^@(njit|intrinsic)\b", p.read_text(), re.M)
    }
    assert compiled <= set(_cache_guard.MODULES), compiled - set(_cache_guard.MODULES)
    assert all((PACKAGE / f"{name}.py").is_file() for name in _cache_guard.MODULES)
