"""Fused dequantize x dot for the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Weights w: uint8 (rows, n_blocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1
(Q4_1, Q5_1) as llama.cpp does; each block's dot product is an exact integer sum (simd.rowdot*).
Output out: float32 (n_tok, rows). Each weight row is decoded once per 4 tokens; tokens go in chunks
so that their quantized activations stay in cache while every row streams past.
"""
from __future__ import annotations

from numba import njit, prange

from .actquant import quantize_q8_0, quantize_q8_1
from .simd import (rowdot1_q4_0, rowdot1_q4_1, rowdot1_q5_0, rowdot1_q5_1, rowdot1_q8_0, rowdot4_q4_0,
                   rowdot4_q4_1, rowdot4_q5_0, rowdot4_q5_1, rowdot4_q8_0)

TOKEN_CHUNK = 64  # tokens per pass over the weights: (64, cols) int8 activations stay in L2


@njit(cache=True, nogil=True, parallel=True)
def mul_q8_0(w, x, out):
    """Q8_0 block (34 B): d f16, qs int8[32]; y = d*q."""
    xq, xd, _ = quantize_q8_0(x)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q8_0(row, xq, xd, xd, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q8_0(row, xq, xd, xd, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_0(w, x, out):
    """Q4_0 block (18 B): d f16, qs[16]; y = d*(q - 8)."""
    xq, xd, _ = quantize_q8_0(x)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q4_0(row, xq, xd, xd, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q4_0(row, xq, xd, xd, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q4_1(w, x, out):
    """Q4_1 block (20 B): d f16, m f16, qs[16]; y = d*q + m, dotted as d*dx*Σq*x + m*s (Q8_1)."""
    xq, xd, xs = quantize_q8_1(x)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q4_1(row, xq, xd, xs, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q4_1(row, xq, xd, xs, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_0(w, x, out):
    """Q5_0 block (22 B): d f16, qh u32, qs[16]; y = d*(q - 16)."""
    xq, xd, _ = quantize_q8_0(x)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q5_0(row, xq, xd, xd, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q5_0(row, xq, xd, xd, t)
                t += 1


@njit(cache=True, nogil=True, parallel=True)
def mul_q5_1(w, x, out):
    """Q5_1 block (24 B): d f16, m f16, qh u32, qs[16]; y = d*q + m (Q8_1 activations)."""
    xq, xd, xs = quantize_q8_1(x)
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            row = w[r]
            t = t0
            while t + 4 <= t1:
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = rowdot4_q5_1(row, xq, xd, xs, t)
                t += 4
            while t < t1:
                (out[t, r],) = rowdot1_q5_1(row, xq, xd, xs, t)
                t += 1
