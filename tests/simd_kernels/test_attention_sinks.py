"""Attention sinks (gpt-oss's attn_sinks), YaRN rope and swiglu_oai against float64 NumPy references of ggml's
formulas: the per-row kernel (both its vector and its loop form), the paged pool and the prompt path's BLAS block
attention; sink-less calls unchanged bit for bit; bad sinks refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localrt.engine.backends.backend import CPUBackend, _block_attention
from localrt.engine.backends.pieces import BLAS_MIN_TOKENS
from simd_kernels import KernelArgumentError, ops, paged

N, N_HEAD, N_KV, CAP = BLAS_MIN_TOKENS + 16, 4, 2, 128  # N rows at positions 0..N-1: one BLAS piece


def _inputs(hd: int, seed=0):
    rng = np.random.default_rng(seed)
    q = (2 * rng.standard_normal((N, N_HEAD, hd))).astype(np.float32)
    k = rng.standard_normal((1, N_KV, CAP, hd)).astype(np.float32)  # (n_slots, n_kv, cap, hd)
    v = rng.standard_normal((1, N_KV, CAP, hd)).astype(np.float32)
    sinks = (2 + 2 * rng.standard_normal(N_HEAD)).astype(np.float32)  # (n_head,) of the scores' size: they bite
    return q, k, v, np.arange(N, dtype=np.int64), np.zeros(N, np.int64), sinks


def _reference(q, k, v, positions, window, scale, sinks):
    out = np.zeros(q.shape, np.float64)  # (n_tok, n_head, hd)
    for t, p in enumerate(positions):
        lo = max(0, p - window + 1) if window else 0
        for h in range(N_HEAD):
            kv = h // (N_HEAD // N_KV)
            s = k[0, kv, lo : p + 1].astype(np.float64) @ q[t, h] * scale
            top = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - top)
            total = e.sum() + (math.exp(sinks[h] - top) if sinks is not None else 0.0)
            out[t, h] = (e / total) @ v[0, kv, lo : p + 1]
    return out


def _pool(kc):
    """The contiguous cache kc (1, n_kv, cap, hd) as a pool of 16-row blocks in reverse order: (pool, table)."""
    size = 16
    blocks = kc[0].reshape(N_KV, CAP // size, size, -1).transpose(1, 0, 2, 3)[::-1].copy()  # (n_blocks, n_kv, B, hd)
    table = np.arange(CAP // size, dtype=np.int32)[::-1].copy()[None, :]  # (1, n_blocks)
    return blocks, table


@pytest.mark.parametrize("hd", [16, 64])  # 16: the kernel's loop form; 64: its vector form
@pytest.mark.parametrize("window", [0, 7])
def test_every_attention_path_matches_the_reference_with_sinks(hd, window):
    q, k, v, pos, slots, sinks = _inputs(hd)
    scale = 1 / math.sqrt(hd)
    ref = _reference(q, k, v, pos, window, scale, sinks)
    kern = ops.attention(q, k, v, pos, slots, window, scale, np.empty_like(q), sinks=sinks)
    kp, table = _pool(k)
    vp, _ = _pool(v)
    pool = paged.attention_paged(q, kp, vp, table, pos, slots, window, scale, np.empty_like(q), sinks=sinks)
    be = CPUBackend()
    blas = be.attention(q, k, v, pos, slots, window, scale, np.empty_like(q), sinks=sinks)  # one BLAS piece
    blas_pool = be.attention(q, kp, vp, pos, slots, window, scale, np.empty_like(q), table=table, sinks=sinks)
    for got in (kern, pool, blas, blas_pool):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert np.array_equal(kern, pool)  # one kernel: the same bits over either cache
    assert np.abs(_reference(q, k, v, pos, window, scale, None) - ref).max() > 1e-2  # the sinks matter here


def test_without_sinks_every_path_gives_the_bits_it_gave_before():
    q, k, v, pos, slots, _ = _inputs(64, seed=1)
    be = CPUBackend()
    for window in (0, 7):
        a = ops.attention(q, k, v, pos, slots, window, 0.125, np.empty_like(q))
        b = ops.attention(q, k, v, pos, slots, window, 0.125, np.empty_like(q), sinks=None)
        assert np.array_equal(a, b)
        c = np.empty_like(q)
        _block_attention(q, k, v, pos, 0, window, 0.125, c, 0.0)
        assert np.array_equal(c, be.attention(q, k, v, pos, slots, window, 0.125, np.empty_like(q), sinks=None))


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(N_HEAD + 1, np.float32),
        np.zeros(N_HEAD, np.float64),
        np.full(N_HEAD, np.nan, np.float32),
        [0.0] * N_HEAD,
    ],
)
def test_bad_sinks_are_refused_by_name(bad):
    q, k, v, pos, slots, _ = _inputs(16)
    with pytest.raises(KernelArgumentError, match="sinks"):
        ops.attention(q, k, v, pos, slots, 0, 0.25, np.empty_like(q), sinks=bad)
    with pytest.raises(KernelArgumentError, match="sinks"):
        CPUBackend().attention(q, k, v, pos, slots, 0, 0.25, np.empty_like(q), sinks=bad)


def _yarn_reference(x, positions, n_rot, base, freq_scale, n_ctx_orig, ext, attn, fast, slow):
    """ggml's rope_yarn (NEOX pairs) in float64."""

    def corr(turns):
        return n_rot * math.log(n_ctx_orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(corr(fast))), min(n_rot - 1, math.ceil(corr(slow)))
    out = x.astype(np.float64)
    half = n_rot // 2
    mscale = attn * (1 + 0.1 * math.log(1 / freq_scale)) if ext else attn
    for t, p in enumerate(positions):
        for i in range(half):
            extrap = p * base ** (-2 * i / n_rot)
            ramp = (1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))) * ext
            theta = freq_scale * extrap * (1 - ramp) + extrap * ramp
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            a, b = x[t, :, i].astype(np.float64), x[t, :, i + half].astype(np.float64)
            out[t, :, i], out[t, :, i + half] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("ext", [1.0, 0.0])
