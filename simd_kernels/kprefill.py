"""The Q4_K prompt kernel: a prompt piece's tokens against Q4_K weights, with activations laid out for it.

`prefill_q4_k(w, xq, xd, sums, out)` takes actquant.quantize_q8_k_interleaved's activations. Its numbers are its
own (a row sums its lanes in another order than the per-row kernel, kquants.mul_q4_k), so it serves only a prompt's
pieces, whose path depends on the prompt alone (localrt.engine.backends.backend); within it, a token's result does
not depend on the other tokens of the call.

Why a kernel of its own: the per-row kernel scales each 32-element sub-block's pair sums (vpmaddubsw, then
vpdpwssd by the scale), two multiplies per 32 products. Here a super-block's quants are reordered in registers so
that every 32-bit lane holds four elements of one sub-block and lane k of all four registers of a kind the same
sub-block: register (m, h), m = 0..3, h = 0 (low nibbles, even sub-blocks) or 1 (high, odd), holds in dword i of
128-bit lane L elements 4m..4m+3 (+16 for L = 1) of sub-block 2i+h. The four registers of a kind then take one
chain of vpdpbusd (at most 16*15*127 < 2^15 a lane), and one vpdpwssd per kind applies the scales: 10 multiplies
per 256 products where the per-row kernel has 16. The min term (Σ_j m_j * sum_j) is taken for all the call's tokens
at once, token-minor (vpmaddwd over token pairs of sub-block sums), not once per token.

Measured (2048 x 2048 and 8192 x 2048 Q4_K of a 1B file, 128 tokens, 1 thread, the activations quantized): 60 ->
105 GMAC/s against the per-row kernel's 8 tokens a pass. Half of that came from the loop order: the tokens go 8 at
a time through all of a call's rows, so their activations stay in L1 (the per-row kernel's 64 tokens a row read
them from L2).
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .actquant import quantize_q8_k_interleaved
from .ksimd import _k4_scales_mins
from .simd import (
    _F32,
    _I8,
    _I16,
    _I32,
    _V8F,
    _V8I,
    _V16S,
    _X86,
    _c,
    _const_vec,
    _data,
    _intrinsic,
    _load_half,
    _load_vec,
    _prefetch,
    _reduce_f,
    _shuffle,
    _splat,
    _vnni,
)

_VNNI = {"avx512vnni", "avx512vl"} <= _X86
_V16I = ir.VectorType(_I32, 16)
_BLOCK = 144  # bytes of a Q4_K super-block


def _decode(builder, wd, o):
    """The super-block at o: ([(low, high) <32 x i8> quants of register m] for m = 0..3, the scale dwords of the
    even and odd kinds (lane k: sc of sub-block 2(k%4) (+1), low word only), the mins as <16 x i16> (lane l:
    m_{l//2}), d and -dmin splatted)."""
    d = _load_half(builder, wd, o)
    dmin = _load_half(builder, wd, builder.add(o, _c(2)))
    scales, mins = _k4_scales_mins(builder, wd, builder.add(o, _c(4)))
    s_even = _shuffle(builder, scales, scales, [0, 2, 4, 6] * 2)
    s_odd = _shuffle(builder, scales, scales, [1, 3, 5, 7] * 2)
    m16 = builder.trunc(_shuffle(builder, mins, mins, [k // 2 for k in range(16)]), _V16S)
    # chunk c (32 bytes): low nibbles sub-block 2c, high 2c+1; dword j = elements 4j..4j+3. A 4 x 8 dword transpose
    # gives register m the dwords m and m+4 of the four chunks.
    c = [builder.bitcast(_load_vec(builder, wd, builder.add(o, _c(16 + 32 * k)), 32), _V8I) for k in range(4)]
    dwords_lo, dwords_hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]  # vpunpck{l,h}dq
    lo01, hi01 = (_shuffle(builder, c[0], c[1], idx) for idx in (dwords_lo, dwords_hi))
    lo23, hi23 = (_shuffle(builder, c[2], c[3], idx) for idx in (dwords_lo, dwords_hi))
    even, odd = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]  # vpunpck{l,h}qdq
    regs = [_shuffle(builder, lo01, lo23, even), _shuffle(builder, lo01, lo23, odd),
            _shuffle(builder, hi01, hi23, even), _shuffle(builder, hi01, hi23, odd)]
    low4 = _const_vec(_I8, [15] * 32)
    quants = []
    for r in regs:
        v = builder.bitcast(r, ir.VectorType(_I8, 32))
        quants.append((builder.and_(v, low4), builder.and_(builder.lshr(v, _const_vec(_I8, [4] * 32)), low4)))
    return quants, s_even, s_odd, m16, _splat(builder, d, 8), builder.fneg(dmin)


def _kind_lanes(builder, quants, h, xqd, xo):
    """Σ over registers (m, h) of q . x per 32-bit lane (four elements of one sub-block each, exact) -> <8 x i32>."""
    zero = ir.Constant(_V8I, [0] * 8)
    if _VNNI:
        acc = zero
        for m in range(4):
            acc = _vnni(builder, acc, quants[m][h], _load_vec(builder, xqd, builder.add(xo, _c(32 * (2 * m + h))), 32))
        return acc
    pairs = None  # <16 x i16> pair sums, at most 4*2*15*127 < 2^15
    for m in range(4):
        q, xv = quants[m][h], _load_vec(builder, xqd, builder.add(xo, _c(32 * (2 * m + h))), 32)
        if "avx2" in _X86:
            p = _intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [q, xv])
        else:
            v32 = ir.VectorType(_I16, 32)
            w = builder.mul(builder.zext(q, v32), builder.sext(xv, v32))
            p = builder.add(_shuffle(builder, w, w, range(0, 32, 2)), _shuffle(builder, w, w, range(1, 32, 2)))
        pairs = p if pairs is None else builder.add(pairs, p)
    wide = builder.sext(pairs, _V16I)
    return builder.add(_shuffle(builder, wide, wide, range(0, 16, 2)), _shuffle(builder, wide, wide, range(1, 16, 2)))


def _scaled(builder, acc, lanes, scales):
    """acc + lanes * scales per 32-bit lane (|lanes| < 2^15, scales 0..63): one vpdpwssd of the lane's low word."""
    if _VNNI:
        return _intrinsic(builder, "llvm.x86.avx512.vpdpwssd.256", _V8I, [acc, lanes, scales])
    return builder.add(acc, builder.mul(lanes, scales))


def _pair_dots(builder, sums, pairs, n_tok):
    """<2n x i16> sums (token t: s_a, s_b) . <2n x i16> pairs (m_a, m_b) -> <n x i32> (exact)."""
    if n_tok == 8 and "avx2" in _X86:
        return _intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [sums, pairs])
    wide = ir.VectorType(_I32, 2 * n_tok)
    p = builder.mul(builder.sext(sums, wide), builder.sext(pairs, wide))
    return builder.add(_shuffle(builder, p, p, range(0, 2 * n_tok, 2)), _shuffle(builder, p, p, range(1, 2 * n_tok, 2)))


def _fma(builder, a, b, c):
    n = a.type.count
    return _intrinsic(builder, f"llvm.fma.v{n}f32", ir.VectorType(_F32, n), [a, b, c])


def _row_loop(context, builder, sig, args, n_tok):
    """One Q4_K row against tokens t0..t0+n_tok-1 -> n_tok float32: per super-block, per token
    acc += d*dx * (Σ lanes of the scaled dots) in 8 float lanes; the min term -dmin*dx * Σ_j m_j*sum_j in one
    float lane per token; a token's value is acc[0] + .. + acc[7] + its min lane."""
    wd = _data(context, builder, sig.args[0], args[0])
    arrays = []
    for k in (1, 2, 3):
        a = context.make_array(sig.args[k])(context, builder, args[k])
        arrays.append((a.data, cgutils.unpack_tuple(builder, a.strides, sig.args[k].ndim),
                       cgutils.unpack_tuple(builder, a.shape, sig.args[k].ndim)))
    (xq, (xq_s, _), _), (xd, (xd_s, _), (n_blocks, _)), (sums, (s_blk, s_k, _, _), _) = arrays
    t0 = args[4] if args[4].type.width == 64 else builder.sext(args[4], ir.IntType(64))
    i8p = _I8.as_pointer()

    def at(base, offset, ty):  # typed pointer to base + offset bytes
        return builder.bitcast(builder.gep(builder.bitcast(base, i8p), [offset]), ty.as_pointer())

    tok = [builder.add(t0, _c(k)) for k in range(n_tok)]
    rows = [at(xq, builder.mul(t, xq_s), _I8) for t in tok]
    accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8)) for _ in tok]
    vnf = ir.VectorType(_F32, n_tok)
    vns = ir.VectorType(_I16, 2 * n_tok)
    macc = cgutils.alloca_once_value(builder, ir.Constant(vnf, [0.0] * n_tok))  # token t's min term in lane t
    zero = ir.Constant(_V8I, [0] * 8)
    with cgutils.for_range(builder, n_blocks) as loop:
        blk = loop.index
        o = builder.mul(blk, _c(_BLOCK))
        _prefetch(builder, wd, o, _BLOCK)
        quants, s_even, s_odd, m16, dv, ndmin = _decode(builder, wd, o)
        xo = builder.mul(blk, _c(256))
        dxs = builder.load(at(xd, builder.add(builder.mul(blk, xd_s), builder.mul(t0, _c(4))), vnf), align=4)
        for k, (xqd, acc) in enumerate(zip(rows, accs)):
            lanes = _scaled(builder, _scaled(builder, zero, _kind_lanes(builder, quants, 0, xqd, xo), s_even),
                            _kind_lanes(builder, quants, 1, xqd, xo), s_odd)
            dx = _splat(builder, builder.extract_element(dxs, ir.Constant(_I32, k)), 8)
            builder.store(_fma(builder, dx, builder.fmul(builder.sitofp(lanes, _V8F), dv), builder.load(acc)), acc)
        mt = None  # <n x i32>: Σ_j m_j * sum_j of each token
        base = builder.add(builder.mul(blk, s_blk), builder.mul(t0, _c(4)))
        for k in range(4):
            part = _pair_dots(builder, builder.load(at(sums, builder.add(base, builder.mul(_c(k), s_k)), vns), align=2),
                              _shuffle(builder, m16, m16, [4 * k, 4 * k + 2] * n_tok), n_tok)
            mt = part if mt is None else builder.add(mt, part)
        scale = builder.fmul(dxs, _splat(builder, ndmin, n_tok))
        builder.store(_fma(builder, scale, builder.sitofp(mt, vnf), builder.load(macc)), macc)
    mins = builder.load(macc)
    return [builder.fadd(_reduce_f(builder, builder.load(a), 8), builder.extract_element(mins, ir.Constant(_I32, k)))
            for k, a in enumerate(accs)]


