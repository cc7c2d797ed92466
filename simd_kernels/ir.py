"""The LLVM IR building blocks of the kernels' intrinsics: types, constants, vector shuffles, loads from raw blocks,
prefetch, the activations' pointers, target intrinsics, the int8 lane dots and the block decoders every family
shares. Each takes the llvmlite builder of an intrinsic's codegen and returns the values it built.

Written in generic LLVM IR, so LLVM picks AVX-512, AVX2 or SSE as the host has; the int8 dots alone use x86's
integer dot instructions (VNNI, AVX2) where the host has them (`X86`), summing exactly what the generic code sums.
f16 scales are read as LLVM `half` (one vcvtph2ps with F16C). A leaf: it imports no other module of the package.
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba.core import cgutils

# ---- types, and the x86 instructions the host has ----

I8, I16, I32, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
V8F = ir.VectorType(F32, 8)
V8I = ir.VectorType(I32, 8)
V16S = ir.VectorType(I16, 16)


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
X86 = _host_features()
VNNI = {"avx512vnni", "avx512vl"} <= X86


# ---- constants and vectors ----


def i64(v):
    """The i64 constant v (an offset, an index)."""
    return ir.Constant(ir.IntType(64), v)


def const_vec(elem, values):
    return ir.Constant(ir.VectorType(elem, len(values)), list(values))


def shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, const_vec(I32, idx))


def splat(builder, value, n):
    vt = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(I32, 0))
    return shuffle(builder, one, one, [0] * n)


def reduce_f(builder, vec, n):
    total = builder.extract_element(vec, ir.Constant(I32, 0))
    for i in range(1, n):
        total = builder.fadd(total, builder.extract_element(vec, ir.Constant(I32, i)))
    return total


def tree16(builder, v):
    """<16 x float> -> its sum, halves added lane by lane: (v[0:8] + v[8:16]), then 4, 2, 1."""
    n = 16
    while n > 1:
        n //= 2
        v = builder.fadd(shuffle(builder, v, v, range(n)), shuffle(builder, v, v, range(n, 2 * n)))
    return builder.extract_element(v, ir.Constant(I32, 0))


def transpose4(builder, c):
    """Four <8 x i32> -> four: register m holds dword m of c[0..3] in 128-bit lane 0 (dword i from c[i]) and dword
    m + 4 in lane 1 (vpunpck{l,h}dq, then vpunpck{l,h}qdq)."""
    dwords_lo, dwords_hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo01, hi01 = (shuffle(builder, c[0], c[1], idx) for idx in (dwords_lo, dwords_hi))
    lo23, hi23 = (shuffle(builder, c[2], c[3], idx) for idx in (dwords_lo, dwords_hi))
    even, odd = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    return [
        shuffle(builder, lo01, lo23, even),
        shuffle(builder, lo01, lo23, odd),
        shuffle(builder, hi01, hi23, even),
        shuffle(builder, hi01, hi23, odd),
    ]


# ---- memory: raw blocks, prefetch, the activations ----


def array_data(context, builder, aryty, ary):
    return context.make_array(aryty)(context, builder, ary).data


def byte_ptr(builder, base, offset):
    return builder.gep(builder.bitcast(base, I8.as_pointer()), [offset])


def load_vec(builder, base, offset, n):
    ptr = builder.bitcast(byte_ptr(builder, base, offset), ir.VectorType(I8, n).as_pointer())
    return builder.load(ptr, align=1)


def u32_at(builder, base, offset):
    ptr = builder.bitcast(byte_ptr(builder, base, offset), I32.as_pointer())
    return builder.load(ptr, align=1)


def load_half(builder, base, offset):
    ptr = builder.bitcast(byte_ptr(builder, base, offset), I16.as_pointer())
    return builder.fpext(builder.bitcast(builder.load(ptr, align=1), ir.HalfType()), F32)


# Bytes ahead of the block being decoded that a row dot asks the cache to fetch (prefetcht0). A decode step streams
# each weight from memory once, and the hardware prefetcher alone left the linears well below a plain sum's
# bandwidth; 2048 was the best distance measured (docs/measurements.md).
PREFETCH_AHEAD = 2048


def prefetch(builder, base, offset, nbytes):
    """Hint the cache lines of nbytes from offset + PREFETCH_AHEAD of base (prefetch never faults past the end)."""
    fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    for k in range(0, nbytes, 64):
        ptr = byte_ptr(builder, base, builder.add(offset, i64(PREFETCH_AHEAD + k)))
        builder.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


class Acts:
    """Pointers into one call's activation arrays (2-D, C-contiguous: one row per token)."""

    def __init__(self, context, builder, sig, args, first):
        self.builder = builder
        self.rows = []
        for ty, val in zip(sig.args[first : first + 3], args[first : first + 3]):
            ary = context.make_array(ty)(context, builder, val)
            self.rows.append((ary.data, cgutils.unpack_tuple(builder, ary.strides, 2)[0]))
        xd = context.make_array(sig.args[first + 1])(context, builder, args[first + 1])
        self.n_blocks = cgutils.unpack_tuple(builder, xd.shape, 2)[1]

    def row(self, which, t):
        """Element pointer to row t of activation array which (0: quants, 1: scales, 2: sums)."""
        data, stride = self.rows[which]
        b = self.builder
        return b.bitcast(b.gep(b.bitcast(data, I8.as_pointer()), [b.mul(t, stride)]), data.type)


