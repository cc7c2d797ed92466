"""The per-format kernels that simd.fused_kernel generates load from Numba's on-disk cache in a new process.

They are copies of one template with the format's quantizer and row dots bound as globals; bound as
closure cells instead, they would hash differently in every process and recompile each time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import simd_kernels as sk
from simd_kernels import block32, iquants, kquants
from _kernel_blocks import NAMES, SLOW_COMPILE  # with the slow tests (no built-in model holds them)

GENERATED = {t: k for t, k in sk.MUL.items() if k.py_func.__code__.co_filename.endswith("simd.py")}

# call every generated kernel once as matvec does, then report each one's compilations
_PROBE = """
import json, numpy as np, simd_kernels as sk
calls = {}
for t in TYPES:
    per, size = sk.BLOCKS[t]
    w = np.zeros((4, 2 * size * (256 // per)), np.uint8)  # (rows, 512 elements)
    sk.matvec(t, w, np.zeros(512, np.float32))
    calls[t] = len(sk.MUL[t].stats.cache_misses)
print(json.dumps(calls))
"""


def test_every_block_format_kernel_is_generated() -> None:
    assert sorted(GENERATED) == [2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 39]
    for kernel in GENERATED.values():
        assert kernel.__name__.startswith(("mul_q", "mul_iq", "mul_mxfp4")) and kernel.__doc__
    assert block32.mul_q8_0 is sk.MUL[8] and kquants.mul_q6_k is sk.MUL[14] and iquants.mul_iq4_xs is sk.MUL[23]
    assert iquants.mul_mxfp4 is sk.MUL[39]


@pytest.mark.parametrize(
    "types",
    [pytest.param(sorted(set(GENERATED) - set(SLOW_COMPILE)), id="formats")]
    + [
        pytest.param([t], marks=[pytest.mark.slow, pytest.mark.xdist_group(f"compile-{t}")], id=NAMES[t])
        for t in SLOW_COMPILE
    ],
)
def test_generated_kernels_load_from_cache_in_a_new_process(types: list[int]) -> None:
    root = Path(sk.__file__).resolve().parents[1]
    if not os.access(Path(sk.__file__).parent, os.W_OK):
        pytest.skip("the package directory is read-only: Numba cannot cache here")
    probe = _PROBE.replace("TYPES", repr(types))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):  # the first run fills the cache (a no-op when earlier tests or runs did)
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    misses = json.loads(done.stdout.strip().splitlines()[-1])
    assert misses == {str(t): 0 for t in types}, "kernels recompiled in a fresh process"


_EXPERTS_PROBE = """
import json, numpy as np, simd_kernels as sk
calls = {}
for t in TYPES:
    per, size = sk.BLOCKS[t]
    w = np.zeros((8, 256 // per * size), np.uint8)  # (2 experts * 4 rows, 256 elements)
    w.flags.writeable = False  # as the mmap's weights
    ids = np.zeros(1, np.int64)
    sk.EXPERTS[t](w, 4, np.zeros((1, 256), np.float32), ids, ids, np.empty((1, 4), np.float32))
    calls[t] = len(sk.EXPERTS[t].stats.cache_misses)
print(json.dumps(calls))
"""


def test_experts_kernels_are_generated_beside_each_format_and_load_from_cache() -> None:
    """simd.fused_kernel makes each format's selected-experts kernel too (qwen3moe's decode); they cache as MUL's do."""
    assert sorted(sk.EXPERTS) == sorted(GENERATED)
    assert all(k.__name__ == GENERATED[t].__name__.replace("mul_", "experts_") for t, k in sk.EXPERTS.items())
    root = Path(sk.__file__).resolve().parents[1]
    if not os.access(Path(sk.__file__).parent, os.W_OK):
        pytest.skip("the package directory is read-only: Numba cannot cache here")
    types = [8, 12]  # a legacy and a K-quant row dot: the two kinds of generated code (compiling all would be slow)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):  # the first run fills the cache (a no-op when earlier tests or runs did)
        done = subprocess.run(
            [sys.executable, "-c", _EXPERTS_PROBE.replace("TYPES", repr(types))],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
    misses = json.loads(done.stdout.strip().splitlines()[-1])
    assert misses == {str(t): 0 for t in types}, "experts kernels recompiled in a fresh process"
