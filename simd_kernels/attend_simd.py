"""The attention kernel's inner loops as LLVM vector code (simd_kernels.attend): a query's dots with 16 keys at once,
and the weighted sum of value rows, over a KV cache of float32 or of float16 bits (widened exactly: vcvtph2ps with
F16C).

Why: the kernel's own loops summed each key's dot as a horizontal reduction of its own (a dependent shuffle-and-add
chain per key) and accumulated the value rows through memory; 16 keys' dots are reduced together as a transpose
(15 vector adds for 16 keys), and four 16-element chunks of the output stay in registers over the keys (measured:
docs/measurements.md). A key's dot is the same sum whether it is taken with 15 others or alone (`key_dot1`): its 16
lanes over the head's 16-element chunks, then a tree of halves; a value element's sum is the same chain of FMAs
however the keys are split into calls.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .ir import F32, I8, I16, I32, call_intrinsic, i64, shuffle, splat

LANES = 16  # float32 lanes of a vector: a head's dims go 16 at a time
_V16F = ir.VectorType(F32, LANES)
_CACHE = (types.uint16, types.float32)  # a cache's element types: float16 bits, or float32


def _ptr(builder, base, offset, ty):
    return builder.bitcast(builder.gep(builder.bitcast(base, I8.as_pointer()), [offset]), ty.as_pointer())


def _load16(builder, base, offset, half):
    """16 cache elements at base + offset bytes as <16 x float> (float16 bits widened exactly, or float32)."""
    if half:
        v = builder.load(_ptr(builder, base, offset, ir.VectorType(I16, LANES)), align=2)
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), LANES)), _V16F)
    return builder.load(_ptr(builder, base, offset, _V16F), align=4)


def _fma(builder, a, b, c):
    return call_intrinsic(builder, "llvm.fma.v16f32", _V16F, [a, b, c])


def _halves(builder, accs):
    """16 vectors (or one) of 16 partial sums -> one vector whose lane u is the sum of vector u's lanes, each summed as
    a tree of halves (lanes l and l + 8, then + 4, + 2, + 1), as one vector alone is (its sum in lane 0). Each level
    adds the lower and the upper half of every key's partial sums, two vectors' keys into one vector."""
    groups, width, keys = list(accs), LANES, 1  # each vector: `keys` keys of `width` partial sums
    while width > 1:
        half = width // 2
        nxt = []
        for a, b in zip(groups[0::2], groups[1::2]) if len(groups) > 1 else [(groups[0], groups[0])]:
            lo = [i * width + l for i in range(keys) for l in range(half)]
            lo += [LANES + i * width + l for i in range(keys) for l in range(half)]
            hi = [x + half for x in lo]
            nxt.append(builder.fadd(shuffle(builder, a, b, lo), shuffle(builder, a, b, hi)))
        groups, width, keys = nxt, half, keys * 2
    return groups[0]


def _args(context, builder, sig, args):
    q = context.make_array(sig.args[0])(context, builder, args[0])
    k = context.make_array(sig.args[1])(context, builder, args[1])
    qs = cgutils.unpack_tuple(builder, q.strides, 3)
    hd = cgutils.unpack_tuple(builder, q.shape, 3)[2]
    ks = cgutils.unpack_tuple(builder, k.strides, 4)
    return q, k, qs, hd, ks


@intrinsic
def key_dots16(typingctx, q, k, scores, t, h, b, kvh, r, j, scale):
    """scores[j + u] = scale * q[t, h] . k[b, kvh, r + u] for u < 16 (head_dim a multiple of 16), each dot's lanes
    summed as key_dot1 sums its one."""
    if k.dtype not in _CACHE or q.dtype != types.float32 or scale != types.float32:
        return None
    half = k.dtype == types.uint16
    sig = types.none(q, k, scores, t, h, b, kvh, r, j, scale)

    def codegen(context, builder, sig, args):
        qa, ka, qs, hd, ks = _args(context, builder, sig, args)
        sa = context.make_array(sig.args[2])(context, builder, args[2])
        t_, h_, b_, kvh_, r_, j_ = (builder.sext(a, ir.IntType(64)) if a.type.width < 64 else a for a in args[3:9])
        qo = builder.add(builder.mul(t_, qs[0]), builder.mul(h_, qs[1]))
        ko = builder.add(builder.add(builder.mul(b_, ks[0]), builder.mul(kvh_, ks[1])), builder.mul(r_, ks[2]))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * LANES)) for _ in range(LANES)]
        elem = 2 if half else 4
        with cgutils.for_range(builder, builder.udiv(hd, i64(LANES))) as loop:
            c = loop.index
            qv = builder.load(_ptr(builder, qa.data, builder.add(qo, builder.mul(c, i64(64))), _V16F), align=4)
            kc = builder.add(ko, builder.mul(c, i64(LANES * elem)))
            for u in range(LANES):
                kv = _load16(builder, ka.data, builder.add(kc, builder.mul(i64(u), ks[2])), half)
                builder.store(_fma(builder, qv, kv, builder.load(accs[u])), accs[u])
        tot = _halves(builder, [builder.load(a) for a in accs])
        tot = builder.fmul(tot, splat(builder, args[9], LANES))
        builder.store(tot, _ptr(builder, sa.data, builder.mul(j_, i64(4)), _V16F), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def key_dot1(typingctx, q, k, t, h, b, kvh, r):
    """q[t, h] . k[b, kvh, r] (head_dim a multiple of 16): 16 lanes over the head's 16-element chunks, then summed as a
    tree of halves."""
    if k.dtype not in _CACHE or q.dtype != types.float32:
        return None
    half = k.dtype == types.uint16
    sig = types.float32(q, k, t, h, b, kvh, r)

    def codegen(context, builder, sig, args):
        qa, ka, qs, hd, ks = _args(context, builder, sig, args)
        t_, h_, b_, kvh_, r_ = (builder.sext(a, ir.IntType(64)) if a.type.width < 64 else a for a in args[2:7])
        qo = builder.add(builder.mul(t_, qs[0]), builder.mul(h_, qs[1]))
        ko = builder.add(builder.add(builder.mul(b_, ks[0]), builder.mul(kvh_, ks[1])), builder.mul(r_, ks[2]))
        acc = cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * LANES))
        elem = 2 if half else 4
        with cgutils.for_range(builder, builder.udiv(hd, i64(LANES))) as loop:
            c = loop.index
            qv = builder.load(_ptr(builder, qa.data, builder.add(qo, builder.mul(c, i64(64))), _V16F), align=4)
            kv = _load16(builder, ka.data, builder.add(ko, builder.mul(c, i64(LANES * elem))), half)
            builder.store(_fma(builder, qv, kv, builder.load(acc)), acc)
        tot = _halves(builder, [builder.load(acc)])
        return builder.extract_element(tot, ir.Constant(I32, 0))

    return sig, codegen


@intrinsic
def mix_values(typingctx, v, w, out, t, h, b, kvh, r, j, n):
    """out[t, h] += Σ_{i < n} w[j + i] * v[b, kvh, r + i] (head_dim_v a multiple of 64), key by key in order: each
    element's sum is the same chain of FMAs however the keys are split into calls. Four 16-element chunks go through
    the keys together, four independent chains."""
    if v.dtype not in _CACHE or w.dtype != types.float32 or out.dtype != types.float32:
        return None
    half = v.dtype == types.uint16
    sig = types.none(v, w, out, t, h, b, kvh, r, j, n)

    def codegen(context, builder, sig, args):
        va = context.make_array(sig.args[0])(context, builder, args[0])
        wa = context.make_array(sig.args[1])(context, builder, args[1])
        oa = context.make_array(sig.args[2])(context, builder, args[2])
        vs = cgutils.unpack_tuple(builder, va.strides, 4)
        hd_v = cgutils.unpack_tuple(builder, va.shape, 4)[3]
        os_ = cgutils.unpack_tuple(builder, oa.strides, 3)
        t_, h_, b_, kvh_, r_, j_, n_ = (builder.sext(a, ir.IntType(64)) if a.type.width < 64 else a for a in args[3:10])
        oo = builder.add(builder.mul(t_, os_[0]), builder.mul(h_, os_[1]))
        vo = builder.add(builder.add(builder.mul(b_, vs[0]), builder.mul(kvh_, vs[1])), builder.mul(r_, vs[2]))
        elem = 2 if half else 4
        accs = [cgutils.alloca_once(builder, _V16F) for _ in range(4)]
        with cgutils.for_range(builder, builder.udiv(hd_v, i64(4 * LANES))) as groups:
            g = groups.index
            optrs = [
                _ptr(builder, oa.data, builder.add(builder.add(oo, builder.mul(g, i64(256))), i64(64 * u)), _V16F)
                for u in range(4)
            ]
            for u in range(4):
                builder.store(builder.load(optrs[u], align=4), accs[u])
            vg = builder.add(vo, builder.mul(g, i64(4 * LANES * elem)))
            with cgutils.for_range(builder, n_) as keys:
                i = keys.index
                wi = splat(
                    builder, builder.load(_ptr(builder, wa.data, builder.mul(builder.add(j_, i), i64(4)), F32)), LANES
                )
                vi = builder.add(vg, builder.mul(i, vs[2]))
                for u in range(4):
                    vv = _load16(builder, va.data, builder.add(vi, i64(u * LANES * elem)), half)
                    builder.store(_fma(builder, wi, vv, builder.load(accs[u])), accs[u])
            for u in range(4):
                builder.store(builder.load(accs[u]), optrs[u], align=4)
        return context.get_dummy_value()

    return sig, codegen
