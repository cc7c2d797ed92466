"""simd_kernels.kquants_prompt and block32_prompt: the prompt kernels (Q4_K, Q5_K, Q6_K; Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4) and
their interleaved activations.

The kernel's numbers are its own (it sums a row's lanes in another order than the per-row kernel), so it is held to
the same oracle as every kernel (tests/simd_kernels/test_kernels.check: llama.cpp's activation quantization emulated
exactly, and the float64 product), a token's result must not depend on the other tokens of the call, every x86 path
must give the generic code's bits, and the backend's `linears` must give `linear`'s outputs on a prompt piece.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _kernel_blocks import formats, random_weights
from test_kernels import check

import simd_kernels as sk
from simd_kernels import ir
from localrt.engine.backends.backend import CPUBackend, QTensor
from simd_kernels import block32_prompt
from simd_kernels.actquant import Q4K_DWORDS, Q6K_DWORDS, quantize_q8_0, quantize_q8_1, quantize_q8_k
from simd_kernels.kquants_prompt import PREFILL_Q4_K, PREFILL_Q5_K, PREFILL_Q6_K
from _testpaths import REPO

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4 = 2, 3, 6, 7, 8, 12, 13, 14, 39
KERNELS = {
    Q4_K: PREFILL_Q4_K,
    Q5_K: PREFILL_Q5_K,
    Q6_K: PREFILL_Q6_K,
    Q8_0: block32_prompt.PREFILL_Q8_0,
    Q4_0: block32_prompt.PREFILL_Q4_0,
    Q5_0: block32_prompt.PREFILL_Q5_0,
    Q4_1: block32_prompt.PREFILL_Q4_1,
    Q5_1: block32_prompt.PREFILL_Q5_1,
    MXFP4: block32_prompt.PREFILL_MXFP4,
}
NAMES = {
    Q4_0: "Q4_0",
    Q4_1: "Q4_1",
    Q5_0: "Q5_0",
    Q5_1: "Q5_1",
    Q8_0: "Q8_0",
    Q4_K: "Q4_K",
    Q5_K: "Q5_K",
    Q6_K: "Q6_K",
    MXFP4: "MXFP4",
}
SHARED = [t for t in NAMES if t not in (Q4_K, Q5_K, Q6_K)]  # the formats whose per-row kernels are these row dots
FORMATS = pytest.mark.parametrize("t", formats(list(NAMES), list(NAMES.values())))
ROOT = REPO


def _prefill(t: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    quantize, kernel = KERNELS[t]
    out = np.empty((x.shape[0], w.shape[0]), np.float32)  # (n_tok, rows)
    kernel(w, *quantize(x), out)
    return out


@pytest.mark.parametrize("t, order, group", [(Q4_K, Q4K_DWORDS, 32), (Q6_K, Q6K_DWORDS, 16)], ids=["Q4_K", "Q6_K"])
def test_the_interleaved_activations_are_q8_k_reordered(t: int, order: np.ndarray, group: int) -> None:
    x = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    q, d, bsums = quantize_q8_k(x)
    iq, idt, sums = KERNELS[t][0](x)
    assert sorted(order) == list(range(64))
    natural = q.view(np.int32).reshape(5, 2, 64)  # (n_tok, super-blocks, dwords)
    assert np.array_equal(iq.view(np.int32).reshape(5, 2, 64), natural[:, :, order])
    assert np.array_equal(idt, d.T)
    n = 256 // group
    groups = bsums.reshape(5, 2, n, group // 16).sum(axis=3)  # (n_tok, super-blocks, groups)
    assert np.array_equal(sums.astype(np.int64), groups.reshape(5, 2, n // 2, 2).transpose(1, 2, 0, 3))


@pytest.mark.parametrize(
    "t, shift",
    [(Q8_0, 7), (Q4_0, 3), (Q5_0, 4), (Q4_1, None), (Q5_1, None)],
    ids=["Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1"],
)
def test_the_grouped_activations_are_q8_0_or_q8_1_transposed(t: int, shift: int | None) -> None:
    x = np.random.default_rng(0).standard_normal((3, 640)).astype(np.float32)  # 20 blocks: 2 groups and a half
    q, d, extra = (quantize_q8_1 if shift is None else quantize_q8_0)(x)
    gq, gd, gextra = KERNELS[t][0](x)
    assert gq.shape == (3, 768) and gd.shape == gextra.shape == (3, 24)
    natural = np.zeros((3, 768), np.int8)
    natural[:, :640] = q
    dwords = natural.view(np.int32).reshape(3, 3, 8, 8)  # (n_tok, groups, blocks, dwords of a block)
    got = gq.view(np.int32).reshape(3, 3, 8, 8)  # (n_tok, groups, registers, lanes)
    assert np.array_equal(got[:, :2], dwords[:, :2].transpose(0, 1, 3, 2))
    # the last group, 4 blocks: register m holds dword m of blocks 0..3, then dword m + 4 of them; 4 zero registers
    half = dwords[:, 2, :4].reshape(3, 4, 2, 4).transpose(0, 3, 2, 1).reshape(3, 4, 8)  # (n_tok, m, lanes)
    assert np.array_equal(got[:, 2, :4], half) and not got[:, 2, 4:].any()
    assert np.array_equal(gd[:, :20], d) and not gd[:, 20:].any()
    want = extra if shift is None else -(extra.astype(np.int64) << shift)  # Q8_1's s, or the offset's term
    assert np.array_equal(gextra[:, :20], want) and not gextra[:, 20:].any()


@FORMATS
@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 7, 8, 13, 69])
def test_prefill_against_the_oracle(t: int, n_tok: int) -> None:
    rng = np.random.default_rng(n_tok)
    # 3 super-blocks a row; or 3 groups of 8 blocks, or 2 and 5 blocks (a full group's tail), or 2 and 3 (a half's)
    cols = 768 if t in (Q4_K, Q5_K, Q6_K) or n_tok % 3 == 0 else (672 if n_tok % 3 == 1 else 608)
    w = random_weights(rng, t, 24, cols)  # (rows, row_bytes)
    w.flags.writeable = False
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    check(t, w, x, _prefill(t, w, x))


@FORMATS
def test_a_tokens_result_does_not_depend_on_the_call(t: int) -> None:
    rng = np.random.default_rng(1)
    cols = 512 if t in (Q4_K, Q5_K, Q6_K) else 608  # 2 super-blocks; 2 groups of 8 blocks and 3 blocks
    w = random_weights(rng, t, 40, cols)
    w.flags.writeable = False
    x = rng.standard_normal((21, cols)).astype(np.float32)
    whole = _prefill(t, w, x)
    for lo, hi in ((0, 1), (5, 8), (3, 16), (16, 21), (0, 13)):  # 16- or 8-token passes, tails, other offsets
        assert np.array_equal(_prefill(t, w, np.ascontiguousarray(x[lo:hi])), whole[lo:hi]), (lo, hi)


@pytest.mark.parametrize("t", formats(SHARED, [NAMES[t] for t in SHARED]))
def test_the_prompt_kernel_gives_the_per_row_kernels_bits(t: int) -> None:
    """The 32-element formats' per-row kernels (decode; MXFP4's experts and an expert's share of a prompt) are made
    of the prompt kernel's row dots: a token's bits are the same on either path, one token a call or 21."""
    rng = np.random.default_rng(2)
    w = random_weights(rng, t, 40, 2880)  # gpt-oss's rows: 11 groups of 8 blocks and 2 (a half tail)
    w.flags.writeable = False
    x = rng.standard_normal((21, 2880)).astype(np.float32)
    whole = _prefill(t, w, x)
    per_row = np.empty_like(whole)
    sk.MUL[t](w, x, per_row)
    assert np.array_equal(per_row, whole)
    for i in (0, 7, 20):
        one = np.empty((1, 40), np.float32)
        sk.MUL[t](w, np.ascontiguousarray(x[i : i + 1]), one)
        assert np.array_equal(one[0], whole[i])


_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from _kernel_blocks import random_weights
from simd_kernels import block32_prompt
from simd_kernels.kquants_prompt import PREFILL_Q4_K, PREFILL_Q5_K, PREFILL_Q6_K
out = []
for t, (quantize, kernel) in ((12, PREFILL_Q4_K), (13, PREFILL_Q5_K), (14, PREFILL_Q6_K), (8, block32_prompt.PREFILL_Q8_0),
                              (2, block32_prompt.PREFILL_Q4_0), (6, block32_prompt.PREFILL_Q5_0), (3, block32_prompt.PREFILL_Q4_1),
                              (7, block32_prompt.PREFILL_Q5_1), (39, block32_prompt.PREFILL_MXFP4)):
    rng = np.random.default_rng(3)
    cols = 512 if 8 < t < 39 else 608  # whole super-blocks; 2 groups and 3 blocks
    w = random_weights(rng, t, 40, cols)
    w.flags.writeable = False
    x = rng.standard_normal((27, cols)).astype(np.float32)  # the K-quants' 16-token pass, then 8 and 3
    o = np.empty((27, 40), np.float32)
    kernel(w, *quantize(x), o)
    out += o.view(np.uint32).ravel().tolist()
print(json.dumps(out))
"""


