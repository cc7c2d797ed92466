"""The x86 integer-dot row dots (VNNI vpdpbusd / vpdpwssd, AVX-512 and AVX2 vpmaddubsw) give bit-identical products to the generic LLVM
code on this machine, so a model's numerics do not depend on which instructions its CPU has. Each path runs in a
subprocess, with a private Numba cache (the feature choice is not in Numba's cache key) but for the host's own path,
which reads the shared one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simd_kernels import ir
from _testpaths import REPO

ROOT = REPO
# Q4_0 (signed quants), Q4_1 (unsigned, with a min), Q5_0, Q5_1 (fifth bits), Q8_0, Q4_K, Q5_K, Q6_K
TYPES = (2, 3, 6, 7, 8, 12, 13, 14)
_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import simd_kernels as sk
import quant
from _kernel_blocks import SCALE_OFFSETS, random_weights
out = {{}}
for t in {types!r}:
    rng = np.random.default_rng(t)
    w = random_weights(rng, t, 40, 512)
    # saturating blocks: every byte but the scales 0xff (Q8_0: -128), against activations of one magnitude (every
    # quant +-127): the largest pair sums the 16-bit steps of AVX2 can meet
    sat = w.reshape(40, 512 // quant.FORMATS[t].block_size, -1).copy()
    keep = np.zeros(sat.shape[2], bool)
    for o in SCALE_OFFSETS[t]:
        keep[o:o + 2] = True
    sat[:, :, ~keep] = 0x80 if t == 8 else 0xFF
    sat = sat.reshape(40, -1)
    for name, weights in (("random", w), ("saturating", sat)):
        weights.flags.writeable = False
        for n in (1, 5, 8):
            x = rng.standard_normal((n, 512)).astype(np.float32)
            if name == "saturating":
                x = np.where(np.arange(512) % 64 < 32, 1.0, -1.0).astype(np.float32) * np.sign(x[:, :1])
            o = np.empty((n, 40), np.float32)
            sk.MUL[t](weights, x, o)
            out[f"{{t}}_{{name}}_{{n}}"] = o.view(np.uint32).ravel().tolist()
print(json.dumps(out))
"""


def _host_path(features: str) -> bool:
    """Whether LOCALRT_SIMD_X86=features selects what this host runs unset: that path's kernels are the ones in the
    shared Numba cache (compiled by the rest of the suite), so its subprocess needs no cold compile of its own."""
    return "LOCALRT_SIMD_X86" not in os.environ and {f for f in features.split(",") if f} == set(ir.X86)


def _products(tmp_path: Path, features: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOCALRT_SIMD_X86", None)
    if features is not None and not _host_path(features):  # the host's own path reads the shared cache
        env["LOCALRT_SIMD_X86"] = features
        env["NUMBA_CACHE_DIR"] = str(tmp_path / f"cache-{features}")
    code = _SCRIPT.format(tests=str(ROOT / "tests"), types=TYPES)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.slow  # every kernel compiled cold once per instruction set, in subprocesses
@pytest.mark.skipif("avx2" not in ir.X86, reason="the host has no AVX2: only the generic code runs here")
def test_every_x86_path_gives_the_generic_codes_bits(tmp_path):
    generic = _products(tmp_path, "")
    paths = ["avx2"] + (["avx2,avx512vnni,avx512vl"] if {"avx512vnni", "avx512vl"} <= ir.X86 else [])
    paths += ["avx2,avx512vnni,avx512vl,avx512bw"] if {"avx512vnni", "avx512vl", "avx512bw"} <= ir.X86 else []
    for features in paths:
        got = _products(tmp_path, features)
        for key, bits in generic.items():
            assert np.array_equal(np.array(got[key], np.uint32), np.array(bits, np.uint32)), (features, key)
