"""K-quant row dots: one row of 256-element super-blocks against Q8_K activations, as LLVM vector code.

simd_kernels.ir's conventions (generic LLVM IR; x86 integer dot instructions where the host has them, summing
exactly what the generic code sums). `K_ROWDOTS[<type>]` = (rowdot1, .., rowdot4, rowdot8) for Q4_K, Q5_K and Q6_K.
Every path's numbers are the ones tests/simd_kernels/test_kquant_lanes.py states. All three: 8 lanes over natural-order
activations, each 32-element piece one 256-bit vpmaddubsw + vpdpwssd per token, the weights decoded with 256-bit ANDs
and shifts (_k8_row_loop), faster than the 16-lane form (zero-extended, paired activations) they replaced; Q5_K had
that form in 512-bit vectors (docs/measurements.md). No 512-bit instruction belongs in these loops: while one is in
flight, port 1 takes no vector work.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .ir import (
    I8,
    I16,
    I32,
    V8F,
    V8I,
    V16S,
    X86,
    Acts,
    array_data,
    call_intrinsic,
    const_vec,
    i64,
    load_half,
    load_vec,
    prefetch,
    reduce_f,
    shuffle,
    splat,
    token_indices,
    u32_at,
)
from .simd import ROW_TOKENS

# ---- K-quants: one row of 256-element super-blocks against Q8_K activations ----

_V16I = ir.VectorType(I32, 16)


def k4_scales_mins(builder, wd, o):
    """The 12 packed bytes at o -> (<8 x i32> scales, <8 x i32> mins), unpacked per the Q4_K layout."""
    w0, w1, w2 = (u32_at(builder, wd, builder.add(o, i64(k))) for k in (0, 4, 8))
    six, low4, top2 = (ir.Constant(I32, v) for v in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))
    sc_lo = builder.and_(w0, six)  # bytes: sc0..sc3
    m_lo = builder.and_(w1, six)  # bytes: m0..m3
    # sc4..7 = low nibbles of bytes 8..11 | top two bits of bytes 0..3; m4..7 the same from bytes 4..7
    sc_hi = builder.or_(
        builder.and_(w2, low4),
        builder.shl(builder.and_(builder.lshr(w0, ir.Constant(I32, 6)), top2), ir.Constant(I32, 4)),
    )
    m_hi = builder.or_(
        builder.and_(builder.lshr(w2, ir.Constant(I32, 4)), low4),
        builder.shl(builder.and_(builder.lshr(w1, ir.Constant(I32, 6)), top2), ir.Constant(I32, 4)),
    )

    def bytes8(a, b):
        v = builder.insert_element(ir.Constant(ir.VectorType(I32, 2), ir.Undefined), a, ir.Constant(I32, 0))
        v = builder.insert_element(v, b, ir.Constant(I32, 1))
        return builder.zext(builder.bitcast(v, ir.VectorType(I8, 8)), ir.VectorType(I32, 8))

    return bytes8(sc_lo, sc_hi), bytes8(m_lo, m_hi)


def _bsum_pairs(builder, bsd, bo):
    """Activation sums of the eight 32-element sub-blocks: bsums[2j] + bsums[2j+1] -> <8 x i32>."""
    ptr = builder.bitcast(builder.gep(bsd, [bo]), _V16I.as_pointer())
    bs = builder.load(ptr, align=4)
    return builder.add(shuffle(builder, bs, bs, range(0, 16, 2)), shuffle(builder, bs, bs, range(1, 16, 2)))


def _lanes8(builder, acc, q, xv, s):
    """acc + <8 x i32> lane k = sc_k * (q . x over elements 4k..4k+3), exact: q <32 x i8> in 0..63, xv <32 x i8> in
    -127..127, s <8 x i32> holding lane k's signed 16-bit scale sc_k in both words. One vpmaddubsw + vpdpwssd
    (VNNI), vpmaddubsw + vpmaddwd + vpaddd (AVX2), or generic code: the same integers (the pairs stay below
    2*63*127 < 2^15, no saturation)."""
    v16 = ir.VectorType(I16, 16)
    if "avx2" in X86:
        w = call_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [q, xv])
        if {"avx512vnni", "avx512vl"} <= X86:
            return call_intrinsic(builder, "llvm.x86.avx512.vpdpwssd.256", V8I, [acc, builder.bitcast(w, V8I), s])
        return builder.add(acc, call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", V8I, [w, builder.bitcast(s, v16)]))
    v32 = ir.VectorType(I32, 32)
    p = builder.mul(builder.sext(q, v32), builder.sext(xv, v32), flags=["nsw"])
    p16 = builder.add(shuffle(builder, p, p, range(0, 32, 2)), shuffle(builder, p, p, range(1, 32, 2)))
    p8 = builder.add(shuffle(builder, p16, p16, range(0, 16, 2)), shuffle(builder, p16, p16, range(1, 16, 2)))
    sc = builder.ashr(builder.shl(s, const_vec(I32, [16] * 8)), const_vec(I32, [16] * 8))  # the low word
    return builder.add(acc, builder.mul(p8, sc, flags=["nsw"]))


def _k45_decode8(builder, wd, o, qs, qh):
    """A Q4_K (qh None) or Q5_K super-block as 8 sub-blocks of 32 quants (0..15, or 0..31 with the fifth bits) in
    natural order, each with its scale dwords: the 32-byte chunk c of nibbles at qs is sub-blocks 2c (low) and 2c+1
    (high); bit j of byte l of the 32 bytes at qh is the fifth bit of element 32j + l. Also (d, dmin, mins <8 x i32>)."""
    d = load_half(builder, wd, o)
    dmin = load_half(builder, wd, builder.add(o, i64(2)))
    scales, mins = k4_scales_mins(builder, wd, builder.add(o, i64(4)))
    words = builder.or_(scales, builder.shl(scales, const_vec(I32, [16] * 8)))  # sc_j in both 16-bit words
    high = None if qh is None else load_vec(builder, wd, builder.add(o, i64(qh)), 32)
    sixteen = const_vec(I8, [16] * 32)
    subs = []
    for c in range(4):
        v = load_vec(builder, wd, builder.add(o, i64(qs + 32 * c)), 32)
        halves = (builder.and_(v, const_vec(I8, [15] * 32)), builder.lshr(v, const_vec(I8, [4] * 32)))
        for j, q in ((2 * c, halves[0]), (2 * c + 1, halves[1])):
            if high is not None:  # bit j moved to bit 4
                moved = (
                    builder.shl(high, const_vec(I8, [4 - j] * 32))
                    if j < 4
                    else builder.lshr(high, const_vec(I8, [j - 4] * 32))
                    if j > 4
                    else high
                )
                q = builder.or_(q, builder.and_(moved, sixteen))
            subs.append((q, shuffle(builder, words, words, [j] * 8)))
    return (d, dmin, mins), subs


def _q4k_decode8(builder, wd, o):
    return _k45_decode8(builder, wd, o, 16, None)


def _q5k_decode8(builder, wd, o):
    return _k45_decode8(builder, wd, o, 48, 16)


def _q4k_finish(builder, acc, isum, extra, dx, bsd, blk):
    """acc + (d*dx) * lanes - (dmin*dx) * (m_k * (bsum[2k] + bsum[2k+1]))."""
    d, dmin, mins = extra
    total = builder.fadd(acc, builder.fmul(splat(builder, builder.fmul(d, dx), 8), builder.sitofp(isum, V8F)))
    mterm = builder.mul(mins, _bsum_pairs(builder, bsd, builder.mul(blk, i64(16))))
    return builder.fsub(total, builder.fmul(splat(builder, builder.fmul(dmin, dx), 8), builder.sitofp(mterm, V8F)))


def q6k_decode8(builder, wd, o):
    """A Q6_K super-block as 8 pieces of 32 quants (0..63, not yet centred) in natural order, each with its scale
    dwords (lanes 0..3: the piece's first 16-element scale, lanes 4..7 its second). Per 128-element half n, ql bytes
    a = ql[64n..], b = ql[64n+32..] and qh h = qh[32n..] give elements 128n + (a low | h bits 0-1), +32 (b low |
    bits 2-3), +64 (a high | bits 4-5), +96 (b high | bits 6-7). Also (d, the 16 scales as <16 x i16>)."""
    d = load_half(builder, wd, builder.add(o, i64(208)))
    sc16 = builder.sext(load_vec(builder, wd, builder.add(o, i64(192)), 16), ir.VectorType(I16, 16))
    low4, two = const_vec(I8, [15] * 32), const_vec(I8, [0x30] * 32)

    def sh(v, n):  # bits of each byte moved by n (left if n > 0), then bits 4-5 kept
        moved = builder.shl(v, const_vec(I8, [n] * 32)) if n > 0 else builder.lshr(v, const_vec(I8, [-n] * 32))
        return builder.and_(moved, two) if n else builder.and_(v, two)

    subs = []
    for n in range(2):
        a = load_vec(builder, wd, builder.add(o, i64(64 * n)), 32)
        b = load_vec(builder, wd, builder.add(o, i64(64 * n + 32)), 32)
        h = load_vec(builder, wd, builder.add(o, i64(128 + 32 * n)), 32)
        quants = (
            builder.or_(builder.and_(a, low4), sh(h, 4)),
            builder.or_(builder.and_(b, low4), sh(h, 2)),
            builder.or_(builder.lshr(a, const_vec(I8, [4] * 32)), sh(h, 0)),
            builder.or_(builder.lshr(b, const_vec(I8, [4] * 32)), sh(h, -2)),
        )
        for i, q in enumerate(quants):
            g = 8 * n + 2 * i  # the piece's first 16-element scale
            s = builder.bitcast(shuffle(builder, sc16, sc16, [g] * 8 + [g + 1] * 8), V8I)
            subs.append((q, s))
    return (d, sc16), subs


def _q6k_finish(builder, acc, isum, extra, dx, bsd, blk):
    """acc + (d*dx) * (lanes - 32 * (sc[2k]*bsum[2k] + sc[2k+1]*bsum[2k+1])): the quants' -32, per lane."""
    d, sc16 = extra
    if "avx2" in X86:
        # the 16 bsums as two 256-bit halves packed to words (|bsum| <= 16*127: exact), then back in order: a
        # <16 x i32> load and truncation here were 512-bit instructions, which keep port 1 from vector work
        halves = [
            builder.load(
                builder.bitcast(
                    builder.gep(bsd, [builder.add(builder.mul(blk, i64(16)), i64(8 * h))]), V8I.as_pointer()
                ),
                align=4,
            )
            for h in range(2)
        ]
        packed = call_intrinsic(builder, "llvm.x86.avx2.packssdw", V16S, halves)  # per 128 bits: 4 of each half
        bs16 = shuffle(builder, packed, packed, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
        offs = call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", V8I, [bs16, sc16])
    else:
        ptr = builder.bitcast(builder.gep(bsd, [builder.mul(blk, i64(16))]), _V16I.as_pointer())
        bs16 = builder.trunc(builder.load(ptr, align=4), ir.VectorType(I16, 16))  # |bsum| <= 16*127: exact
        v16i = ir.VectorType(I32, 16)
        p = builder.mul(builder.sext(bs16, v16i), builder.sext(sc16, v16i), flags=["nsw"])
        offs = builder.add(shuffle(builder, p, p, range(0, 16, 2)), shuffle(builder, p, p, range(1, 16, 2)))
    lanes = builder.sub(isum, builder.shl(offs, const_vec(I32, [5] * 8)))
    return builder.fadd(acc, builder.fmul(splat(builder, builder.fmul(d, dx), 8), builder.sitofp(lanes, V8F)))


def _k8_row_loop(context, builder, sig, args, block_bytes, decode, finish, n_tok):
    """Row loop of a K-quant row dot in 8 int32 lanes over natural-order Q8_K activations (tests/simd_kernels/test_kquant_lanes.py
    states each format's lanes): per super-block, decode(builder, wd, o) -> (extra, 8 pieces of (32 quants, scale
    dwords)), once for the n_tok tokens; per token the pieces' _lanes8 in two accumulators (two short dependency
    chains, the same integers), then finish(builder, acc, lanes, extra, dx, bsums row, block) -> the new <8 x float>
    acc; the row's value is acc[0] + .. + acc[7]."""
    wd = array_data(context, builder, sig.args[0], args[0])
    acts = Acts(context, builder, sig, args, 1)
    toks = [(acts.row(0, t), acts.row(1, t), acts.row(2, t)) for t in token_indices(builder, args[4], n_tok)]
    accs = [cgutils.alloca_once_value(builder, ir.Constant(V8F, [0.0] * 8)) for _ in toks]
    zero = ir.Constant(V8I, [0] * 8)
    with cgutils.for_range(builder, acts.n_blocks) as loop:
        blk = loop.index
        o = builder.mul(blk, i64(block_bytes))
        prefetch(builder, wd, o, block_bytes)
        extra, subs = decode(builder, wd, o)
        for (xqd, xdd, bsd), acc in zip(toks, accs):
            xo = builder.mul(blk, i64(256))
            parts = [zero, zero]
            for j, (q, sc) in enumerate(subs):
                xv = load_vec(builder, xqd, builder.add(xo, i64(32 * j)), 32)
                parts[j % 2] = _lanes8(builder, parts[j % 2], q, xv, sc)
            dx = builder.load(builder.gep(xdd, [blk]))
            isum = builder.add(parts[0], parts[1])
            builder.store(finish(builder, builder.load(acc), isum, extra, dx, bsd, blk), acc)
    return [reduce_f(builder, builder.load(a), 8) for a in accs]


def _make_krowdot(name, row_loop, block_bytes, decode, lanes_of, n_tok):
    """The intrinsic rowdot<n_tok>_<name> around row_loop (_k8_row_loop) and the format's pieces."""

    @intrinsic
    def rowdot(typingctx, w, xq, xd, bsums, t0):
        """One row of K-quant super-blocks . Q8_K activations of tokens t0..t0+n_tok-1.

        w: uint8 (row_bytes,); xq: int8 (n_tok_all, cols); xd: float32 (n_tok_all, cols/256);
        bsums: int32 (n_tok_all, cols/16). Returns a tuple of n_tok float32.
        """
        sig = types.UniTuple(types.float32, n_tok)(w, xq, xd, bsums, t0)

        def codegen(context, builder, sig, args):
            totals = row_loop(context, builder, sig, args, block_bytes, decode, lanes_of, n_tok)
            return context.make_tuple(builder, sig.return_type, totals)

        return sig, codegen

    rowdot.__name__ = f"rowdot{n_tok}_{name}"
    return rowdot


# name -> (row loop, super-block bytes, decoder, finish)
_K_LAYOUTS = {
    "q5_k": (_k8_row_loop, 176, _q5k_decode8, _q4k_finish),
    "q4_k": (_k8_row_loop, 144, _q4k_decode8, _q4k_finish),
    "q6_k": (_k8_row_loop, 210, q6k_decode8, _q6k_finish),
}
K_ROWDOTS = {name: tuple(_make_krowdot(name, *layout, n) for n in ROW_TOKENS) for name, layout in _K_LAYOUTS.items()}
