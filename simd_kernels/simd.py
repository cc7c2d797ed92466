"""LLVM vector code for the hot loops, as Numba intrinsics (Numba itself widens int8 math to int64 lanes).

Written in generic LLVM IR, so LLVM picks AVX-512, AVX2 or SSE as the host has; the int8 dots alone use x86's
integer dot instructions (VNNI, AVX2) where the host has them, summing exactly what the generic code sums.
Here: the shared pieces of the formats' row dots (block loads, nibble and fifth-bit decoding, f16 scales read as
LLVM `half`, one vcvtph2ps with F16C; prefetch; the activations' pointers) and `fused_kernel`, which makes each
format's matmul kernel from one loop nest over tokens and rows around its row dots: rowdot<n>(w_row, xq, xd, xs, t)
dots one whole weight row against the Q8 activations of n = 1-4 or 8 tokens, decoding each weight block once. The
row dots are the format's own: the 32-element formats' in simd_kernels.block32_prompt, the K-quants' in kquants_rowdots, IQ4's in
iquants.
"""
from __future__ import annotations

import os
from types import FunctionType

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import njit

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _data(context, builder, aryty, ary):
    return context.make_array(aryty)(context, builder, ary).data


def _byte_ptr(builder, base, offset):
    return builder.gep(builder.bitcast(base, _I8.as_pointer()), [offset])


def _load_vec(builder, base, offset, n):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), ir.VectorType(_I8, n).as_pointer())
    return builder.load(ptr, align=1)


def _u32_at(builder, base, offset):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), _I32.as_pointer())
    return builder.load(ptr, align=1)


def _load_half(builder, base, offset):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), _I16.as_pointer())
    return builder.fpext(builder.bitcast(builder.load(ptr, align=1), ir.HalfType()), _F32)


# Bytes ahead of the block being decoded that a row dot asks the cache to fetch (prefetcht0). A decode step streams
# each weight from memory once, and the hardware prefetcher alone left the 1B Q4_K_M's linears at 10 GB/s where a
# plain sum reads 34. Measured on all its linears in turn (2 threads, 2 vCPUs of a Xeon with AVX-512): none 68 ms,
# 512 B ahead 52, 1024 42, 2048 37, 4096 37.5, 8192 39; the 1B Q8_0 66 -> 58 ms at 2048 and 4096.
PREFETCH_AHEAD = 2048


def _prefetch(builder, base, offset, nbytes):
    """Hint the cache lines of nbytes from offset + PREFETCH_AHEAD of base (prefetch never faults past the end)."""
    fnty = ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    for k in range(0, nbytes, 64):
        ptr = _byte_ptr(builder, base, builder.add(offset, _c(PREFETCH_AHEAD + k)))
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _const_vec(elem, values):
    return ir.Constant(ir.VectorType(elem, len(values)), list(values))


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, _const_vec(_I32, idx))


def _splat(builder, value, n):
    vt = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return _shuffle(builder, one, one, [0] * n)


def _host_features() -> frozenset:
    """The x86 features the row dots may use. LOCALRT_SIMD_X86 (a comma list; empty: none) narrows them, for
    tests that compare the paths: set it only with a private NUMBA_CACHE_DIR, as Numba's cache key cannot see it."""
    try:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features()
        have = frozenset(k for k in ("avx2", "avx512vnni", "avx512vl", "avx512bw") if features.get(k))
    except Exception:  # noqa: BLE001 - not x86, or llvmlite cannot tell: the generic code below
        return frozenset()
    narrowed = os.environ.get("LOCALRT_SIMD_X86")
    return have if narrowed is None else have & {f.strip() for f in narrowed.split(",")}


# Numba compiles (and caches) for the host CPU, so the kernels may use its integer dot instructions.
_X86 = _host_features()
_V16S = ir.VectorType(_I16, 16)
_V8I = ir.VectorType(_I32, 8)


