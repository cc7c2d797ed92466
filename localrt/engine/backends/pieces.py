"""How a prompt's rows are cut into pieces, and which rows take the BLAS path: pure functions of positions and
num_batch, so that a position's numerics never depend on what ran beside it (localrt.engine.backends.backend)."""

from __future__ import annotations

import numpy as np

# The BLAS path: a weight dequantized into scratch tiles times the activations with BLAS, and attention as BLAS
# products. It is taken only by a prompt chunk's *pieces*: the chunk's rows cut at multiples of BLOCK positions,
# each of at least BLAS_MIN_TOKENS rows, one BLAS product per piece. Every other row (decode, drafts, a piece
# shorter than that) takes the per-row kernels: the fused 8-bit kernel and the per-(token, head) attention, whose
# numerics depend on the row alone. Prompt chunks end at multiples of num_batch positions (`prefill_end`), so a
# position's piece, and therefore its keys, depend only on the prompt and num_batch: never on how the prompt
# was resumed, on what ran beside it or on what was cached (prefix reuse is exact: localrt.engine.batch).
# From 64 rows BLAS beats the fused kernel on a prompt chunk, and a 256-row piece costs little more than a 512-row
# one (docs/measurements.md).
# A format with a prompt kernel of its own (simd_kernels.PREFILL: Q4_K, Q5_K, Q6_K; Q4_0, Q4_1, Q5_0, Q5_1; Q8_0
# with VNNI) takes it in the pieces instead of BLAS (faster: docs/measurements.md), and a piece's rows do not depend
# on each other. The K-quants' numbers are their own, as BLAS's are; the
# 32-element formats' per-row kernels compute with the same row dots (simd_kernels.block32), so there a piece's
# linears give what per-row kernels would (its attention still differs).
BLAS_MIN_TOKENS = 64
BLOCK = 256


def blas_pieces(positions: np.ndarray, slots: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of a batch that take the BLAS path: a single sequence's consecutive positions cut at
    multiples of BLOCK, the pieces of at least BLAS_MIN_TOKENS rows (in order; none for a mixed batch)."""
    n = len(positions)
    if n < BLAS_MIN_TOKENS or not (slots == slots[0]).all() or not (np.diff(positions) == 1).all():
        return []
    p0 = int(positions[0])
    out, lo = [], 0
    while lo < n:
        hi = min(n, (p0 + lo) // BLOCK * BLOCK + BLOCK - p0)
        if hi - lo >= BLAS_MIN_TOKENS:
            out.append((lo, hi))
        lo = hi
    return out


def segments(n: int, pieces: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """range(n) as consecutive (lo, hi, blas) runs: the pieces, and the per-row rows between them."""
    out, at = [], 0
    for lo, hi in pieces:
        if lo > at:
            out.append((at, lo, False))
        out.append((lo, hi, True))
        at = hi
    if at < n:
        out.append((at, n, False))
    return out


def prefill_end(start: int, total: int, num_batch: int) -> int:
    """Where the prompt chunk from `start` ends: at the next multiple of num_batch positions, at most `total`."""
    return min(total, (start // num_batch + 1) * num_batch)


def prompt_pieces(n_prompt: int, *num_batch: int) -> list[tuple[int, int]]:
    """The position ranges of a prompt of n_prompt tokens (evaluated from 0 in chunks that end at the next multiple
    of any of num_batch) that take the BLAS path: what `blas_pieces` gives each chunk (see `prefill_end`)."""
    out, start = [], 0
    while start < n_prompt:
        end = min(prefill_end(start, n_prompt, nb) for nb in num_batch)
        positions = np.arange(start, end)
        out += [(start + lo, start + hi) for lo, hi in blas_pieces(positions, np.zeros(len(positions), np.int64))]
        start = end
    return out


def exact_reuse(common: int, cached: list[tuple[int, int]], fresh: list[tuple[int, int]]) -> int:
    """How many of `common` shared leading positions a cache may give a new prompt with bit-identical numerics.

    `cached` / `fresh`: the position ranges computed on the BLAS path, one product each, by the cache and by a
    fresh evaluation of the new prompt (`prompt_pieces`); every other position is computed per row, alike in
    both. Reuse ends at the first position whose path differs, moved back to the start of the new prompt's
    piece if it falls inside one (a piece is evaluated whole)."""

    def piece(pieces, p):
        return next(((lo, hi) for lo, hi in pieces if lo <= p < hi), None)

    keep = common
    for p in sorted({0, *(b for r in cached + fresh for b in r)}):  # the paths can only change at these
        if p >= common:
            break
        if piece(cached, p) != piece(fresh, p):
            keep = p
            break
    inside = piece(fresh, keep)
    return inside[0] if inside is not None else keep
