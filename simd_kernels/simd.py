"""The fused kernel every block format's matmul is made of: `fused_kernel` puts one loop nest over tokens and rows
around a format's row dots: rowdot<n>(w_row, xq, xd, xs, t) dots one whole weight row against the Q8 activations of
n = 1-4 or 8 tokens, decoding each weight block once. The row dots are the format's own, Numba intrinsics built from
simd_kernels.ir: the 32-element formats' in simd_kernels.block32_prompt, the K-quants' in kquants_rowdots, IQ4's in
iquants; plain-Numba ones go through `scalar_rowdots`.
"""

from __future__ import annotations

from types import FunctionType

import numpy as np
from numba import prange

from .jit import njit


# The token counts a row dot is made for: a call's tokens go 8 (or 4) per pass over a row, the last 1-3 in one more.
# Eight decode each weight block once per 8 tokens, which is faster than two passes of 4 (docs/measurements.md).
# A format with row dots for 1-4 tokens
# only takes 8 as two passes of 4 (_rowdot8_of_4). A format with a row dot for every count 1-8 (EVERY_COUNT) takes
# the last 1-7 in one pass (_rowjob_every): a verified draft of 4-6 tokens is one pass over the weights, not two.
ROW_TOKENS = (1, 2, 3, 4, 8)
EVERY_COUNT = tuple(range(1, 9))


# ---- the fused kernel: one loop nest over tokens and rows, instantiated per format ----

TOKEN_CHUNK = 64  # tokens per pass over the weights: (64, cols) int8 activations stay in L2


def _fused_template(w, x, out):
    xq, xd, xs = QUANTIZE(x)  # noqa: F821 (bound by fused_kernel) int8 (n_tok, cols), block scales, sums
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for r in prange(w.shape[0]):
            ROWJOB(w[r], xq, xd, xs, t0, t1, out, r)  # noqa: F821


def _multi_template(w0, w1, w2, x, out0, out1, out2):
    xq, xd, xs = QUANTIZE(x)  # noqa: F821 (bound by fused_kernel) x quantized once for the three weights
    n0 = w0.shape[0]
    n01 = n0 + w1.shape[0]
    for t0 in range(0, x.shape[0], TOKEN_CHUNK):
        t1 = min(t0 + TOKEN_CHUNK, x.shape[0])
        for j in prange(n01 + w2.shape[0]):  # the three weights' rows as one range, evenly split over threads
            # the row's weight and output chosen first and the row job written once: three inlined copies of it
            # tripled the kernel's code and its compile time (docs/measurements.md)
            if j < n0:
                w, out, first = w0, out0, 0
            elif j < n01:
                w, out, first = w1, out1, n0
            else:
                w, out, first = w2, out2, n01
            ROWJOB(w[j - first], xq, xd, xs, t0, t1, out, j - first)  # noqa: F821


def _rowjob(row, xq, xd, xs, t0, t1, out, r):
    # out[t0:t1, r] = one weight row against tokens t0..t1-1: 8 (or 4) tokens per pass over the row
    t = t0
    while t + 8 <= t1:
        (
            out[t, r],
            out[t + 1, r],
            out[t + 2, r],
            out[t + 3, r],
            out[t + 4, r],
            out[t + 5, r],
            out[t + 6, r],
            out[t + 7, r],
        ) = ROWDOT8(row, xq, xd, xs, t)  # noqa: F821
        t += 8
    if t + 4 <= t1:
        out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = ROWDOT4(row, xq, xd, xs, t)  # noqa: F821
        t += 4
    left = t1 - t  # the last 1-3 tokens: one more pass over the row, not one per token
    if left == 3:
        out[t, r], out[t + 1, r], out[t + 2, r] = ROWDOT3(row, xq, xd, xs, t)  # noqa: F821
    elif left == 2:
        out[t, r], out[t + 1, r] = ROWDOT2(row, xq, xd, xs, t)  # noqa: F821
    elif left == 1:
        (out[t, r],) = ROWDOT1(row, xq, xd, xs, t)  # noqa: F821


