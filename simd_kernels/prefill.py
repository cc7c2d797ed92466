"""The prompt kernel both families build around their row dots (simd_kernels.kquants_prompt: Q4_K, Q5_K, Q6_K;
simd_kernels.block32_prompt: the 32-element formats); the integer lane dots and the register transpose they share
are simd_kernels.ir's.

A format's row dots are intrinsics that `row_loop(context, builder, sig, args, fmt, n_tok)` generates: one weight row
against n_tok tokens of the format's prompt activations -> n_tok float32 (`prefill_rowdots` makes them for 1-4 and 8
tokens, or every count 1-8); `prefill_kernel` binds them into the prompt kernel, per_pass tokens at a time through
every row. The 32-element formats' per-row kernels (simd_kernels.block32) are made of the same row dots, so a model of
those formats imports this module, not the K-quants' prompt kernels (kquants_prompt).
"""

from __future__ import annotations

from numba import prange, types
from numba.extending import intrinsic

from .simd import ROW_TOKENS, kernel_copy, rowjob_binds


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
            out[t : t + PER_PASS, r] = ROWDOTS(w[r], xq, xd, sums, t)  # noqa: F821
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
    return kernel_copy(_prefill_template, f"prefill_{name}", binds, module, _DOC.format(fmt=name.upper(), n=per_pass))
