"""Activation quantizers: float32 rows -> the 8-bit blocks llama.cpp's CPU backend dots against.

Q8_0 and Q8_1 follow ggml's x86 AVX path (`id = 127/amax`, round half to even, d stored as f16);
Q8_K follows the reference quantizer (largest-|x| element becomes -127, d kept in float32).
Serial on purpose: it is a small share of a prefill call, and a parallel region here would cost each small
decode call another thread wake-up. `quantize_q8_k_interleaved` is Q8_K for the Q4_K and Q6_K prompt
kernels (simd_kernels.kquants_prompt): the same values, each super-block's dwords reordered, and the scales
and group sums laid out token-minor. `quantize_q8_0_interleaved` and `quantize_q8_1_interleaved` are Q8_0 and
Q8_1 for the 32-element formats' prompt kernels (simd_kernels.block32_prompt): each 256 elements' dwords transposed.
"""

from __future__ import annotations

import numpy as np

from .half import round_f16
from .jit import njit

QK = 32  # elements per Q8_0 / Q8_1 block
QK_K = 256  # elements per Q8_K super-block
KGROUP = 16  # elements per Q8_K bsums group


@njit(inline="always")
def _quantize_block_q8(x, o, q):
    """Quantize x[o:o+32] into q[o:o+32]; returns (float32 d before f16 rounding, int sum of q)."""
    amax = np.float32(0.0)
    for i in range(QK):
        amax = max(amax, abs(x[o + i]))
    d = amax / np.float32(127.0)
    inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    total = 0
    for i in range(QK):
        v = np.int32(np.rint(x[o + i] * inv))
        q[o + i] = v
        total += v
    return d, total


