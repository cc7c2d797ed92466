"""Prompt kernels for Q4_K, Q5_K and Q6_K: a prompt piece's tokens against the weights, activations laid out for them.

`prefill_<fmt>(w, xq, xd, sums, out)` takes `PREFILL_<FMT>[0](x)`'s activations (actquant's Q8_K with each
super-block's dwords reordered). Their numbers are their own (a row sums its lanes in another order than the per-row
kernels of kquants), so they serve only a prompt's pieces, whose path depends on the prompt alone
(localrt.engine.backends.backend); within a call, a token's result does not depend on the other tokens.

Why kernels of their own: the per-row kernels scale each piece's pair sums (vpmaddubsw, then vpdpwssd by the
scale), two multiplies per 32 products. Here a super-block's quants are reordered in registers (a 4 x 8 dword
transpose, `ir.transpose4`) so that each 32-bit lane of a register holds four elements of one scale's group, and
registers (m, 0) and (m, 1) pair up as one 512-bit register whose 16 lanes are 16 groups (their activations are
the 64 bytes at 64m, laid out so by actquant). A token then takes four 512-bit vpdpbusd a super-block, one convert,
one multiply by the lanes' scale * d and one FMA by its own scale (an embedded broadcast). The terms that depend
only on a token's group sums (Q4_K's and Q5_K's mins, Q6_K's -32) are taken for all the call's tokens at once,
token-minor (vpmaddwd over token pairs), not once per token. Tokens go 16 at a time through all of a call's rows, so
a super-block is decoded once per 16 tokens, and their activations stay in L1 (L2 for 8192 columns). A token's work is
all 512-bit (a 512-bit instruction mixed into 256-bit work stops port 1's vector work, which cost the 256-bit
kernels before). The activations sit at 64-byte boundaries (`actquant.empty_64`): a load across two cache
lines cost a measurable share.

The figures behind this form are in docs/measurements.md.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .actquant import Q4K_DWORDS, Q6K_DWORDS, quantize_q8_k_interleaved
from .jit import njit
from .ir import (
    F32,
    I8,
    I16,
    I32,
    V8I,
    VNNI,
    X86,
    array_data,
    call_intrinsic,
    const_vec,
    fma,
    i64,
    lane_dots,
    load_half,
    load_vec,
    prefetch,
    shuffle,
    splat,
    transpose4,
    tree16,
)
from .kquants_rowdots import k4_scales_mins, q6k_decode8
from .prefill import prefill_kernel


def _bytes(builder, v):
    return builder.bitcast(v, ir.VectorType(I8, 32))


def _k45_kinds(builder, wd, o, qs, qh):
    """Q4_K's (qh None) or Q5_K's super-block at o -> (d, dmin, scales <8 x i32>, mins <8 x i32>, kinds): kinds[h][m],
    register (m, h), holds the low (h = 0: even sub-blocks) or high (odd) nibbles of transposed chunk m at qs, its lane
    k being sub-block 2(k % 4) + h; with qh, each quant's fifth bit too (0..31)."""
    d = load_half(builder, wd, o)
    dmin = load_half(builder, wd, builder.add(o, i64(2)))
    scales, mins = k4_scales_mins(builder, wd, builder.add(o, i64(4)))
    # chunk c (32 bytes): low nibbles sub-block 2c, high 2c+1; dword j = elements 4j..4j+3 of both
    regs = transpose4(
        builder, [builder.bitcast(load_vec(builder, wd, builder.add(o, i64(qs + 32 * c)), 32), V8I) for c in range(4)]
    )
    # qh (32 bytes): bit j of byte l is the fifth bit of element 32j + l. Register m's bytes are elements l = 4m..4m+3
    # (+16 in lane 1) of sub-block 2i + h in dword i, so its fifth bits are qh's dword m (m + 4) in every dword, bit
    # 2i + h of each byte moved to bit 4 (32-bit shifts by under 8 stay in the byte).
    high = None if qh is None else builder.bitcast(load_vec(builder, wd, builder.add(o, i64(qh)), 32), V8I)
    low4, four, sixteen = (const_vec(I8, [v] * 32) for v in (15, 4, 16))
    kinds = [[], []]
    for m, r in enumerate(regs):
        v = _bytes(builder, r)
        for h, q in enumerate((builder.and_(v, low4), builder.and_(builder.lshr(v, four), low4))):
            if high is not None:
                dwords = shuffle(builder, high, high, [m] * 4 + [m + 4] * 4)
                bits = [2 * (k % 4) + h for k in range(8)]
                left = builder.shl(dwords, const_vec(I32, [max(0, 4 - b) for b in bits]))
                right = builder.lshr(dwords, const_vec(I32, [max(0, b - 4) for b in bits]))
                moved = builder.select(const_vec(ir.IntType(1), [b <= 4 for b in bits]), left, right)
                q = builder.or_(q, builder.and_(_bytes(builder, moved), sixteen))
            kinds[h].append(q)
    return d, dmin, scales, mins, kinds


