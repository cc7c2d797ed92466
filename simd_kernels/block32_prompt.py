"""Prompt kernels for the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4: a prompt piece's tokens against
the weights, activations laid out for them.

`prefill_<fmt>(w, xq, xd, sums, out)` takes `PREFILL_<FMT>[0](x)`'s activations (actquant's Q8_0, or Q8_1 for the
formats with a min, each 256-element group's dwords transposed 8 x 8). Within a call, a token's result does not
depend on the other tokens, and the per-row kernels of block32 (decode, drafts) are made of the same row dots
(`ROWDOTS`, with `QUANTIZE`'s activations), so a token computes alike on either path.

Why this shape: scaling each block's dot on its own, as ggml's vec_dot does (and our per-row kernels did), costs a
convert, a broadcast scale and an FMA per 32 products and token, and Q8_0 an xor of the activations. Here eight blocks'
quants are transposed in registers (`_transpose8`: register k holds dword k of blocks 0..7) so that lane j of a vpdpbusd
chain over the eight registers sums block j: a group of 8 blocks costs a token 8 vpdpbusd, one convert and one FMA
against the 8 blocks' scales. The weight is made unsigned once per row (Q8_0: q + 128, Q4_0: q + 8, Q5_0: q + 16,
MXFP4: its table's doubled E2M1 value + 16; the formats with a min are unsigned already) and the offset taken out per
block as offset * Σx (exact, in integers). Tokens go 16 at a time through all of a call's rows, so their activations
stay in L1 (faster than 8 a pass for most formats: docs/measurements.md).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .actquant import LGROUP, quantize_q8_0_interleaved, quantize_q8_1_interleaved
from .dequant import KVALUES_MXFP4
from .jit import njit
from .ir import (
    I8,
    I16,
    I32,
    V8F,
    V8I,
    X86,
    byte_ptr,
    call_intrinsic,
    const_vec,
    fifth_bits,
    fma,
    i64,
    lane_dots,
    load_vec,
    nibbles,
    prefetch,
    reduce_f,
    shuffle,
    splat,
    transpose4,
)
from .prefill import prefill_kernel, prefill_rowdots
from .simd import EVERY_COUNT


class _Format:
    """A 32-element format: block bytes, where its f16 d (and min) sit, the decode of a block's quants made
    unsigned (<32 x i8>, natural order) and the offset they carry (a power of two, or 0 for the formats with a
    min), as 1 << shift; the bits of a quant; `scales(builder, wd, offsets)`, the eight blocks' weight scales as
    <8 x float> (default: the f16 d at each block's start)."""

    def __init__(self, block, m_at, decode, shift, bits, scales=None):
        self.block, self.m_at, self.decode, self.shift, self.bits = block, m_at, decode, shift, bits
        self.scales = scales  # None: _halves

    @property
    def wide(self) -> bool:
        """Whether the unsigned quants pass 127 (Q8_0): vpmaddubsw's pair sums could saturate."""
        return self.bits == 8

    @property
    def i16_group(self) -> int:
        """Registers whose vpmaddubsw pair sums (each up to 2 * top quant * 127) stay below 2^15 together
        (ir.lane_dots): Q4 8, Q5 4."""
        return max(1, min(LGROUP, (2**15 - 1) // (2 * (2**self.bits - 1) * 127)))


def _q8_0(b, w, o):
    return b.xor(load_vec(b, w, b.add(o, i64(2)), 32), const_vec(I8, [-128] * 32))  # q + 128


def _q5(qh, qs):
    return lambda b, w, o: b.or_(nibbles(b, w, b.add(o, i64(qs))), fifth_bits(b, w, b.add(o, i64(qh))))


def _mxfp4(b, w, o):
    """MXFP4's codes (the nibbles at o + 1) -> KVALUES_MXFP4[code] + 16 (4..28, 5 bits): one pshufb of the table
    in both 128-bit lanes on AVX2, a lane-by-lane gather elsewhere (the same bytes)."""
    codes = nibbles(b, w, b.add(o, i64(1)))  # <32 x i8> codes 0..15
    levels = [v + 16 for v in KVALUES_MXFP4]
    if "avx2" in X86:
        table = const_vec(I8, levels * 2)
        return call_intrinsic(b, "llvm.x86.avx2.pshuf.b", ir.VectorType(I8, 32), [table, codes])
    table, out = const_vec(I8, levels), ir.Constant(ir.VectorType(I8, 32), ir.Undefined)
    for i in range(32):
        level = b.extract_element(table, b.extract_element(codes, ir.Constant(I32, i)))
        out = b.insert_element(out, level, ir.Constant(I32, i))
    return out


def _e8m0_halves(builder, wd, offsets):
    """The E8M0 byte e at each offset -> <8 x float> 2^(e - 128) (GGML_E8M0_TO_FP32_HALF: the table is doubled):
    bits 0x00200000 << e for e < 2 (the subnormals 2^-128, 2^-127), else (e - 1) << 23."""
    e = ir.Constant(V8I, None)
    for j, o in enumerate(offsets):
        e = builder.insert_element(e, builder.zext(builder.load(byte_ptr(builder, wd, o)), I32), ir.Constant(I32, j))
    subnormal = builder.shl(const_vec(I32, [0x00200000] * 8), e)  # poison for e >= 11: the select never takes it
    normal = builder.shl(builder.sub(e, const_vec(I32, [1] * 8)), const_vec(I32, [23] * 8))
    small = builder.icmp_unsigned("<", e, const_vec(I32, [2] * 8))
    return builder.bitcast(builder.select(small, subnormal, normal), V8F)


_FORMATS = {
    "q8_0": _Format(34, None, _q8_0, 7, 8),
    "q4_0": _Format(18, None, lambda b, w, o: nibbles(b, w, b.add(o, i64(2))), 3, 4),
    "q5_0": _Format(22, None, _q5(2, 6), 4, 5),
    "q4_1": _Format(20, 2, lambda b, w, o: nibbles(b, w, b.add(o, i64(4))), None, 4),
    "q5_1": _Format(24, 2, _q5(4, 8), None, 5),
    # MXFP4: doubled E2M1 values + 16 (Q5_0's offset and activations), half-scales 2^(e - 128) from the E8M0 byte
    "mxfp4": _Format(17, None, _mxfp4, 4, 5, _e8m0_halves),
}


def _transpose8(builder, c):
    """Eight <8 x i32> -> eight: register k holds dword k of c[0..7] (lane j from c[j])."""
    a, b = transpose4(builder, c[:4]), transpose4(builder, c[4:])  # dword m of c[0..3] | dword m + 4, m = 0..3
    low = [shuffle(builder, a[m], b[m], [0, 1, 2, 3, 8, 9, 10, 11]) for m in range(4)]
    high = [shuffle(builder, a[m], b[m], [4, 5, 6, 7, 12, 13, 14, 15]) for m in range(4)]
    return low + high


def _halves(builder, wd, offsets):
    """The f16 at each offset of wd -> <8 x float>."""
    v = ir.Constant(ir.VectorType(I16, 8), None)
    for j, o in enumerate(offsets):
        ptr = builder.bitcast(builder.gep(builder.bitcast(wd, I8.as_pointer()), [o]), I16.as_pointer())
        v = builder.insert_element(v, builder.load(ptr, align=1), ir.Constant(I32, j))
    return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 8)), V8F)