def _rowjob_every(row, xq, xd, xs, t0, t1, out, r):
    # out[t0:t1, r] = one weight row against tokens t0..t1-1: as _rowjob takes them (ROWJOB_SHORT: 8 a pass, the
    # last 1-4 in one more), but for a last 5-7, which take one pass of their own
    left = (t1 - t0) % 8
    if left < 5:
        ROWJOB_SHORT(row, xq, xd, xs, t0, t1, out, r)  # noqa: F821 (bound by fused_kernel)
        return
    t = t1 - left
    ROWJOB_SHORT(row, xq, xd, xs, t0, t, out, r)  # noqa: F821
    if left == 7:
        got = ROWDOT7(row, xq, xd, xs, t)  # noqa: F821
        out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = got[0], got[1], got[2], got[3]
        out[t + 4, r], out[t + 5, r], out[t + 6, r] = got[4], got[5], got[6]
    elif left == 6:
        got = ROWDOT6(row, xq, xd, xs, t)  # noqa: F821
        out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = got[0], got[1], got[2], got[3]
        out[t + 4, r], out[t + 5, r] = got[4], got[5]
    else:
        (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r], out[t + 4, r]) = ROWDOT5(row, xq, xd, xs, t)  # noqa: F821


def _rowdot8_of_4(row, xq, xd, xs, t):
    # a format without a rowdot8 of its own: 8 tokens as two 4-token passes over the row
    return ROWDOT4(row, xq, xd, xs, t) + ROWDOT4(row, xq, xd, xs, t + 4)  # noqa: F821 (bound by fused_kernel)


def _experts_template(w, rows, x, experts, xrow, out):
    xq, xd, xs = QUANTIZE(x)  # noqa: F821 (bound by fused_kernel)
    for j in prange(experts.shape[0] * rows):  # every (pair, row): one flat loop, evenly split over threads
        p = j // rows
        r = j - p * rows
        (out[p, r],) = ROWDOT1(w[experts[p] * rows + r], xq, xd, xs, xrow[p])  # noqa: F821


def _grouped_template(w0, w1, rows, x, experts, starts, out0, out1):
    xq, xd, xs = QUANTIZE(x)  # noqa: F821 (bound by fused_kernel) x quantized once for both weights
    per_w = experts.shape[0] * rows
    n = per_w * 2 if w1.shape[0] > 0 else per_w
    for i in prange(n):  # every (weight, group, row): one flat loop, evenly split over threads
        j = np.int64(i)  # a parfor's index may be unsigned: int64 - uint64 would be a float
        if j < per_w:
            w, out, k = w0, out0, j
        else:
            w, out, k = w1, out1, j - per_w
        g = k // rows
        r = k - g * rows
        ROWJOB(w[experts[g] * rows + r], xq, xd, xs, starts[g], starts[g + 1], out, r)  # noqa: F821


EXPERTS = {}  # MUL kernel name -> its selected-experts kernel (see fused_kernel)
GROUPED = {}  # MUL kernel name -> its kernel of the experts' token groups (see fused_kernel)
MULTI = {}  # MUL kernel name -> its kernel of three weights that share an input (see fused_kernel)


def fused_kernel(name, doc, quantize, rowdots, module):
    """The matmul kernel name(w, x, out) of these row dots (_fused_template); its siblings of the same row dots go
    in EXPERTS[name], GROUPED[name] and MULTI[name].

    w: uint8 (rows, row_bytes) raw blocks; x: float32 (n_tok, cols); out: float32 (n_tok, rows).
    quantize(x) -> (xq, xd, xs), the activations in the format's Q8 flavour; rowdots = (rowdot1, .., rowdot4[,
    rowdot8]), rowdot<n>(w_row, xq, xd, xs, t) -> a tuple of n float32, the row against tokens t..t+n-1 (decoding
    each block once for the n), each token summed exactly as rowdot1 sums it. Without a rowdot8, 8 tokens take two
    rowdot4 passes (_rowdot8_of_4).

    EXPERTS[name](w, rows, x, experts, xrow, out): w uint8 (n_expert * rows, row_bytes), the stacked experts'
    raw rows; x float32 (n_x, cols); experts, xrow int64 (n_pair,); out float32 (n_pair, rows) with
    out[p] = expert experts[p]'s (rows, cols) matrix . x[xrow[p]]. One call for all the experts a batch chose
    (x quantized once); every product is rowdot1's, as the matmul kernel computes each token (rowdot2..4 sum
    each of their tokens exactly as rowdot1 does), so a pair's result is the matmul kernel's for that token.

    GROUPED[name](w0, w1, rows, x, experts, starts, out0, out1): w0, w1 stacked experts as in EXPERTS (w1 may have 0
    rows: then out1 is not written); x float32 (n_x, cols) whose rows starts[g]..starts[g + 1] - 1 go to expert
    experts[g] (int64 (n_groups,), (n_groups + 1,)); out_i float32 (n_x, rows) with out_i[t] = that expert's slice
    of w_i . x[t]. A prompt's tokens sorted by their experts: each expert's rows are decoded once per 8 of its
    tokens (the matmul kernel's row job), x quantized once for a gate and an up, and all of them in one parallel
    loop; every token computes as rowdot1 computes it, so as in EXPERTS and the matmul kernel.

    MULTI[name](w0, w1, w2, x, out0, out1, out2): out_i = x @ w_i.T for three weights of the same cols (q, k and
    v; a gate and an up with a 0-row third), x quantized once and all their rows in one parallel loop: one call
    and one wake-up of the threads instead of three. Every row is computed as the matmul kernel computes it.

    The row dots are bound as globals of copies of the templates, not as closure cells: Numba's cache key
    pickles closure cells and an intrinsic pickles with a per-process id, so a closure would recompile in
    every process. The qualname gives each kernel its own cache file; its code stays in this file, so
    _cache_guard's check of this package's sources covers it.
    """
    binds = {"QUANTIZE": quantize, **rowjob_binds(rowdots, f"rowjob_{name}")}
    EXPERTS[name] = kernel_copy(_experts_template, name.replace("mul_", "experts_", 1), binds, module)
    GROUPED[name] = kernel_copy(_grouped_template, name.replace("mul_", "grouped_", 1), binds, module)
    MULTI[name] = kernel_copy(_multi_template, name.replace("mul_", "multi_", 1), binds, module)
    return kernel_copy(_fused_template, name, binds, module, doc)