def test_yarn_rope_matches_ggmls_formula(ext):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 3, 64)).astype(np.float32)  # (n_tok, n_head, head_dim)
    positions = np.arange(0, 400, 10, dtype=np.int64)
    yarn = (64, ext, 0.9, 32.0, 1.0)  # corr dims 0 .. 9 of 32 pairs at base 10000
    got = ops.rope(x.copy(), positions, 64, 10000.0, 0.125, np.ones(32, np.float32), ops.ROPE_NEOX, yarn=yarn)
    ref = _yarn_reference(x, positions, 64, 10000.0, 0.125, *yarn)
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4)
    plain = ops.rope(x.copy(), positions, 64, 10000.0, 0.125, np.ones(32, np.float32), ops.ROPE_NEOX)
    assert np.abs(plain - got).max() > 0.1  # the ramp and the magnitude scaling both change it


def test_yarn_at_scale_one_is_plain_rope():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 2, 16)).astype(np.float32)
    pos = np.arange(8, dtype=np.int64)
    got = ops.rope(
        x.copy(), pos, 16, 10000.0, 1.0, np.ones(8, np.float32), ops.ROPE_NEOX, yarn=(64, 1.0, 1.0, 32.0, 1.0)
    )
    np.testing.assert_allclose(
        got, ops.rope(x.copy(), pos, 16, 10000.0, 1.0, np.ones(8, np.float32), ops.ROPE_NEOX), rtol=1e-6, atol=1e-6
    )


def test_swiglu_oai_matches_ggmls_formula():
    rng = np.random.default_rng(4)
    gate = (6 * rng.standard_normal((5, 96))).astype(np.float32)  # past the clamp at +-7 often
    up = (6 * rng.standard_normal((5, 96))).astype(np.float32)
    g = np.minimum(gate.astype(np.float64), 7.0)
    u = np.clip(up.astype(np.float64), -7.0, 7.0)
    ref = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    np.testing.assert_allclose(ops.swiglu_oai(gate, up, np.empty_like(gate)), ref, rtol=1e-5, atol=1e-5)
