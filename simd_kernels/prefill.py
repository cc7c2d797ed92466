"""What the prompt kernels of both families share (simd_kernels.kquants_prompt: Q4_K, Q5_K, Q6_K; simd_kernels.block32_prompt: the
32-element formats): the integer lane dots, the register transpose and the kernel built around a format's row dots.

A format's row dots are intrinsics that `row_loop(context, builder, sig, args, fmt, n_tok)` generates: one weight row
against n_tok tokens of the format's prompt activations -> n_tok float32 (`prefill_rowdots` makes them for 1-4 and 8
tokens, or every count 1-8); `prefill_kernel` binds them into the prompt kernel, per_pass tokens at a time through
every row. The 32-element formats' per-row kernels (simd_kernels.block32) are made of the same row dots, so a model of
those formats imports this module, not the K-quants' prompt kernels (kquants_prompt).
"""
from __future__ import annotations

from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from .simd import (
    _F32,
    _I8,
    _I32,
    _V8I,
    _V16S,
    _X86,
    _const_vec,
    _intrinsic,
    _kernel_copy,
    ROW_TOKENS,
    _shuffle,
    _vnni,
    rowjob_binds,
)

_VNNI = {"avx512vnni", "avx512vl"} <= _X86


def _transpose4(builder, c):
    """Four <8 x i32> -> four: register m holds dword m of c[0..3] in 128-bit lane 0 (dword i from c[i]) and dword
    m + 4 in lane 1 (vpunpck{l,h}dq, then vpunpck{l,h}qdq)."""
    dwords_lo, dwords_hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo01, hi01 = (_shuffle(builder, c[0], c[1], idx) for idx in (dwords_lo, dwords_hi))
    lo23, hi23 = (_shuffle(builder, c[2], c[3], idx) for idx in (dwords_lo, dwords_hi))
    even, odd = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    return [_shuffle(builder, lo01, lo23, even), _shuffle(builder, lo01, lo23, odd),
            _shuffle(builder, hi01, hi23, even), _shuffle(builder, hi01, hi23, odd)]


def _lane_dots(builder, qs, xs, acc, i16_group=1, wide=False):
    """acc + Σ_k qs[k] . xs[k] per 32-bit lane (<32 x i8> unsigned q, signed x in -127..127; four products a lane;
    exact).

    Without VNNI, AVX2 takes each register's products in pairs (vpmaddubsw, 16-bit) and widens them to the lanes
    (vpmaddwd against ones). `i16_group`: how many consecutive registers' pair sums stay below 2^15 together, so
    that they are added as words and widened once (Q4: 8 registers, 8*2*15*127 < 2^15; Q5: 4).
    `wide`: q passes 127 (Q8_0's q + 128), where vpmaddubsw's pair sums could saturate, and acc holds -128 Σx of
    each lane's elements (the offset the caller takes out): AVX2 then dots the signed q - 128 instead (|q - 128|
    against x with q - 128's sign, vpsignb: the pairs stay within 2*128*127 < 2^15), which is that same integer,
    and leaves acc out."""
    if _VNNI:  # two chains of vpdpbusd, added at the end (integers: the same sum), so that one token's dots overlap
        chains = [acc, ir.Constant(acc.type, None)] if len(qs) >= 4 else [acc]
        for i, (q, xv) in enumerate(zip(qs, xs)):
            chains[i % len(chains)] = _vnni(builder, chains[i % len(chains)], q, xv)
        return chains[0] if len(chains) == 1 else builder.add(chains[0], chains[1])
    ones = ir.Constant(_V16S, [1] * 16)
    v32i8 = ir.VectorType(_I8, 32)

    def widen(pairs):
        return _intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _V8I, [pairs, ones])

    if "avx2" in _X86 and wide:
        lanes = None
        for q, xv in zip(qs, xs):
            signed = builder.xor(q, _const_vec(_I8, [-128] * 32))  # q - 128 as int8
            magnitude = _intrinsic(builder, "llvm.x86.avx2.psign.b", v32i8, [signed, signed])  # |q - 128| (-128: 128)
            x_signed = _intrinsic(builder, "llvm.x86.avx2.psign.b", v32i8, [xv, signed])  # x with q - 128's sign
            dots = widen(_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [magnitude, x_signed]))
            lanes = dots if lanes is None else builder.add(lanes, dots)
        return lanes
    if "avx2" in _X86:
        pairs = [_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16S, [q, xv]) for q, xv in zip(qs, xs)]
        for g in range(0, len(pairs), i16_group):
            words = pairs[g]
            for p in pairs[g + 1:g + i16_group]:
                words = builder.add(words, p)
            acc = builder.add(acc, widen(words))
        return acc
    v32 = ir.VectorType(_I32, 32)
    for q, xv in zip(qs, xs):
        p = builder.mul(builder.zext(q, v32), builder.sext(xv, v32))
        for _ in range(2):  # 32 products -> 8 lanes of 4
            n = p.type.count
            p = builder.add(_shuffle(builder, p, p, range(0, n, 2)), _shuffle(builder, p, p, range(1, n, 2)))
        acc = builder.add(acc, p)
    return acc