def rowjob_binds(rowdots, name) -> dict:
    """ROWDOT<n> and ROWJOB (named name) of row dots for ROW_TOKENS' counts, the first four of them, or EVERY_COUNT
    (then also ROWJOB_SHORT, the copy of _rowjob that _rowjob_every hands all but a last 5-7 tokens)."""
    counts = EVERY_COUNT if len(rowdots) == len(EVERY_COUNT) else ROW_TOKENS
    binds = {f"ROWDOT{n}": rowdot for n, rowdot in zip(counts, rowdots)}
    if len(rowdots) < len(ROW_TOKENS):
        binds["ROWDOT8"] = _inline_copy(_rowdot8_of_4, name.replace("rowjob_", "rowdot8_of_4_", 1), binds)
    if counts is EVERY_COUNT:
        binds["ROWJOB_SHORT"] = _inline_copy(_rowjob, name.replace("rowjob_", "rowjob_short_", 1), binds)
    binds["ROWJOB"] = _inline_copy(_rowjob_every if counts is EVERY_COUNT else _rowjob, name, binds)
    return binds


def _copy(template, name, binds):
    code = template.__code__.replace(co_name=name, co_qualname=name)
    fn = FunctionType(code, {**globals(), **binds}, name)
    fn.__qualname__ = name
    return fn


def _inline_copy(template, name, binds):
    return njit(inline="always")(_copy(template, name, binds))


def kernel_copy(template, name, binds, module, doc=None):
    """@njit(cache=True, nogil=True, parallel=True) of a copy of template named name, with binds as its globals."""
    fn = _copy(template, name, binds)
    fn.__module__, fn.__doc__ = module, doc
    return njit(cache=True, nogil=True, parallel=True)(fn)


def scalar_rowdots(inline_dot):
    """(rowdot1, .., rowdot4) for fused_kernel from a plain-Numba row dot(w_row, xq, xd, xs, t) -> float32.

    The row dots call one compiled copy of the dot: inlined into each of the kernel's ten call sites it took minutes
    to compile (docs/measurements.md), for no speed, as a call per row and token is small beside its super-blocks."""

    @njit
    def dot(row, xq, xd, xs, t):
        return inline_dot(row, xq, xd, xs, t)

    @njit(inline="always")
    def rowdot1(row, xq, xd, xs, t):
        return (dot(row, xq, xd, xs, t),)

    @njit(inline="always")
    def rowdot2(row, xq, xd, xs, t):
        return (dot(row, xq, xd, xs, t), dot(row, xq, xd, xs, t + 1))

    @njit(inline="always")
    def rowdot3(row, xq, xd, xs, t):
        return (dot(row, xq, xd, xs, t), dot(row, xq, xd, xs, t + 1), dot(row, xq, xd, xs, t + 2))

    @njit(inline="always")
    def rowdot4(row, xq, xd, xs, t):
        return (
            dot(row, xq, xd, xs, t),
            dot(row, xq, xd, xs, t + 1),
            dot(row, xq, xd, xs, t + 2),
            dot(row, xq, xd, xs, t + 3),
        )

    return rowdot1, rowdot2, rowdot3, rowdot4
