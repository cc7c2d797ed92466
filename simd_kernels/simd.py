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