def _fma(builder, a, b, c):
    n = a.type.count
    return _intrinsic(builder, f"llvm.fma.v{n}f32", ir.VectorType(_F32, n), [a, b, c])


def _tree16(builder, v):
    """<16 x float> -> its sum, halves added lane by lane: (v[0:8] + v[8:16]), then 4, 2, 1."""
    n = 16
    while n > 1:
        n //= 2
        v = builder.fadd(_shuffle(builder, v, v, range(n)), _shuffle(builder, v, v, range(n, 2 * n)))
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _make_rowdot(name, fmt, n_tok, row_loop):
    @intrinsic
    def rowdot(typingctx, w, xq, xd, sums, t0):
        """One row (uint8 (row_bytes,)) . tokens t0..t0+n_tok-1 of the format's prompt activations (xq, xd, sums,
        laid out as row_loop reads them) -> n_tok float32."""
        sig = types.UniTuple(types.float32, n_tok)(w, xq, xd, sums, t0)

        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, sig.return_type, row_loop(context, builder, sig, args, fmt, n_tok))

        return sig, codegen

    rowdot.__name__ = f"rowdot{n_tok}_{name}_prefill"
    return rowdot


def _prefill_template(w, xq, xd, sums, out):
    n = xq.shape[0]
    n_full = n - n % PER_PASS  # noqa: F821 (PER_PASS, ROWDOTS, ROWJOB bound by prefill_kernel)
    for t in range(0, n_full, PER_PASS):  # noqa: F821
        for r in prange(w.shape[0]):
            out[t:t + PER_PASS, r] = ROWDOTS(w[r], xq, xd, sums, t)  # noqa: F821
    if n_full < n:
        for r in prange(w.shape[0]):
            ROWJOB(w[r], xq, xd, sums, n_full, n, out, r)  # noqa: F821 (the last tokens: simd.rowjob_binds' ROWJOB)


_DOC = """out = x @ dequant(w).T for a prompt piece: w uint8 (rows, row_bytes) {fmt} blocks; xq, xd, sums from
    PREFILL_{fmt}[0](x (n_tok, cols)); out float32 (n_tok, rows). Tokens go {n} at a time through every row (their
    activations stay in L1 or L2), the last ones in one more pass."""


def prefill_rowdots(name, fmt, row_loop, counts=ROW_TOKENS) -> tuple:
    """The row dots of a format whose row dots row_loop generates, for the token counts `counts` (simd.ROW_TOKENS or
    simd.EVERY_COUNT): simd.fused_kernel's row dots, for a per-row kernel that computes every token as the prompt
    kernel does (simd_kernels.block32_prompt)."""
    return tuple(_make_rowdot(name, fmt, n, row_loop) for n in counts)


def prefill_kernel(name, fmt, row_loop, module, per_pass=8, rowdots=None):
    """The prompt kernel prefill_<name>(w, xq, xd, sums, out) of a format whose row dots row_loop(context, builder,
    sig, args, fmt, n_tok) generates, defined in module (simd.fused_kernel's way of binding); per_pass (8 or 16)
    tokens a pass over the rows; `rowdots`: prefill_rowdots' of the format, where they were made already."""
    rowdots = rowdots or prefill_rowdots(name, fmt, row_loop)
    binds = rowjob_binds(rowdots, f"rowjob_prefill_{name}")
    binds["ROWDOTS"] = binds["ROWDOT8"] if per_pass == 8 else _make_rowdot(name, fmt, per_pass, row_loop)
    binds["PER_PASS"] = per_pass
    return _kernel_copy(_prefill_template, f"prefill_{name}", binds, module, _DOC.format(fmt=name.upper(), n=per_pass))
