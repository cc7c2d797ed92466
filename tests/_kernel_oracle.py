"""Oracles for the simd_kernels tests: float64 references that emulate llama.cpp's activation quantization.

`emulated_dot(t, w, x)` is what llama.cpp's CPU vec_dot computes in exact arithmetic: weights dequantized
by the reference `quant.dequantize`, activations quantized to the weight's vec_dot_type by the reference
`quant.quantize_activations` (Q4_1/Q5_1 use the Q8_1 block sum s for the min term, as ggml does).
`activation_error(t, x)` bounds |x - x_as_the_kernel_sees_it| per element, for comparisons against the
unquantized float64 product.
"""

from __future__ import annotations

import numpy as np

import quant

F32, F16, Q4_1, Q5_1, Q8_1, Q8_K, BF16 = 0, 1, 3, 7, 9, 15, 30
MIN_OFFSET = {Q4_1: (20, 2), Q5_1: (24, 2)}  # type -> (block bytes, offset of the f16 min)


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def weights(t: int, w: np.ndarray) -> np.ndarray:
    """float64 (rows, cols) dequantized weights."""
    per, size = quant.FORMATS[t].block_size, quant.FORMATS[t].type_size
    return quant.dequantize(w, t, (w.shape[0], w.shape[1] // size * per)).astype(np.float64)


def emulated_dot(t: int, w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 (n_tok, cols) -> (reference float64 (n_tok, rows), scale float64 (n_tok, rows) = Σ|w*x|)."""
    wd = weights(t, w)  # (rows, cols)
    if t == F32:
        xa = x.astype(np.float64)
    elif t == F16:
        xa = x.astype(np.float16).astype(np.float64)
    elif t == BF16:
        xa = _bf16(x).astype(np.float64)
    else:
        vt = int(quant.VEC_DOT_TYPE[t])
        blocks = quant.quantize_activations(x, vt)  # (n_tok, act_row_bytes)
        if vt == Q8_1:
            b = blocks.view(quant.FORMATS[Q8_1].dtype)  # (n_tok, cols/32)
            xa = (b["d"].astype(np.float64)[..., None] * b["qs"]).reshape(x.shape)
            bb, mo = MIN_OFFSET[t]
            raw = w.reshape(w.shape[0], -1, bb).copy()
            m = raw[:, :, mo : mo + 2].copy().view(np.float16)[..., 0].astype(np.float64)  # (rows, cols/32)
            raw[:, :, mo : mo + 2] = 0  # d*q alone: the min is dotted with s instead
            wq = weights(t, raw.reshape(w.shape))
            s = b["s"].astype(np.float64)  # (n_tok, cols/32)
            ref = xa @ wq.T + s @ m.T
            scale = np.abs(xa) @ np.abs(wq).T + np.abs(s) @ np.abs(m).T
            return ref, scale
        xa = quant.dequantize(blocks, vt, x.shape).astype(np.float64)
    return xa @ wd.T, np.abs(xa) @ np.abs(wd).T


def activation_error(t: int, x: np.ndarray) -> np.ndarray:
    """float64 (n_tok, cols): a bound on each activation's quantization error as the kernel sees it."""
    ax = np.abs(x.astype(np.float64))
    if t == F32:
        return np.zeros_like(ax)
    if t == F16:
        return ax * 2.0**-11
    if t == BF16:
        return ax * 2.0**-8
    per = 256 if int(quant.VEC_DOT_TYPE[t]) == Q8_K else 32
    amax = ax.reshape(x.shape[0], -1, per).max(axis=2, keepdims=True)  # (n_tok, blocks, 1)
    # half a step of amax/127, plus the f16 rounding of the stored scale over |q| <= 127 (Q8_0/Q8_1)
    step = amax / 127 * (0.5 + (0 if per == 256 else 127 * 2.0**-11)) * (1 + 1e-6)
    bound = np.broadcast_to(step, (x.shape[0], x.shape[1] // per, per)).reshape(x.shape)
    if t in MIN_OFFSET:
        bound = bound + amax.repeat(per, axis=2).reshape(x.shape) * 2.0**-10  # f16 rounding of s
    return bound
