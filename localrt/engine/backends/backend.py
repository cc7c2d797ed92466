"""The compute seam between the model graph and a device.

The arch files call only `Backend` methods for weight products (`linear`, `embed`) and the
`simd_kernels.ops` kernels for the rest, so a device (CPU now, CUDA later) is one class here.
Weights are `QTensor`s: raw GGUF blocks viewed in place in the mmap, never dequantized whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import simd_kernels
from simd_kernels import ops, threads

from ...errors import ModelLoadError

F32 = 0
# From this many tokens on, dequantize the weight into scratch and let BLAS multiply. Measured on the real models
# (prefill forward of one chunk, 2 threads, best of 3; fused / BLAS ms): SmolLM2 32: 113 / 145, 64: 216 / 186,
# 128: 441 / 285, 255: 922 / 548; Gemma 3 32: 115 / 163, 64: 225 / 216, 128: 485 / 329. Decode batches stay
# below it (invariant_rows): the fused kernel is per-row invariant, BLAS is not.
BLAS_MIN_TOKENS = 64
ATTN_BLAS_MIN_TOKENS = 16  # prefill chunks of at least this many tokens attend with BLAS products
SCRATCH_ELEMS = 1 << 22  # (rows, cols) f32 chunk of a dequantized weight: 16 MiB


@dataclass(frozen=True, eq=False)
class QTensor:
    """A weight as stored in the file: `data` is the raw uint8 view (n_rows, row_bytes) into the mmap."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # NumPy order: (rows, cols) for a matrix, (n,) for a vector
    data: np.ndarray


