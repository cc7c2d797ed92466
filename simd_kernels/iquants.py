"""Fused dequantize x dot for the 4-bit formats whose codes index a 16-entry table: IQ4_NL, IQ4_XS and MXFP4.

Weights w: uint8 (rows, row_bytes), raw GGUF blocks read in place. A 4-bit index q stands for the int8 level
KVALUES_IQ4NL[q] (IQ4_NL, IQ4_XS) or the doubled E2M1 value KVALUES_MXFP4[q] (MXFP4), so a block decodes by a
16-entry table lookup where Q4_0 subtracts 8. MXFP4's block is IQ4_NL's with its f16 scale d replaced by one E8M0
exponent byte e, read as 2^(e - 128) (half its scale: the table is doubled), as ggml's GGML_E8M0_TO_FP32_HALF.
Activations x: float32 (n_tok, cols), quantized once per call as llama.cpp's CPU backend pairs them: Q8_0 for
IQ4_NL and MXFP4 (`ggml_vec_dot_iq4_nl_q8_0`, `ggml_vec_dot_mxfp4_q8_0`), Q8_K for IQ4_XS
(`ggml_vec_dot_iq4_xs_q8_K`); each block's (sub-block's) dot product is an exact integer sum. Output out: float32
(n_tok, rows). The kernels are simd.fused_kernel's loop nest around the row dots, so a row's result does not depend
on how many tokens share the call. IQ4_NL's and IQ4_XS's row dots are below; MXFP4's are its prompt kernel's
(simd_kernels.block32_prompt: its codes looked up as levels + 16, dotted against Q5_0's offset activations), so a
decoded token, an expert's share of a prompt and a prompt piece compute alike.

The lookup below is generic LLVM IR (no target intrinsics): one `extractelement` of the constant table per lane of
a <16 x i8> index vector, gathered back with `insertelement`; LLVM's x86 backend lowers that pattern to one
pshufb (checked for haswell, znver4 and this host; plain x86-64 / x86-64-v2 targets get correct scalar code).
The two halves of a block (16 low nibbles, 16 high ones) are looked up and dotted apart: concatenated first
into one <32 x i8>, the two gathers merge into a 32-lane one that LLVM no longer recognises.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import block32_prompt
from .actquant import quantize_q8_0, quantize_q8_k
from .dequant import KVALUES_IQ4NL
from .ir import (
    I8,
    I16,
    I32,
    V8F,
    V8I,
    Acts,
    array_data,
    byte_ptr,
    const_vec,
    i64,
    load_half,
    load_vec,
    prefetch,
    reduce_f,
    shuffle,
    splat,
    token_indices,
)
from .simd import ROW_TOKENS, fused_kernel

_V16I = ir.VectorType(I32, 16)
NL_BYTES, XS_BYTES = 18, 136  # IQ4_NL block (32 elements), IQ4_XS super-block (256 elements)


def _lookup16(builder, idx, values=KVALUES_IQ4NL):
    """<16 x i8> indices in 0..15 -> <16 x i8> levels values[idx] (one pshufb on x86)."""
    table = const_vec(I8, values)
    out = ir.Constant(ir.VectorType(I8, 16), ir.Undefined)
    for i in range(16):
        level = builder.extract_element(table, builder.extract_element(idx, ir.Constant(I32, i)))
        out = builder.insert_element(out, level, ir.Constant(I32, i))
    return out


def _levels(builder, wd, o, values=KVALUES_IQ4NL):
    """The 16 quant bytes at o -> (levels of elements 0..15, levels of elements 16..31), each <16 x i8>."""
    v = load_vec(builder, wd, o, 16)
    lo = builder.and_(v, const_vec(I8, [15] * 16))
    hi = builder.lshr(v, const_vec(I8, [4] * 16))
    return _lookup16(builder, lo, values), _lookup16(builder, hi, values)


def _dot16(builder, q, xv):
    """<16 x i8> . <16 x i8> -> <8 x i32>, lane i = q[2i]*x[2i] + q[2i+1]*x[2i+1] (exact)."""
    p = builder.mul(builder.sext(q, _V16I), builder.sext(xv, _V16I), flags=["nsw"])
    return builder.add(shuffle(builder, p, p, range(0, 16, 2)), shuffle(builder, p, p, range(1, 16, 2)))


def _dot32(builder, halves, xqd, xo):
    """One block's 32 levels . the int8 activations xqd[xo:xo+32] -> <8 x i32> exact partial sums.

    Lane i sums elements 2i, 2i+1, 2i+16, 2i+17 (its own partition: no other path has to match it)."""
    lo, hi = halves
    return builder.add(
        _dot16(builder, lo, load_vec(builder, xqd, xo, 16)),
        _dot16(builder, hi, load_vec(builder, xqd, builder.add(xo, i64(16)), 16)),
    )


def _token_rows(context, builder, sig, args, n_tok):
    """(activation quants row, activation scales row) pointers of tokens t0..t0+n_tok-1."""
    acts = Acts(context, builder, sig, args, 1)
    return acts, [(acts.row(0, t), acts.row(1, t)) for t in token_indices(builder, args[4], n_tok)]


def _make_nl_rowdot(n_tok):
    @intrinsic
    def rowdot(typingctx, w, xq, xd, xs, t0):
        """IQ4_NL row . Q8_0 activations of tokens t0..t0+n_tok-1: Σ_b d_w*d_x*Σ level*xq over the row's blocks.

        w: uint8 (row_bytes,); xq: int8 (n_tok_all, cols); xd: float32 (n_tok_all, cols/32); xs unused.
        Returns a tuple of n_tok float32.
        """
        sig = types.UniTuple(types.float32, n_tok)(w, xq, xd, xs, t0)

        def codegen(context, builder, sig, args):
            wd = array_data(context, builder, sig.args[0], args[0])
            acts, toks = _token_rows(context, builder, sig, args, n_tok)
            # two accumulator sets, for even and odd blocks: halves the float-add dependency chain
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(V8F, [0.0] * 8)) for _ in toks] for _ in "eo"]

            def block(blk, k):
                o = builder.mul(blk, i64(NL_BYTES))
                halves = _levels(builder, wd, builder.add(o, i64(2)))
                dw = load_half(builder, wd, o)
                for (xqd, xdd), acc in zip(toks, accs[k]):
                    dx = builder.load(builder.gep(xdd, [blk]))
                    isum = _dot32(builder, halves, xqd, builder.mul(blk, i64(32)))
                    part = builder.fmul(splat(builder, builder.fmul(dw, dx), 8), builder.sitofp(isum, V8F))
                    builder.store(builder.fadd(builder.load(acc), part), acc)

            with cgutils.for_range(builder, builder.udiv(acts.n_blocks, i64(2))) as loop:
                pair = 2 * NL_BYTES
                prefetch(builder, wd, builder.mul(loop.index, i64(pair)), pair)  # the pair's lines
                block(builder.mul(loop.index, i64(2)), 0)
                block(builder.add(builder.mul(loop.index, i64(2)), i64(1)), 1)
            with builder.if_then(builder.trunc(acts.n_blocks, ir.IntType(1))):  # odd count: the last block
                block(builder.sub(acts.n_blocks, i64(1)), 0)
            totals = [
                reduce_f(builder, builder.fadd(builder.load(even), builder.load(odd)), 8) for even, odd in zip(*accs)
            ]
            return context.make_tuple(builder, sig.return_type, totals)

        return sig, codegen

    rowdot.__name__ = f"rowdot{n_tok}_iq4_nl"
    return rowdot


def _xs_scales(builder, wd, o):
    """The IQ4_XS super-block at o -> <8 x i32> signed sub-block scales ls - 32 (in -32..31).

    ls_j: low 4 bits = nibble j % 2 of scales_l[j // 2] (bytes 4..7), high 2 bits = bits 2j, 2j+1 of scales_h (2..3).
    """
    sl = load_vec(builder, wd, builder.add(o, i64(4)), 4)
    low = builder.zext(shuffle(builder, sl, sl, [j // 2 for j in range(8)]), V8I)
    low = builder.and_(builder.lshr(low, const_vec(I32, [4 * (j % 2) for j in range(8)])), const_vec(I32, [15] * 8))
    sh_ptr = builder.bitcast(byte_ptr(builder, wd, builder.add(o, i64(2))), I16.as_pointer())
    sh = splat(builder, builder.zext(builder.load(sh_ptr, align=1), I32), 8)
    high = builder.and_(builder.lshr(sh, const_vec(I32, [2 * j for j in range(8)])), const_vec(I32, [3] * 8))
    ls = builder.or_(low, builder.shl(high, const_vec(I32, [4] * 8)))
    return builder.sub(ls, const_vec(I32, [32] * 8))


def _make_xs_rowdot(n_tok):
    @intrinsic
    def rowdot(typingctx, w, xq, xd, bsums, t0):
        """IQ4_XS row . Q8_K activations of tokens t0..t0+n_tok-1: Σ_b d_w*d_x*Σ_j (ls_j - 32)*Σ level*xq.

        w: uint8 (row_bytes,); xq: int8 (n_tok_all, cols); xd: float32 (n_tok_all, cols/256); bsums unused
        (IQ4_XS has no mins). A super-block's lanes sum 8 sub-blocks of 4 products each: |lane| <= 8*32*4*127*127
        < 2**24, exact in int32 and in its float32 conversion.
        Returns a tuple of n_tok float32.
        """
        sig = types.UniTuple(types.float32, n_tok)(w, xq, xd, bsums, t0)

        def codegen(context, builder, sig, args):
            wd = array_data(context, builder, sig.args[0], args[0])
            acts, toks = _token_rows(context, builder, sig, args, n_tok)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(V8F, [0.0] * 8)) for _ in toks]
            with cgutils.for_range(builder, acts.n_blocks) as loop:
                blk = loop.index
                o = builder.mul(blk, i64(XS_BYTES))
                prefetch(builder, wd, o, XS_BYTES)
                d = load_half(builder, wd, o)
                scales = _xs_scales(builder, wd, o)
                xo = builder.mul(blk, i64(256))
                isums = [ir.Constant(V8I, [0] * 8) for _ in toks]
                for j in range(8):  # sub-block j: elements 32j..32j+31, quant bytes 8+16j..8+16j+15
                    halves = _levels(builder, wd, builder.add(o, i64(8 + 16 * j)))
                    sc = splat(builder, builder.extract_element(scales, ir.Constant(I32, j)), 8)
                    for i, (xqd, _) in enumerate(toks):
                        part = _dot32(builder, halves, xqd, builder.add(xo, i64(32 * j)))
                        isums[i] = builder.add(isums[i], builder.mul(sc, part))
                for (_, xdd), acc, isum in zip(toks, accs, isums):
                    dx = builder.load(builder.gep(xdd, [blk]))
                    part = builder.fmul(splat(builder, builder.fmul(d, dx), 8), builder.sitofp(isum, V8F))
                    builder.store(builder.fadd(builder.load(acc), part), acc)
            totals = [reduce_f(builder, builder.load(a), 8) for a in accs]
            return context.make_tuple(builder, sig.return_type, totals)

        return sig, codegen

    rowdot.__name__ = f"rowdot{n_tok}_iq4_xs"
    return rowdot


# name -> simd.fused_kernel's row dots: (rowdot1, .., rowdot4, rowdot8); MXFP4's block32_prompt ones for every count 1-8
ROWDOTS = {
    "iq4_nl": tuple(_make_nl_rowdot(n) for n in ROW_TOKENS),
    "iq4_xs": tuple(_make_xs_rowdot(n) for n in ROW_TOKENS),
    "mxfp4": block32_prompt.ROWDOTS["mxfp4"],
}

mul_iq4_nl = fused_kernel(
    "mul_iq4_nl",
    "IQ4_NL block (18 B): d f16, qs[16]; y = d*KVALUES_IQ4NL[q] (Q8_0 activations).",
    quantize_q8_0,
    ROWDOTS["iq4_nl"],
    __name__,
)
mul_iq4_xs = fused_kernel(
    "mul_iq4_xs",
    "IQ4_XS super-block (136 B): d f16; scales_h u16; scales_l[4]; qs[128]; "
    "y = d*(ls - 32)*KVALUES_IQ4NL[q] (Q8_K activations).",
    quantize_q8_k,
    ROWDOTS["iq4_xs"],
    __name__,
)
mul_mxfp4 = fused_kernel(
    "mul_mxfp4",
    "MXFP4 block (17 B): e (E8M0), qs[16]; y = 2^(e - 128)*KVALUES_MXFP4[q] (Q8_0 activations, laid "
    "out as block32_prompt's Q5_0 kernel reads them).",
    block32_prompt.QUANTIZE["mxfp4"],
    ROWDOTS["mxfp4"],
    __name__,
)
