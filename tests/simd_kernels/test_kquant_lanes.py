"""The Q4_K / Q5_K / Q6_K row dots bit for bit against a NumPy model of their lane arithmetic.

The kernels' float results are fixed by their integer math and one float order, which this file states.
Per super-block, 8 int32 lanes, lane k = Σ_j s_jk * (q . x over elements 4k..4k+3 of the 32-element piece j), with
q as stored (Q5_K: with its fifth bit, 0..31; Q6_K: 0..63, not centred) and s_jk the scale of those elements; in
float32, Q4_K and Q5_K: acc += (d*dx) * lane, then acc -= (dmin*dx) * (m_k * (bsum[2k] + bsum[2k+1])); Q6_K:
acc += (d*dx) * (lane - 32 * (sc[2k]*bsum[2k] + sc[2k+1]*bsum[2k+1])); the row's value is acc[0] + ... + acc[7].
Any rewrite of the kernels (instructions, layouts, accumulator splits) must keep exactly these numbers. The integer
decode here is checked against the independent oracle gguf.quants (d*sc*q - dmin*m), and the activations come from
the kernels' own Q8_K quantizer (tests/simd_kernels/test_kernels.py checks that one against the reference).
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernel_blocks import random_weights

from simd_kernels import kquants
from simd_kernels.actquant import quantize_q8_k

gguf_quants = pytest.importorskip("gguf.quants")
import gguf

Q4_K, Q5_K, Q6_K = 12, 13, 14
F32 = np.float32


def _f16(raw, o):
    return raw[:, :, o : o + 2].copy().view(np.float16)[..., 0].astype(F32)  # (rows, nb)


def _scales_mins(s12):
    """(rows, nb, 12) packed 6-bit scales/mins -> (sc, m) int64 (rows, nb, 8), GGUF's Q4_K/Q5_K packing."""
    s = s12.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, m


def decode(t, w, cols):
    """-> (q int64 (rows, cols) as dotted, piece scale int64 (rows, cols/16) per 16 elements, d, dmin, mins)."""
    rows, nb = w.shape[0], cols // 256
    raw = w.reshape(rows, nb, -1)
    if t in (Q4_K, Q5_K):
        d, dmin = _f16(raw, 0), _f16(raw, 2)
        sc, m = _scales_mins(raw[:, :, 4:16])
        qs = raw[:, :, 48:176] if t == Q5_K else raw[:, :, 16:144]  # (rows, nb, 128)
        q = np.empty((rows, nb, 8, 32), np.int64)  # sub-block j = 2c (low nibbles) and 2c+1 (high) of chunk c
        for c in range(4):
            chunk = qs[:, :, 32 * c : 32 * c + 32].astype(np.int64)
            q[:, :, 2 * c], q[:, :, 2 * c + 1] = chunk & 15, chunk >> 4
        if t == Q5_K:
            qh = raw[:, :, 16:48].astype(np.int64)  # bit j of byte l: fifth bit of element 32j + l
            for j in range(8):
                q[:, :, j] |= ((qh >> j) & 1) << 4
        return q.reshape(rows, cols), np.repeat(sc, 2, axis=-1).reshape(rows, -1), d, dmin, m
    d = _f16(raw, 208)
    ql, qh = raw[:, :, 0:128].astype(np.int64), raw[:, :, 128:192].astype(np.int64)
    q = np.empty((rows, nb, 256), np.int64)
    for n in range(2):
        a, b, h = ql[:, :, 64 * n : 64 * n + 32], ql[:, :, 64 * n + 32 : 64 * n + 64], qh[:, :, 32 * n : 32 * n + 32]
        base = 128 * n
        q[:, :, base : base + 32] = (a & 15) | ((h & 3) << 4)
        q[:, :, base + 32 : base + 64] = (b & 15) | (((h >> 2) & 3) << 4)
        q[:, :, base + 64 : base + 96] = (a >> 4) | (((h >> 4) & 3) << 4)
        q[:, :, base + 96 : base + 128] = (b >> 4) | (((h >> 6) & 3) << 4)
    sc = raw[:, :, 192:208].view(np.int8).astype(np.int64)  # (rows, nb, 16): one per 16 elements
    return (q - 32).reshape(rows, cols), sc.reshape(rows, -1), d, None, None


def lane_model(t, w, x):
    """float32 (n_tok, rows): the kernels' arithmetic, as the module docstring states it."""
    cols = x.shape[1]
    q, sc, d, dmin, m = decode(t, w, cols)
    xq, xd, bs = quantize_q8_k(x)
    rows, nb = w.shape[0], cols // 256
    if t == Q6_K:
        return _q6k_lane_model(q + 32, sc, d, xq, xd, bs, rows, nb)
    return _q4k_lane_model(q, sc, d, dmin, m, xq, xd, bs, rows, nb)  # Q4_K, Q5_K