def token_indices(builder, t0, n_tok):
    t0 = builder.sext(t0, ir.IntType(64)) if t0.type.width < 64 else t0
    return [builder.add(t0, i64(k)) for k in range(n_tok)]


# ---- target intrinsics and the int8 lane dots ----


def call_intrinsic(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def fma(builder, a, b, c):
    n = a.type.count
    return call_intrinsic(builder, f"llvm.fma.v{n}f32", ir.VectorType(F32, n), [a, b, c])


def vnni_dot(builder, acc, a, b):
    """acc + Σ of 4 unsigned a bytes x 4 signed b bytes per i32 lane (lane i: bytes 4i..4i+3), one vpdpbusd."""
    args = [acc, builder.bitcast(a, V8I), builder.bitcast(b, V8I)]
    return call_intrinsic(builder, "llvm.x86.avx512.vpdpbusd.256", V8I, args)


def lane_dots(builder, qs, xs, acc, i16_group=1, wide=False):
    """acc + Σ_k qs[k] . xs[k] per 32-bit lane (<32 x i8> unsigned q, signed x in -127..127; four products a lane;
    exact).

    Without VNNI, AVX2 takes each register's products in pairs (vpmaddubsw, 16-bit) and widens them to the lanes
    (vpmaddwd against ones). `i16_group`: how many consecutive registers' pair sums stay below 2^15 together, so
    that they are added as words and widened once (Q4: 8 registers, 8*2*15*127 < 2^15; Q5: 4).
    `wide`: q passes 127 (Q8_0's q + 128), where vpmaddubsw's pair sums could saturate, and acc holds -128 Σx of
    each lane's elements (the offset the caller takes out): AVX2 then dots the signed q - 128 instead (|q - 128|
    against x with q - 128's sign, vpsignb: the pairs stay within 2*128*127 < 2^15), which is that same integer,
    and leaves acc out."""
    if VNNI:  # two chains of vpdpbusd, added at the end (integers: the same sum), so that one token's dots overlap
        chains = [acc, ir.Constant(acc.type, None)] if len(qs) >= 4 else [acc]
        for i, (q, xv) in enumerate(zip(qs, xs)):
            chains[i % len(chains)] = vnni_dot(builder, chains[i % len(chains)], q, xv)
        return chains[0] if len(chains) == 1 else builder.add(chains[0], chains[1])
    ones = ir.Constant(V16S, [1] * 16)
    v32i8 = ir.VectorType(I8, 32)

    def widen(pairs):
        return call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", V8I, [pairs, ones])

    if "avx2" in X86 and wide:
        lanes = None
        for q, xv in zip(qs, xs):
            signed = builder.xor(q, const_vec(I8, [-128] * 32))  # q - 128 as int8
            # |q - 128| (-128: 128)
            magnitude = call_intrinsic(builder, "llvm.x86.avx2.psign.b", v32i8, [signed, signed])
            x_signed = call_intrinsic(builder, "llvm.x86.avx2.psign.b", v32i8, [xv, signed])  # x with q - 128's sign
            dots = widen(call_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", V16S, [magnitude, x_signed]))
            lanes = dots if lanes is None else builder.add(lanes, dots)
        return lanes
    if "avx2" in X86:
        pairs = [call_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", V16S, [q, xv]) for q, xv in zip(qs, xs)]
        for g in range(0, len(pairs), i16_group):
            words = pairs[g]
            for p in pairs[g + 1 : g + i16_group]:
                words = builder.add(words, p)
            acc = builder.add(acc, widen(words))
        return acc
    v32 = ir.VectorType(I32, 32)
    for q, xv in zip(qs, xs):
        p = builder.mul(builder.zext(q, v32), builder.sext(xv, v32))
        for _ in range(2):  # 32 products -> 8 lanes of 4
            n = p.type.count
            p = builder.add(shuffle(builder, p, p, range(0, n, 2)), shuffle(builder, p, p, range(1, n, 2)))
        acc = builder.add(acc, p)
    return acc


# ---- the 32-element blocks' quants ----


def nibbles(builder, base, offset):
    """16 bytes -> <32 x i8>: low nibbles (elements 0..15) then high nibbles (16..31)."""
    v = load_vec(builder, base, offset, 16)
    lo = builder.and_(v, const_vec(I8, [15] * 16))
    hi = builder.lshr(v, const_vec(I8, [4] * 16))
    return shuffle(builder, lo, hi, range(32))


def fifth_bits(builder, base, offset):
    """The little-endian uint32 qh at offset -> <32 x i8> with 16 where bit i is set.

    With AVX-512 BW/VL, qh is the select's <32 x i1> mask itself (a kmovd and one zero-masked byte move); else
    each byte of qh is spread over the lanes of its 8 bits and tested (a shuffle, an and, a compare)."""
    if {"avx512bw", "avx512vl"} <= X86:
        is_set = builder.bitcast(u32_at(builder, base, offset), ir.VectorType(ir.IntType(1), 32))  # bit i -> lane i
    else:
        qh = load_vec(builder, base, offset, 4)
        spread = shuffle(builder, qh, qh, [i // 8 for i in range(32)])  # lane i holds byte i // 8
        bit = builder.and_(spread, const_vec(I8, [1 << (i % 8) for i in range(32)]))
        is_set = builder.icmp_unsigned("!=", bit, const_vec(I8, [0] * 32))
    return builder.select(is_set, const_vec(I8, [16] * 32), const_vec(I8, [0] * 32))