def _make_rowdot(n_tok):
    @intrinsic
    def rowdot(typingctx, w, xq, xd, sums, t0):
        """One Q4_K row . tokens t0..t0+n_tok-1 of quantize_q8_k_interleaved's activations -> n_tok float32.

        w: uint8 (row_bytes,); xq: int8 (n_tok_all, cols); xd: float32 (cols/256, n_tok_all);
        sums: int16 (cols/256, 4, n_tok_all, 2)."""
        sig = types.UniTuple(types.float32, n_tok)(w, xq, xd, sums, t0)

        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, sig.return_type, _row_loop(context, builder, sig, args, n_tok))

        return sig, codegen

    rowdot.__name__ = f"rowdot{n_tok}_q4_k_interleaved"
    return rowdot


_rowdot1, _rowdot2, _rowdot3, _rowdot4, _rowdot8 = (_make_rowdot(n) for n in (1, 2, 3, 4, 8))


@njit(inline="always")
def _tail(row, xq, xd, sums, t, t1, out, r):
    # out[t:t1, r] for the last 1-7 tokens: one pass of 4, then one of 1-3
    if t + 4 <= t1:
        out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = _rowdot4(row, xq, xd, sums, t)
        t += 4
    left = t1 - t
    if left == 3:
        out[t, r], out[t + 1, r], out[t + 2, r] = _rowdot3(row, xq, xd, sums, t)
    elif left == 2:
        out[t, r], out[t + 1, r] = _rowdot2(row, xq, xd, sums, t)
    elif left == 1:
        (out[t, r],) = _rowdot1(row, xq, xd, sums, t)


@njit(cache=True, nogil=True, parallel=True)
def prefill_q4_k(w, xq, xd, sums, out):
    """out = x @ dequant(w).T for a prompt piece: w uint8 (rows, row_bytes) Q4_K blocks; xq, xd, sums from
    actquant.quantize_q8_k_interleaved(x (n_tok, cols)); out float32 (n_tok, rows). Tokens go 8 at a time through
    every row (their activations stay in L1), the last 1-7 in one more pass."""
    n = xq.shape[0]
    n8 = n - n % 8
    for t in range(0, n8, 8):
        for r in prange(w.shape[0]):
            (out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r], out[t + 4, r], out[t + 5, r], out[t + 6, r],
             out[t + 7, r]) = _rowdot8(w[r], xq, xd, sums, t)
    if n8 < n:
        for r in prange(w.shape[0]):
            _tail(w[r], xq, xd, sums, n8, n, out, r)


PREFILL_Q4_K = (quantize_q8_k_interleaved, prefill_q4_k)  # api.PREFILL's entry: (quantize, kernel)