def _row_loop(context, builder, sig, args, fmt, n_tok):
    """One row against tokens t0..t0+n_tok-1 -> n_tok float32: per group of 8 blocks, per token
    acc += float(-(Σx << shift) + lanes) * d_w * d_x (lane j: block j), + m_w * s_x for the formats with a min; a
    token's result is acc[0] + .. + acc[7]."""
    w = context.make_array(sig.args[0])(context, builder, args[0])
    wd = w.data
    n_blocks = builder.udiv(cgutils.unpack_tuple(builder, w.shape, 1)[0], i64(fmt.block))
    arrays = []
    for k in (1, 2, 3):
        a = context.make_array(sig.args[k])(context, builder, args[k])
        arrays.append(
            (a.data, cgutils.unpack_tuple(builder, a.strides, 2)[0], cgutils.unpack_tuple(builder, a.shape, 2))
        )
    (xq, xq_s, _), (xd, xd_s, _), (xs, xs_s, _) = arrays
    t0 = args[4] if args[4].type.width == 64 else builder.sext(args[4], ir.IntType(64))
    i8p = I8.as_pointer()

    def at(base, offset, ty):  # typed pointer to base + offset bytes
        return builder.bitcast(builder.gep(builder.bitcast(base, i8p), [offset]), ty.as_pointer())

    toks = [builder.add(t0, i64(k)) for k in range(n_tok)]
    rows = [
        (at(xq, builder.mul(t, xq_s), I8), at(xd, builder.mul(t, xd_s), I8), at(xs, builder.mul(t, xs_s), I8))
        for t in toks
    ]
    accs = [cgutils.alloca_once_value(builder, ir.Constant(V8F, [0.0] * 8)) for _ in toks]
    sums_ty = V8F if fmt.shift is None else V8I
    zeros = ir.Constant(V8F, [0.0] * 8)

    def group(g, tail, half=False):
        """Blocks 8g..8g+7 against the tokens; `tail`: the row's last, partial group (its lanes past the row read
        the last block again, their weight scales made 0). `half`: a tail of at most 4 blocks, as 4 registers of
        ir.transpose4 (dwords m and m + 4 of each block in lanes j and j + 4, the activations laid out alike), and the
        lanes folded (j + (j + 4)) before they are scaled: the same integers as a full group's, half the dots."""
        n_regs = LGROUP // 2 if half else LGROUP
        first = builder.mul(g, i64(LGROUP))
        offsets = [builder.mul(builder.add(first, i64(j)), i64(fmt.block)) for j in range(LGROUP)]
        if tail:
            last = builder.mul(builder.sub(n_blocks, i64(1)), i64(fmt.block))
            offsets = [
                builder.select(builder.icmp_unsigned("<", builder.add(first, i64(j)), n_blocks), o, last)
                for j, o in enumerate(offsets)
            ]
        prefetch(builder, wd, offsets[0], n_regs * fmt.block)
        blocks = [builder.bitcast(fmt.decode(builder, wd, o), V8I) for o in offsets[:n_regs]]
        regs = transpose4(builder, blocks) if half else _transpose8(builder, blocks)
        regs = [builder.bitcast(r, ir.VectorType(I8, 32)) for r in regs]
        dw = (fmt.scales or _halves)(builder, wd, offsets)
        mw = None if fmt.shift is not None else _halves(builder, wd, [builder.add(o, i64(fmt.m_at)) for o in offsets])
        if tail:  # 32-bit lanes (a <8 x i64> compare would be a 512-bit instruction)
            inside = builder.icmp_unsigned(
                "<", builder.add(_splat32(builder, first), const_vec(I32, range(8))), _splat32(builder, n_blocks)
            )
            dw = builder.select(inside, dw, zeros)
            mw = None if mw is None else builder.select(inside, mw, zeros)
        xo = builder.mul(g, i64(32 * LGROUP))
        so = builder.mul(first, i64(4))  # byte offset of the group's scales / sums
        for (xqd, xdd, xsd), acc in zip(rows, accs):
            sums = builder.load(at(xsd, so, sums_ty), align=4)
            xs = [load_vec(builder, xqd, builder.add(xo, i64(32 * k)), 32) for k in range(n_regs)]
            lanes = lane_dots(
                builder,
                regs,
                xs,
                sums if mw is None else ir.Constant(V8I, [0] * 8),
                i16_group=fmt.i16_group,
                wide=fmt.wide,
            )
            if half:  # lane j + 4 held dwords 4..7 of block j (its bias, 0 past the row, sits in lane j only)
                lanes = builder.add(lanes, shuffle(builder, lanes, lanes, [4, 5, 6, 7, 0, 1, 2, 3]))
            scale = builder.fmul(dw, builder.load(at(xdd, so, V8F), align=4))
            total = fma(builder, builder.sitofp(lanes, V8F), scale, builder.load(acc))
            if mw is not None:
                total = fma(builder, mw, sums, total)
            builder.store(total, acc)

    full = builder.udiv(n_blocks, i64(LGROUP))
    with cgutils.for_range(builder, full) as loop:
        group(loop.index, False)
    rem = builder.sub(n_blocks, builder.mul(full, i64(LGROUP)))  # blocks of the last, partial group (0: none)
    with builder.if_then(builder.icmp_unsigned(">", rem, i64(LGROUP // 2))):
        group(full, True)
    with builder.if_then(
        builder.and_(builder.icmp_unsigned(">", rem, i64(0)), builder.icmp_unsigned("<=", rem, i64(LGROUP // 2)))
    ):
        group(full, True, half=True)
    return [reduce_f(builder, builder.load(a), 8) for a in accs]


def _splat32(builder, v):
    """An i64 (a block index, below 2^31: rows are under 2 GiB) -> <8 x i32>."""
    return splat(builder, builder.trunc(v, I32), 8)


# xq int8 (n_tok, cols8), each 256-element group's dwords transposed 8 x 8; xd float32 (n_tok, nb8); sums int32
# (-(Σq << shift)) or float32 (Q8_1's s) (n_tok, nb8): quantize_q8_{0,1}_interleaved's
# every count 1-8 (block32's too): a decode forward's 5-7 rows (a verified draft) in one pass over the weights
ROWDOTS = {name: prefill_rowdots(name, fmt, _row_loop, EVERY_COUNT) for name, fmt in _FORMATS.items()}
prefill_q8_0 = prefill_kernel("q8_0", _FORMATS["q8_0"], _row_loop, __name__, 16, ROWDOTS["q8_0"])
prefill_q4_0 = prefill_kernel("q4_0", _FORMATS["q4_0"], _row_loop, __name__, 16, ROWDOTS["q4_0"])
prefill_q5_0 = prefill_kernel("q5_0", _FORMATS["q5_0"], _row_loop, __name__, 16, ROWDOTS["q5_0"])
prefill_q4_1 = prefill_kernel("q4_1", _FORMATS["q4_1"], _row_loop, __name__, 16, ROWDOTS["q4_1"])
prefill_q5_1 = prefill_kernel("q5_1", _FORMATS["q5_1"], _row_loop, __name__, 16, ROWDOTS["q5_1"])
prefill_mxfp4 = prefill_kernel("mxfp4", _FORMATS["mxfp4"], _row_loop, __name__, 16, ROWDOTS["mxfp4"])


@njit(cache=True, nogil=True)
def quantize_for_q8_0(x):
    """x f32 (n_tok, cols) -> prefill_q8_0's activations (actquant.quantize_q8_0_interleaved, offset 128)."""
    return quantize_q8_0_interleaved(x, 7)


@njit(cache=True, nogil=True)
def quantize_for_q4_0(x):
    """x f32 (n_tok, cols) -> prefill_q4_0's activations (offset 8)."""
    return quantize_q8_0_interleaved(x, 3)


@njit(cache=True, nogil=True)
def quantize_for_q5_0(x):
    """x f32 (n_tok, cols) -> prefill_q5_0's activations (offset 16)."""
    return quantize_q8_0_interleaved(x, 4)


# the activations of each format's row dots (block32's), and api.PREFILL's entries: (quantize, kernel)
QUANTIZE = {
    "q8_0": quantize_for_q8_0,
    "q4_0": quantize_for_q4_0,
    "q5_0": quantize_for_q5_0,
    "q4_1": quantize_q8_1_interleaved,
    "q5_1": quantize_q8_1_interleaved,
    "mxfp4": quantize_for_q5_0,
}
PREFILL_Q8_0 = (QUANTIZE["q8_0"], prefill_q8_0)
PREFILL_Q4_0 = (QUANTIZE["q4_0"], prefill_q4_0)
PREFILL_Q5_0 = (QUANTIZE["q5_0"], prefill_q5_0)
PREFILL_Q4_1 = (QUANTIZE["q4_1"], prefill_q4_1)
PREFILL_Q5_1 = (QUANTIZE["q5_1"], prefill_q5_1)
PREFILL_MXFP4 = (QUANTIZE["mxfp4"], prefill_mxfp4)