_LANES = ir.VectorType(I32, 16)  # a register pair's lanes: register (m, 0)'s eight, then (m, 1)'s
_V16F = ir.VectorType(F32, 16)


class _Q4K:
    """Q4_K: register (m, h) = 2m + h (_k45_kinds); lane k of a pair is sub-block 2(k % 4) + (k >= 8). The lanes
    (|lanes| < 2^15) times scale * d (exact: 6 by 11 bits) as floats. The min term's pairs are the mins of
    sub-blocks 2k, 2k+1, times -dmin."""

    block = 144
    pairs = 4  # pairs of sums a super-block: 32-element sub-blocks
    i16_group = 4  # four registers' vpmaddubsw pair sums stay below 2^15 (4*2*15*127)

    @staticmethod
    def decode(builder, wd, o):
        """-> (the four register pairs [(register (m, 0), register (m, 1)), <32 x i8> each], value(lanes <16 x
        i32>) -> <16 x float>, the pairs' weights <2*pairs x i16>, the pairs' float factor)."""
        return _k45_decode(builder, wd, o, 16, None)


def _pairs(kinds):
    """kinds[h][m] = register (m, h) -> [(register (m, 0), register (m, 1))] x 4."""
    return [(kinds[0][m], kinds[1][m]) for m in range(4)]


class _Q5K:
    """Q5_K: Q4_K's registers with each quant's fifth bit (0..31), so a lane sums up to 16*31*127 (exact as a
    float); the pairs are Q4_K's."""

    block = 176
    pairs = 4
    i16_group = 1

    @staticmethod
    def decode(builder, wd, o):
        return _k45_decode(builder, wd, o, 48, 16)


def _k45_decode(builder, wd, o, qs, qh):
    """_Q4K.decode, _Q5K.decode: the quants at qs (and fifth bits at qh)."""
    d, dmin, scales, mins, kinds = _k45_kinds(builder, wd, o, qs, qh)
    s16 = shuffle(builder, scales, scales, [0, 2, 4, 6] * 2 + [1, 3, 5, 7] * 2)  # the lanes' scales
    sd = builder.fmul(builder.sitofp(s16, _V16F), splat(builder, d, 16))

    def value(lanes):  # lanes * (scale * d)
        return builder.fmul(builder.sitofp(lanes, _V16F), sd)

    return _pairs(kinds), value, builder.trunc(mins, ir.VectorType(I16, 8)), builder.fneg(dmin)