def _intrinsic(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _vnni(builder, acc, a, b):
    """acc + Σ of 4 unsigned a bytes x 4 signed b bytes per i32 lane (lane i: bytes 4i..4i+3), one vpdpbusd."""
    args = [acc, builder.bitcast(a, _V8I), builder.bitcast(b, _V8I)]
    return _intrinsic(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I, args)


def _nibbles(builder, base, offset):
    """16 bytes -> <32 x i8>: low nibbles (elements 0..15) then high nibbles (16..31)."""
    v = _load_vec(builder, base, offset, 16)
    lo = builder.and_(v, _const_vec(_I8, [15] * 16))
    hi = builder.lshr(v, _const_vec(_I8, [4] * 16))
    return _shuffle(builder, lo, hi, range(32))


def _fifth_bits(builder, base, offset):
    """The little-endian uint32 qh at offset -> <32 x i8> with 16 where bit i is set.

    With AVX-512 BW/VL, qh is the select's <32 x i1> mask itself (a kmovd and one zero-masked byte move); else
    each byte of qh is spread over the lanes of its 8 bits and tested (a shuffle, an and, a compare)."""
    if {"avx512bw", "avx512vl"} <= _X86:
        is_set = builder.bitcast(_u32_at(builder, base, offset), ir.VectorType(ir.IntType(1), 32))  # bit i -> lane i
    else:
        qh = _load_vec(builder, base, offset, 4)
        spread = _shuffle(builder, qh, qh, [i // 8 for i in range(32)])  # lane i holds byte i // 8
        bit = builder.and_(spread, _const_vec(_I8, [1 << (i % 8) for i in range(32)]))
        is_set = builder.icmp_unsigned("!=", bit, _const_vec(_I8, [0] * 32))
    return builder.select(is_set, _const_vec(_I8, [16] * 32), _const_vec(_I8, [0] * 32))


def _c(v):
    return ir.Constant(ir.IntType(64), v)


class _Acts:
    """Pointers into one call's activation arrays (2-D, C-contiguous: one row per token)."""

    def __init__(self, context, builder, sig, args, first):
        self.builder = builder
        self.rows = []
        for ty, val in zip(sig.args[first:first + 3], args[first:first + 3]):
            ary = context.make_array(ty)(context, builder, val)
            self.rows.append((ary.data, cgutils.unpack_tuple(builder, ary.strides, 2)[0]))
        xd = context.make_array(sig.args[first + 1])(context, builder, args[first + 1])
        self.n_blocks = cgutils.unpack_tuple(builder, xd.shape, 2)[1]

    def row(self, which, t):
        """Element pointer to row t of activation array which (0: quants, 1: scales, 2: sums)."""
        data, stride = self.rows[which]
        b = self.builder
        return b.bitcast(b.gep(b.bitcast(data, _I8.as_pointer()), [b.mul(t, stride)]), data.type)


def _token_indices(builder, t0, n_tok):
    t0 = builder.sext(t0, ir.IntType(64)) if t0.type.width < 64 else t0
    return [builder.add(t0, _c(k)) for k in range(n_tok)]


def _reduce_f(builder, vec, n):
    total = builder.extract_element(vec, ir.Constant(_I32, 0))
    for i in range(1, n):
        total = builder.fadd(total, builder.extract_element(vec, ir.Constant(_I32, i)))
    return total


# The token counts a row dot is made for: a call's tokens go 8 (or 4) per pass over a row, the last 1-3 in one more.
# Eight decode each weight block once per 8 tokens; measured (4096x2048, 2 threads, VNNI, best of 3 interleaved) it
# lifts Q4_K 95 -> 110 GMAC/s at 8 tokens, Q6_K 86 -> 96, IQ4_XS 61 -> 75. A format with row dots for 1-4 tokens
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
            # tripled the kernel's code and its compile (31 s against 10 s for Q4_1's)
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
        (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r], out[t + 4, r], out[t + 5, r], out[t + 6, r],
         out[t + 7, r]) = ROWDOT8(row, xq, xd, xs, t)  # noqa: F821
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
        (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r], out[t + 4, r], out[t + 5, r],
         out[t + 6, r]) = ROWDOT7(row, xq, xd, xs, t)  # noqa: F821
    elif left == 6:
        (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r], out[t + 4, r],
         out[t + 5, r]) = ROWDOT6(row, xq, xd, xs, t)  # noqa: F821
    else:
        (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r],
         out[t + 4, r]) = ROWDOT5(row, xq, xd, xs, t)  # noqa: F821


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
    EXPERTS[name] = _kernel_copy(_experts_template, name.replace("mul_", "experts_", 1), binds, module)
    GROUPED[name] = _kernel_copy(_grouped_template, name.replace("mul_", "grouped_", 1), binds, module)
    MULTI[name] = _kernel_copy(_multi_template, name.replace("mul_", "multi_", 1), binds, module)
    return _kernel_copy(_fused_template, name, binds, module, doc)


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


def _kernel_copy(template, name, binds, module, doc=None):
    """@njit(cache=True, nogil=True, parallel=True) of a copy of template named name, with binds as its globals."""
    fn = _copy(template, name, binds)
    fn.__module__, fn.__doc__ = module, doc
    return njit(cache=True, nogil=True, parallel=True)(fn)


def scalar_rowdots(inline_dot):
    """(rowdot1, .., rowdot4) for fused_kernel from a plain-Numba row dot(w_row, xq, xd, xs, t) -> float32.

    The row dots call one compiled copy of the dot: inlined into each of the kernel's ten call sites it took minutes
    to compile (Q2_K: 191 s cold), for no speed, as a call per row and token is small beside its super-blocks."""

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
        return (dot(row, xq, xd, xs, t), dot(row, xq, xd, xs, t + 1), dot(row, xq, xd, xs, t + 2),
                dot(row, xq, xd, xs, t + 3))

    return rowdot1, rowdot2, rowdot3, rowdot4