def _host_path(features: str) -> bool:
    """Whether LOCALRT_SIMD_X86=features selects what this host runs unset: that path's kernels are the ones in the
    shared Numba cache (compiled by the rest of the suite), so its subprocess needs no cold compile of its own."""
    return "LOCALRT_SIMD_X86" not in os.environ and {f for f in features.split(",") if f} == set(ir.X86)


def _bits(tmp_path: Path, features: str) -> np.ndarray:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOCALRT_SIMD_X86", None)
    if not _host_path(features):  # the host's own path reads the shared cache the other tests filled
        env.update(NUMBA_CACHE_DIR=str(tmp_path / f"cache-{features}"), LOCALRT_SIMD_X86=features)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(tests=str(ROOT / "tests"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return np.array(json.loads(r.stdout.splitlines()[-1]), np.uint32)


@pytest.mark.slow  # every kernel compiled cold once per instruction set, in subprocesses
@pytest.mark.skipif("avx2" not in ir.X86, reason="the host has no AVX2: only the generic code runs here")
def test_every_x86_path_gives_the_generic_codes_bits(tmp_path: Path) -> None:
    generic = _bits(tmp_path, "")
    paths = ["avx2"] + (["avx2,avx512vnni,avx512vl"] if {"avx512vnni", "avx512vl"} <= ir.X86 else [])
    for features in paths:
        assert np.array_equal(_bits(tmp_path, features), generic), features


@FORMATS
def test_linears_on_a_prompt_piece_is_linear(t: int) -> None:
    if t not in sk.PREFILL:
        pytest.skip("this host keeps the format's prompts on another path")
    rng = np.random.default_rng(4)
    ws = tuple(
        QTensor(f"w{i}", t, (rows, 256), random_weights(rng, t, rows, 256)) for i, rows in enumerate((48, 16, 16))
    )
    x = rng.standard_normal((120, 256)).astype(np.float32)  # (n_tok, cols)
    # a 76-row piece then 44 rows per row; a 106-row piece then 14 rows per row
    for start in (180, 150):
        positions = np.arange(start, start + 120, dtype=np.int64)
        be = CPUBackend()
        with be.planned(positions, np.zeros(120, np.int64)):
            together = be.linears(ws, x)
            alone = [be.linear(w, x) for w in ws]
        for a, b in zip(together, alone):
            assert np.array_equal(a, b)


def test_linears_of_mixed_prompt_formats_is_linear(monkeypatch) -> None:
    # Gemma 3's q/k/v: Q5_0 with a Q8_0 v; one call runs each weight on its own format's prompt kernel
    formats = [t for t in (Q5_0, Q8_0, Q4_K, Q4_1) if t in sk.PREFILL]
    if len(formats) < 2:
        pytest.skip("this host has fewer than two prompt kernels")
    rng = np.random.default_rng(5)
    ws = tuple(
        QTensor(f"w{i}", t, (rows, 512), random_weights(rng, t, rows, 512))
        for i, (t, rows) in enumerate(zip(formats + formats[:1], (48, 16, 32, 24, 16)))
    )
    x = rng.standard_normal((120, 512)).astype(np.float32)  # (n_tok, cols)
    calls = []
    prefill = CPUBackend._prefill
    monkeypatch.setattr(CPUBackend, "_prefill", staticmethod(lambda *a: (calls.append(len(a[0])), prefill(*a))))
    be = CPUBackend()
    with be.planned(np.arange(180, 300, dtype=np.int64), np.zeros(120, np.int64)):  # a 76-row piece, 44 per row
        together = be.linears(ws, x)
        assert calls == [len(ws)]  # all of them in one call
        alone = [be.linear(w, x) for w in ws]
    for a, b in zip(together, alone):
        assert np.array_equal(a, b)