class _Q6K:
    """Q6_K: register (m, h) = 2m + h, h the 128-element half; lane k of a pair is the 16-element group
    8(k >= 8) + 2(k % 4) + (k % 8 >= 4). Quants 0..63 (the -32 goes to the pairs term): a lane sums up to
    16*63*127, past 16 bits, so the scales multiply the lanes as floats (exact: < 2^24 before d). The pairs are the
    scales of groups 2k, 2k+1, times -32*d."""

    block = 210
    pairs = 8  # pairs of sums a super-block: 16-element groups
    i16_group = 1

    @staticmethod
    def decode(builder, wd, o):
        (d, sc16), pieces = q6k_decode8(builder, wd, o)  # natural 32-element pieces, 0..63
        kinds = [
            [
                _bytes(builder, r)
                for r in transpose4(builder, [builder.bitcast(q, V8I) for q, _ in pieces[4 * h : 4 * h + 4]])
            ]
            for h in range(2)
        ]
        groups = [8 * h + g for h in range(2) for g in (0, 2, 4, 6, 1, 3, 5, 7)]
        sd = builder.fmul(builder.sitofp(shuffle(builder, sc16, sc16, groups), _V16F), splat(builder, d, 16))

        def value(lanes):  # lanes * (scale * d)
            return builder.fmul(builder.sitofp(lanes, _V16F), sd)

        return _pairs(kinds), value, sc16, builder.fmul(d, ir.Constant(F32, -32.0))


def _pair_lanes(builder, fmt, regs, xqd, xo):
    """Σ over the four register pairs of q . x per 32-bit lane (four elements each, exact) -> <16 x i32>. The
    activations of registers (m, 0), (m, 1) are the 64 bytes at 64m: with VNNI one 512-bit vpdpbusd a pair, else
    each half as eight lanes of its own."""
    if VNNI:  # one chain: the 16 tokens of a pass are 16 chains (two chains of two measured slower)
        acc = ir.Constant(_LANES, [0] * 16)
        for m, (q0, q1) in enumerate(regs):
            q = shuffle(builder, q0, q1, range(64))
            xv = load_vec(builder, xqd, builder.add(xo, i64(64 * m)), 64)
            args = [acc, builder.bitcast(q, _LANES), builder.bitcast(xv, _LANES)]
            acc = call_intrinsic(builder, "llvm.x86.avx512.vpdpbusd.512", _LANES, args)
        return acc
    halves = []
    for h in range(2):
        xs = [load_vec(builder, xqd, builder.add(xo, i64(64 * m + 32 * h)), 32) for m in range(4)]
        halves.append(
            lane_dots(builder, [pair[h] for pair in regs], xs, ir.Constant(V8I, [0] * 8), i16_group=fmt.i16_group)
        )
    return shuffle(builder, halves[0], halves[1], range(16))


def _pair_dots(builder, sums, pairs, n_tok):
    """<2n x i16> sums (token t: s_a, s_b) . <2n x i16> pairs (w_a, w_b) -> <n x i32> (exact)."""
    if n_tok == 8 and "avx2" in X86:
        return call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", V8I, [sums, pairs])
    wide = ir.VectorType(I32, 2 * n_tok)
    p = builder.mul(builder.sext(sums, wide), builder.sext(pairs, wide))
    return builder.add(shuffle(builder, p, p, range(0, 2 * n_tok, 2)), shuffle(builder, p, p, range(1, 2 * n_tok, 2)))


