"""Drop this package's cached kernels when any of their sources changed.

Numba's on-disk cache checks only the timestamp of the file that defines a kernel, not of the files it
inlines from (ir.py's IR, actquant.py, half.py, ...): editing ir.py alone would leave stale
machine code in use. A hash of all kernel sources is kept beside the cache; on a mismatch the cached
kernels of these modules are deleted and recompile on first use.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from numba.core.caching import FunctionCache

# the @njit / @intrinsic sources, and ir (the LLVM IR their intrinsics generate)
MODULES = (
    "actquant",
    "attend",
    "attend_simd",
    "block32",
    "block32_prompt",
    "checks",
    "dequant",
    "floats",
    "half",
    "iquants",
    "ir",
    "kquants",
    "kquants_prompt",
    "kquants_rowdots",
    "ops",
    "paged",
    "prefill",
    "rows",
    "simd",
    "vmath",
)
_STAMP = "simd_kernels.sources.sha256"


def check(any_kernel) -> None:
    """any_kernel: one @njit(cache=True) dispatcher of this package (locates the cache directory)."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in MODULES:
        digest.update((here / f"{name}.py").read_bytes())
    stamp = digest.hexdigest()
    try:
        cache_dir = Path(FunctionCache(any_kernel.py_func)._cache_path)
        stamp_file = cache_dir / _STAMP
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            return
        for path in cache_dir.iterdir():
            if path.suffix in (".nbi", ".nbc") and path.name.split(".")[0] in MODULES:
                path.unlink(missing_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        stamp_file.write_text(stamp)
    except OSError:
        pass  # an unwritable cache directory means Numba cannot cache here either