@njit(cache=True, nogil=True)
def quantize_row_q8_0(x, q, d, qsum):
    """x: f32 (cols,) -> q: int8 (cols,), d: f32 (cols/32,) f16-rounded scales, qsum: int32 (cols/32,)."""
    for b in range(x.shape[0] // QK):
        scale, total = _quantize_block_q8(x, b * QK, q)
        d[b] = round_f16(scale)
        qsum[b] = total


@njit(cache=True, nogil=True)
def quantize_row_q8_1(x, q, d, s):
    """x: f32 (cols,) -> q: int8 (cols,), d: f32 (cols/32,), s: f32 (cols/32,) = f16(d * sum(q))."""
    for b in range(x.shape[0] // QK):
        scale, total = _quantize_block_q8(x, b * QK, q)
        d[b] = round_f16(scale)
        s[b] = round_f16(scale * np.float32(total))


@njit(cache=True, nogil=True)
def quantize_row_q8_k(x, q, d, bsums):
    """x: f32 (cols,) -> q: int8 (cols,), d: f32 (cols/256,), bsums: int32 (cols/16,) group sums of q.

    Written so that LLVM vectorizes each loop: the largest |x| as the max of its bit patterns (|x| >= 0 orders as
    its bits do), then the first element with that |x| (the reference's first one on ties)."""
    bits = x.view(np.int32)  # (cols,)
    for b in range(x.shape[0] // QK_K):
        o = b * QK_K
        top = np.int32(0)
        for i in range(QK_K):
            top = max(top, bits[o + i] & np.int32(0x7FFFFFFF))
        if top == 0:
            d[b] = 0.0
            for i in range(QK_K):
                q[o + i] = 0
        else:
            i = 0
            while bits[o + i] & np.int32(0x7FFFFFFF) != top:
                i += 1
            largest = x[o + i]
            iscale = np.float32(-127.0) / largest
            for i in range(QK_K):
                q[o + i] = min(np.float32(127.0), np.rint(iscale * x[o + i]))
            # An infinite |x| (a corrupt weight's overflow) makes iscale -+0, where ggml's 1/iscale is -+inf, i.e.
            # -largest; Numba's checked division would raise ZeroDivisionError (the engine reports the NaN logits).
            d[b] = np.float32(1.0) / iscale if iscale != 0 else -largest
        for g in range(QK_K // KGROUP):
            total = np.int32(0)
            for i in range(KGROUP):
                total += np.int32(q[o + g * KGROUP + i])
            bsums[b * (QK_K // KGROUP) + g] = total


@njit(cache=True, nogil=True)
def quantize_q8_0(x):
    """x: f32 (n_tok, cols) -> (q int8 (n_tok, cols), d f32 (n_tok, cols/32), qsum int32 (n_tok, cols/32))."""
    n_tok, cols = x.shape
    q = np.empty((n_tok, cols), np.int8)  # (n_tok, cols)
    d = np.empty((n_tok, cols // QK), np.float32)  # (n_tok, cols/32)
    qsum = np.empty((n_tok, cols // QK), np.int32)  # (n_tok, cols/32)
    for t in range(n_tok):
        quantize_row_q8_0(x[t], q[t], d[t], qsum[t])
    return q, d, qsum


@njit(cache=True, nogil=True)
def quantize_q8_1(x):
    """x: f32 (n_tok, cols) -> (q int8 (n_tok, cols), d f32 (n_tok, cols/32), s f32 (n_tok, cols/32))."""
    n_tok, cols = x.shape
    q = np.empty((n_tok, cols), np.int8)  # (n_tok, cols)
    d = np.empty((n_tok, cols // QK), np.float32)  # (n_tok, cols/32)
    s = np.empty((n_tok, cols // QK), np.float32)  # (n_tok, cols/32)
    for t in range(n_tok):
        quantize_row_q8_1(x[t], q[t], d[t], s[t])
    return q, d, s


@njit(cache=True, nogil=True)
def quantize_q8_k(x):
    """x: f32 (n_tok, cols) -> (q int8 (n_tok, cols), d f32 (n_tok, cols/256), bsums int32 (n_tok, cols/16))."""
    n_tok, cols = x.shape
    q = np.empty((n_tok, cols), np.int8)  # (n_tok, cols)
    d = np.empty((n_tok, cols // QK_K), np.float32)  # (n_tok, cols/256)
    bsums = np.empty((n_tok, cols // KGROUP), np.int32)  # (n_tok, cols/16)
    for t in range(n_tok):
        quantize_row_q8_k(x[t], q[t], d[t], bsums[t])
    return q, d, bsums


def _interleaved_dwords(piece) -> np.ndarray:
    """A super-block's 64 dwords (4 elements each) in the order of simd_kernels.kquants_prompt's registers: register (m, h)
    sits at position 2m + h (so registers (m, 0) and (m, 1) make one 64-byte load), and its position's 4L + i holds
    dword m (+4 for 128-bit lane L) of the 32-element piece piece(i, h), for m, i = 0..3 and h = 0, 1: each lane of
    register (m, h) holds four elements of piece piece(i, h)."""
    out = np.empty(64, np.int64)
    for m in range(4):
        for h in range(2):
            for lane in range(2):
                for i in range(4):
                    out[8 * (2 * m + h) + 4 * lane + i] = 8 * piece(i, h) + 4 * lane + m
    return out


# (64,) int64: the natural dword of each interleaved position. Q4_K: h the low (even pieces) or high (odd) nibbles;
# Q6_K: h the 128-element half.
Q4K_DWORDS = _interleaved_dwords(lambda i, h: 2 * i + h)
Q6K_DWORDS = _interleaved_dwords(lambda i, h: 4 * h + i)


@njit(cache=True, nogil=True)
def empty_64(n_tok, cols):
    """An uninitialized int8 (n_tok, cols) array at a 64-byte boundary (Numba's own are at 32): a 64-byte load
    from one crosses no cache line when cols is a multiple of 64 (the prompt kernels' zmm loads; one that does
    costs two, a measurable share of a Q4_K or Q6_K prompt kernel: docs/measurements.md)."""
    buf = np.empty(n_tok * cols + 64, np.int8)
    start = (64 - buf.ctypes.data % 64) % 64
    return buf[start : start + n_tok * cols].reshape((n_tok, cols))


@njit(cache=True, nogil=True)
def quantize_q8_k_interleaved(x, order, group):
    """x: f32 (n_tok, cols) -> quantize_q8_k's activations laid out for a simd_kernels.kquants_prompt kernel:
    q int8 (n_tok, cols), each super-block's dwords in `order` (Q4K_DWORDS, Q6K_DWORDS); d f32 (cols/256, n_tok)
    the scales; sums int16 (cols/256, 128/group, n_tok, 2): sums[b, k, t] = the sums of q over the `group`-element
    groups 2k and 2k+1 of super-block b of token t (|sum| <= 32*127)."""
    n_tok, cols = x.shape
    nb = cols // QK_K
    per = QK_K // group // 2  # pairs of groups a super-block
    q = empty_64(n_tok, cols)  # (n_tok, cols)
    d = np.empty((nb, n_tok), np.float32)  # (cols/256, n_tok)
    sums = np.empty((nb, per, n_tok, 2), np.int16)  # (cols/256, pairs, n_tok, 2)
    row = np.empty(cols, np.int8)  # (cols,) one token's natural-order quants
    rd = np.empty(nb, np.float32)  # (cols/256,)
    bsums = np.empty(cols // KGROUP, np.int32)  # (cols/16,)
    k = group // KGROUP  # bsums a group
    for t in range(n_tok):
        quantize_row_q8_k(x[t], row, rd, bsums)
        src = row.view(np.int32)  # (cols/4,)
        dst = q[t].view(np.int32)  # (cols/4,)
        for b in range(nb):
            for p in range(64):
                dst[64 * b + p] = src[64 * b + order[p]]
            d[b, t] = rd[b]
            for g in range(2 * per):
                total = np.int32(0)
                for j in range(k):
                    total += bsums[16 * b + k * g + j]
                sums[b, g // 2, t, g % 2] = np.int16(total)
    return q, d, sums


LGROUP = 8  # 32-element blocks per lane group of simd_kernels.block32_prompt: lane j of a register is block j


@njit(inline="always")
def _interleave_groups(row, dst):
    """row int8 (cols,) natural order -> dst int8 (cols8,), cols8 = cols rounded up to 256: each 256-element group's
    dwords transposed 8 x 8 (position 8k + j holds dword k of block j, its natural dword 8j + k), zeros past cols.

    A row's last group of at most 4 blocks (`rem`) is laid out for block32_prompt's half group instead: its first four
    registers hold dword m of blocks 0..3, then dword m + 4 of blocks 0..3 (position 8m + j and 8m + 4 + j, j < 4),
    and its last four are zeros."""
    src = row.view(np.int32)  # (cols/4,)
    out = dst.view(np.int32)  # (cols8/4,)
    n = src.shape[0]
    for g in range(out.shape[0] // 64):
        rem = n // 8 - LGROUP * g  # blocks of the row from this group's first on
        if rem <= LGROUP // 2:
            for m in range(LGROUP // 2):
                for j in range(LGROUP // 2):
                    i = 64 * g + 8 * j + m
                    out[64 * g + 8 * m + j] = src[i] if j < rem else 0
                    out[64 * g + 8 * m + 4 + j] = src[i + 4] if j < rem else 0
            for k in range(32):
                out[64 * g + 32 + k] = 0
            continue
        for k in range(LGROUP):
            for j in range(LGROUP):
                i = 64 * g + 8 * j + k
                out[64 * g + 8 * k + j] = src[i] if i < n else 0


@njit(inline="always")
def _grouped(x, quantize_row, extra):
    """x f32 (n_tok, cols) -> (q int8 (n_tok, cols8), d f32 (n_tok, nb8)) laid out for simd_kernels.block32_prompt, with
    cols8 = cols rounded up to 256 and nb8 = cols8/32: each 256-element group's dwords transposed 8 x 8 (lane j of a
    register is block j; a last group of at most 4 blocks as _interleave_groups lays it out), zeros past cols; d the
    blocks' scales (0 past). quantize_row (quantize_row_q8_0 or _q8_1) fills extra (n_tok, nb8), zeros, with its
    third output (0 past)."""
    n_tok, cols = x.shape
    nb = cols // QK
    q = np.empty((n_tok, extra.shape[1] * QK), np.int8)  # (n_tok, cols8)
    d = np.zeros(extra.shape, np.float32)  # (n_tok, nb8)
    row = np.empty(cols, np.int8)  # (cols,) one token's natural-order quants
    for t in range(n_tok):
        quantize_row(x[t], row, d[t, :nb], extra[t, :nb])
        _interleave_groups(row, q[t])
    return q, d


@njit(cache=True, nogil=True)
def quantize_q8_0_interleaved(x, shift):
    """x: f32 (n_tok, cols) -> quantize_q8_0's activations laid out for simd_kernels.block32_prompt's Q8_0, Q5_0, Q4_0
    kernels (_grouped): q int8 (n_tok, cols8), d f32 (n_tok, nb8); bias int32 (n_tok, nb8) each block's
    -(Σq << shift), the offset 1 << shift of the kernel's unsigned weights times the block's sum (0 past)."""
    n_tok, cols = x.shape
    bias = np.zeros((n_tok, -(-cols // QK_K) * (QK_K // QK)), np.int32)  # (n_tok, nb8)
    q, d = _grouped(x, quantize_row_q8_0, bias)
    for t in range(n_tok):
        for b in range(cols // QK):
            bias[t, b] = -(bias[t, b] << shift)
    return q, d, bias


@njit(cache=True, nogil=True)
def quantize_q8_1_interleaved(x):
    """x: f32 (n_tok, cols) -> quantize_q8_1's activations laid out for simd_kernels.block32_prompt's Q4_1 and Q5_1 kernels
    (_grouped): q int8 (n_tok, cols8), d f32 (n_tok, nb8), s f32 (n_tok, nb8) = f16(d * Σq) (0 past)."""
    n_tok, cols = x.shape
    s = np.zeros((n_tok, -(-cols // QK_K) * (QK_K // QK)), np.float32)  # (n_tok, nb8)
    q, d = _grouped(x, quantize_row_q8_1, s)
    return q, d, s
