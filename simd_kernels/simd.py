"""LLVM vector code for the hot loops, as Numba intrinsics (Numba itself widens int8 math to int64 lanes).

Written in generic LLVM IR (no target intrinsics): LLVM picks AVX-512, AVX2 or SSE as the host has.
`f16_at` reads one IEEE half; `rowdot_*` dot one whole row of 32-element blocks against Q8_0/Q8_1
activations, keeping eight float lanes of partial sums and reducing them once per row, as ggml does.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _data(context, builder, aryty, ary):
    return context.make_array(aryty)(context, builder, ary).data


def _byte_ptr(builder, base, offset):
    return builder.gep(builder.bitcast(base, _I8.as_pointer()), [offset])


def _load_vec(builder, base, offset, n):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), ir.VectorType(_I8, n).as_pointer())
    return builder.load(ptr, align=1)


def _load_half(builder, base, offset):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), _I16.as_pointer())
    return builder.fpext(builder.bitcast(builder.load(ptr, align=1), ir.HalfType()), _F32)


def _const_vec(elem, values):
    return ir.Constant(ir.VectorType(elem, len(values)), list(values))


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, _const_vec(_I32, idx))


def _splat(builder, value, n):
    vt = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return _shuffle(builder, one, one, [0] * n)


def _dot32_lanes(builder, q, xv):
    """<32 x i8> q . <32 x i8> x -> <8 x float> of exact partial sums (pairs summed like pmaddwd)."""
    v32 = ir.VectorType(_I32, 32)
    p = builder.mul(builder.sext(q, v32), builder.sext(xv, v32), flags=["nsw"])
    s16 = builder.add(_shuffle(builder, p, p, range(0, 32, 2)), _shuffle(builder, p, p, range(1, 32, 2)))
    s8 = builder.add(_shuffle(builder, s16, s16, range(8)), _shuffle(builder, s16, s16, range(8, 16)))
    return builder.sitofp(s8, _V8F)


def _nibbles(builder, base, offset):
    """16 bytes -> <32 x i8>: low nibbles (elements 0..15) then high nibbles (16..31)."""
    v = _load_vec(builder, base, offset, 16)
    lo = builder.and_(v, _const_vec(_I8, [15] * 16))
    hi = builder.lshr(v, _const_vec(_I8, [4] * 16))
    return _shuffle(builder, lo, hi, range(32))


def _fifth_bits(builder, base, offset):
    """The little-endian uint32 qh at offset -> <32 x i8> with 16 where bit i is set."""
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), _I32.as_pointer())
    qh = _splat(builder, builder.load(ptr, align=1), 32)
    bits = builder.and_(builder.lshr(qh, _const_vec(_I32, range(32))), _const_vec(_I32, [1] * 32))
    return builder.shl(builder.trunc(bits, ir.VectorType(_I8, 32)), _const_vec(_I8, [4] * 32))


# name -> (block bytes, offset of the min f16 or None, decoder of the 32 signed quants of the block at o)
_LAYOUTS = {
    "q8_0": (34, None, lambda b, w, o: _load_vec(b, w, b.add(o, _c(2)), 32)),
    "q4_0": (18, None, lambda b, w, o: b.sub(_nibbles(b, w, b.add(o, _c(2))), _const_vec(_I8, [8] * 32))),
    "q4_1": (20, 2, lambda b, w, o: _nibbles(b, w, b.add(o, _c(4)))),
    "q5_0": (22, None, lambda b, w, o: b.sub(b.or_(_nibbles(b, w, b.add(o, _c(6))), _fifth_bits(b, w, b.add(o, _c(2)))),
                                             _const_vec(_I8, [16] * 32))),
    "q5_1": (24, 2, lambda b, w, o: b.or_(_nibbles(b, w, b.add(o, _c(8))), _fifth_bits(b, w, b.add(o, _c(4))))),
}


def _c(v):
    return ir.Constant(ir.IntType(64), v)


def _make_rowdot(name):
    block_bytes, min_offset, decode = _LAYOUTS[name]

    @intrinsic
    def rowdot(typingctx, w, xq, xd, xs):
        """Σ_b d_w*d_x*Σ q*xq (+ m_w*s_x for the formats with a min), over one row's blocks.

        w: uint8 (row_bytes,) raw blocks; xq: int8 (cols,); xd: float32 (cols/32,) activation scales;
        xs: float32 (cols/32,) Q8_1 block sums s (read only by the formats with a min).
        """
        sig = types.float32(w, xq, xd, xs)

        def codegen(context, builder, sig, args):
            wd = _data(context, builder, sig.args[0], args[0])
            xqd = _data(context, builder, sig.args[1], args[1])
            xdd = _data(context, builder, sig.args[2], args[2])
            xsd = _data(context, builder, sig.args[3], args[3])
            n_blocks = context.make_array(sig.args[2])(context, builder, args[2]).nitems
            acc = cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8))
            acc_min = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
            with cgutils.for_range(builder, n_blocks) as loop:
                blk = loop.index
                o = builder.mul(blk, _c(block_bytes))
                q = decode(builder, wd, o)
                xv = _load_vec(builder, xqd, builder.mul(blk, _c(32)), 32)
                dx = builder.load(builder.gep(xdd, [blk]))
                scale = _splat(builder, builder.fmul(_load_half(builder, wd, o), dx), 8)
                part = builder.fmul(scale, _dot32_lanes(builder, q, xv))
                builder.store(builder.fadd(builder.load(acc), part), acc)
                if min_offset is not None:
                    m = _load_half(builder, wd, builder.add(o, _c(min_offset)))
                    sx = builder.load(builder.gep(xsd, [blk]))
                    builder.store(builder.fadd(builder.load(acc_min), builder.fmul(m, sx)), acc_min)
            lanes = builder.load(acc)
            total = builder.load(acc_min)
            for i in range(8):
                total = builder.fadd(total, builder.extract_element(lanes, ir.Constant(_I32, i)))
            return total

        return sig, codegen

    rowdot.__name__ = f"rowdot_{name}"
    return rowdot


rowdot_q8_0 = _make_rowdot("q8_0")
rowdot_q4_0 = _make_rowdot("q4_0")
rowdot_q4_1 = _make_rowdot("q4_1")
rowdot_q5_0 = _make_rowdot("q5_0")
rowdot_q5_1 = _make_rowdot("q5_1")


@intrinsic
def f16_at(typingctx, a, offset):
    """The IEEE half stored little-endian at byte offset of the 1-D uint8 array a, as float32."""
    sig = types.float32(a, offset)

    def codegen(context, builder, sig, args):
        base = _data(context, builder, sig.args[0], args[0])
        return _load_half(builder, base, builder.sext(args[1], ir.IntType(64))
                          if args[1].type.width < 64 else args[1])

    return sig, codegen


# ---- K-quants: one row of 256-element super-blocks against Q8_K activations ----

_V16F = ir.VectorType(_F32, 16)
_V16I = ir.VectorType(_I32, 16)


def _pairs(builder, q, xv):
    """<32 x i8> q . <32 x i8> x -> <16 x i32>, lane i = q[2i]*x[2i] + q[2i+1]*x[2i+1] (exact)."""
    v32 = ir.VectorType(_I32, 32)
    p = builder.mul(builder.sext(q, v32), builder.sext(xv, v32), flags=["nsw"])
    return builder.add(_shuffle(builder, p, p, range(0, 32, 2)), _shuffle(builder, p, p, range(1, 32, 2)))


def _u32_at(builder, base, offset):
    ptr = builder.bitcast(_byte_ptr(builder, base, offset), _I32.as_pointer())
    return builder.load(ptr, align=1)


def _k4_scales_mins(builder, wd, o):
    """The 12 packed bytes at o -> (<8 x i32> scales, <8 x i32> mins), unpacked per the Q4_K layout."""
    w0, w1, w2 = (_u32_at(builder, wd, builder.add(o, _c(k))) for k in (0, 4, 8))
    six, low4, top2 = (ir.Constant(_I32, v) for v in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))
    sc_lo = builder.and_(w0, six)  # bytes: sc0..sc3
    m_lo = builder.and_(w1, six)  # bytes: m0..m3
    # sc4..7 = low nibbles of bytes 8..11 | top two bits of bytes 0..3; m4..7 the same from bytes 4..7
    sc_hi = builder.or_(builder.and_(w2, low4), builder.shl(builder.and_(builder.lshr(w0, ir.Constant(_I32, 6)),
                                                                         top2), ir.Constant(_I32, 4)))
    m_hi = builder.or_(builder.and_(builder.lshr(w2, ir.Constant(_I32, 4)), low4),
                       builder.shl(builder.and_(builder.lshr(w1, ir.Constant(_I32, 6)), top2), ir.Constant(_I32, 4)))

    def bytes8(a, b):
        v = builder.insert_element(ir.Constant(ir.VectorType(_I32, 2), ir.Undefined), a, ir.Constant(_I32, 0))
        v = builder.insert_element(v, b, ir.Constant(_I32, 1))
        return builder.zext(builder.bitcast(v, ir.VectorType(_I8, 8)), ir.VectorType(_I32, 8))

    return bytes8(sc_lo, sc_hi), bytes8(m_lo, m_hi)


def _reduce_f(builder, vec, n):
    total = builder.extract_element(vec, ir.Constant(_I32, 0))
    for i in range(1, n):
        total = builder.fadd(total, builder.extract_element(vec, ir.Constant(_I32, i)))
    return total


def _k_row_loop(context, builder, sig, args, block_bytes, body):
    """Shared row loop: body(builder, wd, o, xqd, xo, sb) -> (<16 x i32> scaled sums, d f32, min f32 or None)."""
    wd = _data(context, builder, sig.args[0], args[0])
    xqd = _data(context, builder, sig.args[1], args[1])
    xdd = _data(context, builder, sig.args[2], args[2])
    bsd = _data(context, builder, sig.args[3], args[3])
    n_blocks = context.make_array(sig.args[2])(context, builder, args[2]).nitems
    acc = cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * 16))
    with cgutils.for_range(builder, n_blocks) as loop:
        blk = loop.index
        o = builder.mul(blk, _c(block_bytes))
        dx = builder.load(builder.gep(xdd, [blk]))
        isum, d, mins = body(builder, wd, o, xqd, builder.mul(blk, _c(256)), bsd, builder.mul(blk, _c(16)))
        part = builder.fmul(_splat(builder, builder.fmul(d, dx), 16), builder.sitofp(isum, _V16F))
        total = builder.fadd(builder.load(acc), part)
        if mins is not None:
            mterm, dmin = mins  # <16 x i32>, f32: subtract dmin*dx*Σ m*bsum
            total = builder.fsub(total, builder.fmul(_splat(builder, builder.fmul(dmin, dx), 16),
                                                     builder.sitofp(mterm, _V16F)))
        builder.store(total, acc)
    return _reduce_f(builder, builder.load(acc), 16)


def _bsum_pairs(builder, bsd, bo):
    """Activation sums of the eight 32-element sub-blocks: bsums[2j] + bsums[2j+1] -> <8 x i32>."""
    ptr = builder.bitcast(builder.gep(bsd, [bo]), _V16I.as_pointer())
    bs = builder.load(ptr, align=4)
    return builder.add(_shuffle(builder, bs, bs, range(0, 16, 2)), _shuffle(builder, bs, bs, range(1, 16, 2)))


def _widen8(builder, v8):
    """<8 x i32> -> <16 x i32> with zeros above (lets the min term share the 16-lane accumulator)."""
    zero = ir.Constant(ir.VectorType(_I32, 8), [0] * 8)
    return _shuffle(builder, v8, zero, range(16))


def _q45k_body(five):
    def body(builder, wd, o, xqd, xo, bsd, bo):
        d = _load_half(builder, wd, o)
        dmin = _load_half(builder, wd, builder.add(o, _c(2)))
        scales, mins = _k4_scales_mins(builder, wd, builder.add(o, _c(4)))
        oq = 48 if five else 16
        qh = _load_vec(builder, wd, builder.add(o, _c(16)), 32) if five else None
        isum = ir.Constant(_V16I, [0] * 16)
        for c in range(4):
            v = _load_vec(builder, wd, builder.add(o, _c(oq + 32 * c)), 32)
            lo = builder.and_(v, _const_vec(_I8, [15] * 32))
            hi = builder.lshr(v, _const_vec(_I8, [4] * 32))
            if five:
                # qh byte l bit k is the fifth bit of element 32k + l
                for k, half in ((2 * c, "lo"), (2 * c + 1, "hi")):
                    bit = builder.shl(builder.and_(builder.lshr(qh, _const_vec(_I8, [k] * 32)),
                                                   _const_vec(_I8, [1] * 32)), _const_vec(_I8, [4] * 32))
                    if half == "lo":
                        lo = builder.or_(lo, bit)
                    else:
                        hi = builder.or_(hi, bit)
            for j, q in ((2 * c, lo), (2 * c + 1, hi)):
                xv = _load_vec(builder, xqd, builder.add(xo, _c(32 * j)), 32)
                sc = _splat(builder, builder.extract_element(scales, ir.Constant(_I32, j)), 16)
                isum = builder.add(isum, builder.mul(sc, _pairs(builder, q, xv)))
        mterm = _widen8(builder, builder.mul(mins, _bsum_pairs(builder, bsd, bo)))
        return isum, d, (mterm, dmin)
    return body


def _q6k_body(builder, wd, o, xqd, xo, bsd, bo):
    d = _load_half(builder, wd, builder.add(o, _c(208)))
    sc16 = builder.sext(_load_vec(builder, wd, builder.add(o, _c(192)), 16), _V16I)
    isum = ir.Constant(_V16I, [0] * 16)
    m15, m3 = _const_vec(_I8, [15] * 32), _const_vec(_I8, [3] * 32)
    for n in range(2):
        qa = _load_vec(builder, wd, builder.add(o, _c(64 * n)), 32)
        qb = _load_vec(builder, wd, builder.add(o, _c(64 * n + 32)), 32)
        h = _load_vec(builder, wd, builder.add(o, _c(128 + 32 * n)), 32)

        def high(shift):
            bits = builder.and_(builder.lshr(h, _const_vec(_I8, [shift] * 32)), m3)
            return builder.shl(bits, _const_vec(_I8, [4] * 32))

        quants = (builder.or_(builder.and_(qa, m15), high(0)), builder.or_(builder.and_(qb, m15), high(2)),
                  builder.or_(builder.lshr(qa, _const_vec(_I8, [4] * 32)), high(4)),
                  builder.or_(builder.lshr(qb, _const_vec(_I8, [4] * 32)), high(6)))
        for k, q in enumerate(quants):
            q = builder.sub(q, _const_vec(_I8, [32] * 32))  # 0..63 -> -32..31
            xv = _load_vec(builder, xqd, builder.add(xo, _c(128 * n + 32 * k)), 32)
            g = 8 * n + 2 * k  # scale of elements l < 16; g + 1 for l >= 16
            sc = _shuffle(builder, sc16, sc16, [g] * 8 + [g + 1] * 8)
            isum = builder.add(isum, builder.mul(sc, _pairs(builder, q, xv)))
    return isum, d, None


def _make_krowdot(name, block_bytes, body):
    @intrinsic
    def rowdot(typingctx, w, xq, xd, bsums):
        """One row of K-quant super-blocks . Q8_K activations.

        w: uint8 (row_bytes,); xq: int8 (cols,); xd: float32 (cols/256,); bsums: int32 (cols/16,).
        """
        sig = types.float32(w, xq, xd, bsums)

        def codegen(context, builder, sig, args):
            return _k_row_loop(context, builder, sig, args, block_bytes, body)

        return sig, codegen

    rowdot.__name__ = f"rowdot_{name}"
    return rowdot


rowdot_q4_k = _make_krowdot("q4_k", 144, _q45k_body(False))
rowdot_q5_k = _make_krowdot("q5_k", 176, _q45k_body(True))
rowdot_q6_k = _make_krowdot("q6_k", 210, _q6k_body)