def _row_loop(context, builder, sig, args, fmt, n_tok):
    """One row against tokens t0..t0+n_tok-1 -> n_tok float32: per super-block, per token acc += dx * value(the
    register pairs' lanes) in 16 float lanes; the pairs term (Σ_k pair weights . sums) * factor * dx in
    one float lane per token, for the n_tok tokens at once; a token's result is its acc summed as a tree (ir.tree16)
    plus its pairs lane."""
    wd = array_data(context, builder, sig.args[0], args[0])
    arrays = []
    for k in (1, 2, 3):
        a = context.make_array(sig.args[k])(context, builder, args[k])
        arrays.append(
            (
                a.data,
                cgutils.unpack_tuple(builder, a.strides, sig.args[k].ndim),
                cgutils.unpack_tuple(builder, a.shape, sig.args[k].ndim),
            )
        )
    (xq, (xq_s, _), _), (xd, (xd_s, _), (n_blocks, _)), (sums, (s_blk, s_k, _, _), _) = arrays
    t0 = args[4] if args[4].type.width == 64 else builder.sext(args[4], ir.IntType(64))
    i8p = I8.as_pointer()

    def at(base, offset, ty):  # typed pointer to base + offset bytes
        return builder.bitcast(builder.gep(builder.bitcast(base, i8p), [offset]), ty.as_pointer())

    rows = [at(xq, builder.mul(builder.add(t0, i64(k)), xq_s), I8) for k in range(n_tok)]
    accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * 16)) for _ in rows]
    vnf = ir.VectorType(F32, n_tok)
    vns = ir.VectorType(I16, 2 * n_tok)
    pacc = cgutils.alloca_once_value(builder, ir.Constant(vnf, [0.0] * n_tok))  # token t's pairs term in lane t
    with cgutils.for_range(builder, n_blocks) as loop:
        blk = loop.index
        o = builder.mul(blk, i64(fmt.block))
        prefetch(builder, wd, o, fmt.block)
        regs, value, weights, factor = fmt.decode(builder, wd, o)
        xo = builder.mul(blk, i64(256))
        dx_at = builder.add(builder.mul(blk, xd_s), builder.mul(t0, i64(4)))
        for k, (xqd, acc) in enumerate(zip(rows, accs)):
            v = value(_pair_lanes(builder, fmt, regs, xqd, xo))
            dx = splat(builder, builder.load(at(xd, builder.add(dx_at, i64(4 * k)), F32)), 16)  # a broadcast load
            builder.store(fma(builder, dx, v, builder.load(acc)), acc)
        dxs = builder.load(at(xd, dx_at, vnf), align=4)
        total = None  # <n x i32>: Σ_k weights of pair k . sums of pair k, per token
        base = builder.add(builder.mul(blk, s_blk), builder.mul(t0, i64(4)))
        for k in range(fmt.pairs):
            pair = _pair_dots(
                builder,
                builder.load(at(sums, builder.add(base, builder.mul(i64(k), s_k)), vns), align=2),
                shuffle(builder, weights, weights, [2 * k, 2 * k + 1] * n_tok),
                n_tok,
            )
            total = pair if total is None else builder.add(total, pair)
        scale = builder.fmul(dxs, splat(builder, factor, n_tok))
        builder.store(fma(builder, scale, builder.sitofp(total, vnf), builder.load(pacc)), pacc)
    terms = builder.load(pacc)
    return [
        builder.fadd(tree16(builder, builder.load(a)), builder.extract_element(terms, ir.Constant(I32, k)))
        for k, a in enumerate(accs)
    ]


# xq int8 (n_tok, cols) with each super-block's dwords reordered; xd float32 (cols/256, n_tok); sums int16
# (cols/256, pairs, n_tok, 2): quantize_q8_k_interleaved's
prefill_q4_k = prefill_kernel("q4_k", _Q4K, _row_loop, __name__, 16)
prefill_q5_k = prefill_kernel("q5_k", _Q5K, _row_loop, __name__, 16)
prefill_q6_k = prefill_kernel("q6_k", _Q6K, _row_loop, __name__, 16)


@njit(cache=True, nogil=True)
def quantize_for_q4_k(x):
    """x f32 (n_tok, cols) -> prefill_q4_k's activations (actquant.quantize_q8_k_interleaved)."""
    return quantize_q8_k_interleaved(x, Q4K_DWORDS, 32)


@njit(cache=True, nogil=True)
def quantize_for_q6_k(x):
    """x f32 (n_tok, cols) -> prefill_q6_k's activations (actquant.quantize_q8_k_interleaved)."""
    return quantize_q8_k_interleaved(x, Q6K_DWORDS, 16)


# api.PREFILL's entries: (quantize, kernel)
PREFILL_Q4_K = (quantize_for_q4_k, prefill_q4_k)
PREFILL_Q5_K = (quantize_for_q4_k, prefill_q5_k)  # Q4_K's registers, so its activations
PREFILL_Q6_K = (quantize_for_q6_k, prefill_q6_k)