class CPUBackend:
    """NumPy + Numba on the host: fused dequantize x dot kernels read the blocks in place."""

    name = "cpu"
    # The most token rows one call may carry while each row computes exactly as in a one-row call: the fused
    # kernel (below BLAS_MIN_TOKENS) and the per-row attention kernel are batch-invariant, BLAS is not.
    invariant_rows = BLAS_MIN_TOKENS - 1
    # The most rows of one sequence at consecutive positions one call may carry with one-row numerics: from
    # ATTN_BLAS_MIN_TOKENS on such a run attends with BLAS products (a speculative draft stays below).
    invariant_run = ATTN_BLAS_MIN_TOKENS - 1
    xp = np  # the array module of this device (cupy for the CUDA one)
    ops = ops  # the simd_kernels.ops functions the arch code calls on this device's arrays

    def __init__(self) -> None:
        self._scratches: list[np.ndarray] = []  # per prefill team member: flat f32, viewed as (chunk_rows, cols)

    def put(self, a: np.ndarray) -> np.ndarray:
        """An f32 array moved onto this device (the hidden state crossing a device boundary)."""
        return np.ascontiguousarray(a, dtype=np.float32)

    def to_host(self, a: np.ndarray) -> np.ndarray:
        return a

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def upload(self, w: QTensor) -> QTensor:
        return w

    def adopt_layer(self, layer):
        """The layer as this device computes with it: host weights are used in place."""
        return layer

    def check(self, w: QTensor) -> None:
        """Raise ModelLoadError if no kernel here reads this weight's format."""
        if w.ggml_type not in simd_kernels.MUL or w.ggml_type not in simd_kernels.ROWS:
            raise ModelLoadError(f"tensor {w.name!r} has ggml type {w.ggml_type}, which this runtime cannot compute with")

    def vector(self, w: QTensor) -> np.ndarray:
        """A small tensor (norm weights, biases) as float32 (shape,): zero-copy when F32."""
        if w.ggml_type == F32:
            return w.data.reshape(-1).view(np.float32).reshape(w.shape)
        return simd_kernels.get_rows(w.ggml_type, w.data, np.arange(w.data.shape[0])).reshape(w.shape)

    def embed(self, w: QTensor, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of an embedding matrix: (len(ids), n_embd) float32."""
        return simd_kernels.get_rows(w.ggml_type, w.data, ids)

    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None, *, per_row: bool = False) -> np.ndarray:
        """y = x @ W.T: x (n_tok, cols) float32 -> (n_tok, rows) float32.

        `per_row`: always the fused kernel, whose every row computes as in a one-row call (an expert's tokens
        are a group whose size depends on the rest of the batch: see localrt.engine.arch.moe)."""
        if x.ndim != 2 or x.shape[1] != w.shape[1] or (out is not None and out.shape != (x.shape[0], w.shape[0])):
            # The raw kernels below check nothing: one tuple comparison keeps them in bounds.
            raise simd_kernels.KernelArgumentError(f"{w.name}: x {x.shape} / out {None if out is None else out.shape} "
                                                   f"do not fit the weight's shape {w.shape}")
        if x.shape[0] < BLAS_MIN_TOKENS or per_row:
            if out is None:
                out = np.empty((x.shape[0], w.shape[0]), np.float32)  # (n_tok, rows)
            # The raw fused kernel (8-bit activations, as llama.cpp), without the checked wrapper: decode
            # makes hundreds of these calls per token; shapes were checked at load and activations are
            # our own contiguous f32.
            threads.use_threads_for(w.data.nbytes * x.shape[0])
            simd_kernels.MUL[w.ggml_type](w.data, x, out)
            return out
        # Prefill is compute-bound: each team member dequantizes its share of the rows in big chunks and
        # multiplies them with single-threaded BLAS, which beats the fused integer kernel once a few
        # tokens share each weight.
        rows, cols = w.shape
        if out is None:
            out = np.empty((x.shape[0], rows), np.float32)  # (n_tok, rows)
        team = threads.team()
        bounds = _split(rows, team.n, 16)
        rows_kernel = simd_kernels.ROWS[w.ggml_type]
        scratches = self._team_scratch(team.n)

        def part(i: int) -> None:
            scratch = scratches[i]
            r_lo, r_hi = bounds[i], bounds[i + 1]
            chunk = max(1, min(r_hi - r_lo, len(scratch) // cols))
            for r0 in range(r_lo, r_hi, chunk):
                n = min(chunk, r_hi - r0)
                tile = scratch[: n * cols].reshape(n, cols)  # (n, cols) dequantized rows r0..r0+n
                rows_kernel(w.data, np.arange(r0, r0 + n, dtype=np.int64), tile)
                np.matmul(x, tile.T, out=out[:, r0 : r0 + n])  # BLAS writes the strided column block in place

        team.run(part)
        return out

    def _team_scratch(self, n: int) -> list[np.ndarray]:
        """A flat f32 scratch (SCRATCH_ELEMS / n,) per team member: pages are touched only as tiles need them."""
        if len(self._scratches) != n:
            self._scratches = [np.empty(SCRATCH_ELEMS // n, np.float32) for _ in range(n)]
        return self._scratches

    def attention(self, q, k_cache, v_cache, positions, slots, window: int, scale: float, out: np.ndarray,
                  softcap: float = 0.0) -> np.ndarray:
        """Causal attention over the cache; see `ops.attention` for shapes, the window rule and softcap."""
        n = len(positions)
        one_run = n >= ATTN_BLAS_MIN_TOKENS and (slots == slots[0]).all() and (np.diff(positions) == 1).all()
        if not one_run or not softcap >= 0:  # the kernel refuses a bad softcap by name
            return ops.attention(q, k_cache, v_cache, positions, slots, window, scale, out, softcap)
        # A prefill chunk of one sequence: per KV head, scores and mixing are two BLAS products.
        n_head, n_kv, cap = q.shape[1], k_cache.shape[1], k_cache.shape[2]
        group = n_head // n_kv
        p0, p1 = int(positions[0]), int(positions[-1])
        k0 = max(0, p0 - window + 1) if window > 0 else 0
        keys = np.arange(k0, p1 + 1)  # (n_keys,) positions
        idx = keys % cap  # ring slots of those positions (identity for full layers)
        hidden = keys[None, :] > positions[:, None]  # (n_tok, n_keys) key after the query
        if window > 0:
            hidden |= keys[None, :] <= positions[:, None] - window  # key out of the query's window
        mask = np.where(hidden, np.float32(-np.inf), np.float32(0.0))  # (n_tok, n_keys) additive
        s = int(slots[0])
        wrapped = k0 > 0 or p1 >= cap
        k_all = k_cache[s][:, idx] if wrapped else k_cache[s, :, : p1 + 1]  # (n_kv, n_keys, hd)
        v_all = v_cache[s][:, idx] if wrapped else v_cache[s, :, : p1 + 1]  # (n_kv, n_keys, hd_v)
        if k_all.dtype == np.uint16:  # an F16 cache's bits: the float16 values, widened exactly for BLAS
            k_all, v_all = k_all.view(np.float16).astype(np.float32), v_all.view(np.float16).astype(np.float32)
        # Query rows split over the team. Every member scores all keys (the masked ones too): each row's
        # sums then run over the same operands as in one product, so the numerics do not depend on the split.
        team = threads.team()
        bounds = _split(n, team.n, 1)

        def part(i: int) -> None:
            a, b = bounds[i], bounds[i + 1]
            if a >= b:
                return
            m = b - a
            for kvh in range(n_kv):
                k, v = k_all[kvh], v_all[kvh]  # (n_keys, hd), (n_keys, hd_v)
                heads = slice(kvh * group, (kvh + 1) * group)
                # (group * m, hd): 2-D operands keep numpy on BLAS (stacked matmul with a transposed
                # operand falls back to a slow loop).
                qg = np.ascontiguousarray(q[a:b, heads, :].transpose(1, 0, 2)).reshape(group * m, -1)
                sc = (qg @ k.T).reshape(group, m, len(keys))  # (group, m, n_keys)
                sc *= np.float32(scale)
                if softcap > 0:
                    sc /= np.float32(softcap)
                    np.tanh(sc, out=sc)
                    sc *= np.float32(softcap)
                sc += mask[a:b]
                sc -= sc.max(axis=2, keepdims=True)
                np.exp(sc, out=sc)
                sc /= sc.sum(axis=2, keepdims=True)
                mixed = sc.reshape(group * m, -1) @ v  # (group * m, hd_v)
                out[a:b, heads, :] = mixed.reshape(group, m, -1).transpose(1, 0, 2)

        team.run(part)
        return out


def _split(n: int, parts: int, align: int) -> list[int]:
    """parts + 1 bounds cutting range(n) into near-equal pieces starting at multiples of align."""
    cuts = [min(n, (n * i // parts + align - 1) // align * align) for i in range(parts)]
    return cuts + [n]