def _q4k_lane_model(q, sc, d, dmin, m, xq, xd, bs, rows, nb):
    n_tok = len(xq)
    quads = (q[None] * xq.astype(np.int64)[:, None]).reshape(n_tok, rows, nb, 8, 8, 4).sum(-1)  # (.., sub j, lane k)
    scale = sc.reshape(rows, nb, 8, 2)[..., 0]  # (rows, nb, 8): one per sub-block
    isum = (quads * scale[None, :, :, :, None]).sum(3)  # (n_tok, rows, nb, 8) exact int64
    assert np.abs(isum).max() < 2**24  # float32 of each lane is exact, as int32 -> float is in the kernel
    out = np.empty((n_tok, rows), F32)
    for tok in range(n_tok):
        acc = np.zeros((rows, 8), F32)
        for b in range(nb):
            dx = xd[tok, b]
            acc = acc + (d[:, b] * dx)[:, None] * isum[tok, :, b].astype(F32)
            pair = bs[tok, 16 * b : 16 * b + 16].astype(np.int64).reshape(8, 2).sum(-1)  # (8,)
            acc = acc - (dmin[:, b] * dx)[:, None] * (m[:, b] * pair).astype(F32)
        total = acc[:, 0]
        for i in range(1, 8):
            total = total + acc[:, i]
        out[tok] = total
    return out


def _q6k_lane_model(q, sc, d, xq, xd, bs, rows, nb):
    n_tok = len(xq)
    quads = (q[None] * xq.astype(np.int64)[:, None]).reshape(n_tok, rows, nb, 8, 8, 4).sum(-1)  # (.., piece j, lane k)
    scale = sc.reshape(rows, nb, 8, 2)[:, :, :, np.repeat([0, 1], 4)]  # (rows, nb, 8, 8): lanes 0-3 / 4-7
    lanes = (quads * scale[None]).sum(3)  # (n_tok, rows, nb, 8) exact int64
    offs = (sc.reshape(rows, nb, 8, 2)[None] * bs.astype(np.int64).reshape(n_tok, 1, nb, 8, 2)).sum(-1)
    isum = lanes - 32 * offs
    assert np.abs(isum).max() < 2**24  # float32 of each lane is exact, as int32 -> float is in the kernel
    out = np.empty((n_tok, rows), F32)
    for tok in range(n_tok):
        acc = np.zeros((rows, 8), F32)
        for b in range(nb):
            acc = acc + (d[:, b] * xd[tok, b])[:, None] * isum[tok, :, b].astype(F32)
        total = acc[:, 0]
        for i in range(1, 8):
            total = total + acc[:, i]
        out[tok] = total
    return out


@pytest.mark.parametrize("t", [Q4_K, Q5_K, Q6_K])
def test_decode_matches_gguf_quants(t):
    rng = np.random.default_rng(40 + t)
    w = random_weights(rng, t, 7, 512)
    q, sc, d, dmin, m = decode(t, w, 512)
    if t == Q6_K:
        want = d.repeat(256, 1) * sc.repeat(16, 1) * q
    else:
        sub = np.arange(512) // 32
        nb = np.arange(512) // 256
        scale = sc[:, ::2]  # (rows, nb*8) one per sub-block
        want = d[:, nb] * scale[:, sub] * q - dmin[:, nb] * m.reshape(7, -1)[:, sub]
    ggml = {
        Q4_K: gguf.GGMLQuantizationType.Q4_K,
        Q5_K: gguf.GGMLQuantizationType.Q5_K,
        Q6_K: gguf.GGMLQuantizationType.Q6_K,
    }[t]
    got = gguf_quants.dequantize(w, ggml).reshape(7, 512).astype(np.float64)
    assert np.allclose(want, got, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("t", [Q4_K, Q5_K, Q6_K])
@pytest.mark.parametrize("n_tok", [1, 2, 4, 7, 13])
def test_row_dots_bit_exact_against_the_lane_model(t, n_tok):
    rng = np.random.default_rng(100 * t + n_tok)
    rows, cols = 37, 1024
    w = random_weights(rng, t, rows, cols)
    x = rng.standard_normal((n_tok, cols)).astype(F32)
    x[0, :256] *= 30  # one loud super-block: larger lanes
    out = np.full((n_tok, rows), np.nan, F32)
    getattr(kquants, {Q4_K: "mul_q4_k", Q5_K: "mul_q5_k", Q6_K: "mul_q6_k"}[t])(w, x, out)
    want = lane_model(t, w, x)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_q8_k_activations_bit_exact_against_the_reference():
    """The kernels' Q8_K quantizer against quant's reference (ggml's quantize_row_q8_K_ref): values, scales, sums,
    with ties for the largest |x| (the first one wins), all-zero blocks, and a sign change of the peak."""
    from quant import activations

    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 1024)).astype(F32)
    x[1, 256:512] = 0
    x[2, 3], x[2, 200] = -4.0, 4.0  # tie: -4 comes first
    x[3, 10], x[3, 11] = 5.0, -5.0
    x[4] = np.round(x[4] * 8) / 8  # many exact halves after scaling
    q, d, bs = quantize_q8_k(x)
    ref = activations.quantize_q8_k(x.reshape(-1, 256)).reshape(6, 4)
    assert np.array_equal(q.reshape(6, 4, 256), ref["qs"])
    assert np.array_equal(d.view(np.uint32), ref["d"].astype(F32).view(np.uint32))
    assert np.array_equal(bs.reshape(6, 4, 16), ref["bsums"].astype(np.int32))
