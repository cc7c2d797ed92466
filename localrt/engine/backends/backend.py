"""The compute seam between the model graph and a device.

The arch files call only `Backend` methods for weight products (`linear`, `embed`) and the
`simd_kernels.ops` kernels for the rest, so a device (CPU now, CUDA later) is one class here.
Weights are `QTensor`s: raw GGUF blocks viewed in place in the mmap, never dequantized whole.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

import simd_kernels
from simd_kernels import attend, ops, paged, threads

from ...errors import ModelLoadError
from .pieces import BLAS_MIN_TOKENS, blas_pieces, segments

F32 = 0
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
    # The most token rows one call may carry while each row computes exactly as in a one-row call: fewer than
    # BLAS_MIN_TOKENS rows never make a BLAS piece, so every row takes the per-row kernels.
    invariant_rows = BLAS_MIN_TOKENS - 1
    invariant_run = BLAS_MIN_TOKENS - 1  # the same bound for the rows of one sequence at consecutive positions
    xp = np  # the array module of this device (cupy for the CUDA one)
    ops = ops  # the simd_kernels.ops functions the arch code calls on this device's arrays

    def __init__(self) -> None:
        self._scratches: list[np.ndarray] = []  # per prefill team member: flat f32, viewed as (chunk_rows, cols)
        self._plan: tuple[int, list] | None = None  # (n_rows, blas_pieces) of the forward running now
        self._multi_calls: dict[tuple[QTensor, ...], list] = {}  # linears' weights -> their calls (_multi_calls)

    @contextlib.contextmanager
    def planned(self, positions: np.ndarray, slots: np.ndarray):
        """Within the with, linears over the batch's rows take the BLAS path for its pieces, per-row kernels else."""
        saved = self._plan
        self._plan = (len(positions), blas_pieces(positions, slots))
        try:
            yield
        finally:
            self._plan = saved

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
            raise ModelLoadError(
                f"tensor {w.name!r} has ggml type {w.ggml_type}, which this runtime cannot compute with"
            )

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
            raise simd_kernels.KernelArgumentError(
                f"{w.name}: x {x.shape} / out {None if out is None else out.shape} "
                f"do not fit the weight's shape {w.shape}"
            )
        n = x.shape[0]
        if out is None:
            out = np.empty((n, w.shape[0]), np.float32)  # (n_tok, rows)
        pieces = [] if per_row else self._pieces(n)
        if not pieces:
            self._fused(w, x, out)
            return out
        if w.ggml_type in simd_kernels.PREFILL:  # a prompt kernel of the format's own: the pieces only
            self._prefill((w,), x, [out], pieces)
        else:
            self._blas(w, x, out, pieces)
        for lo, hi, on_piece in segments(n, pieces):
            if not on_piece:
                self._fused(w, x[lo:hi], out[lo:hi])
        return out

    def linears(self, ws: tuple[QTensor, ...], x: np.ndarray) -> list[np.ndarray]:
        """[x @ W.T for W in ws]: weights that read the same x (q, k, v; gate, up), each output (n_tok, rows).

        On the per-row path (decode, drafts, short pieces) weights of one format go through one `simd_kernels.MULTI`
        call per three: x quantized once and the threads woken once, where `linear` would make a call of each (a
        decode step makes hundreds). Every row computes exactly as in `linear`; other batches take `linear`."""
        if x.ndim != 2 or x.shape[1] != ws[0].shape[1]:  # the raw kernels check nothing
            raise simd_kernels.KernelArgumentError(f"{', '.join(w.name for w in ws)}: x {x.shape} does not fit")
        n = x.shape[0]
        pieces = self._pieces(n)
        if pieces:
            if all(w.ggml_type in simd_kernels.PREFILL for w in ws):
                return self._prefill_all(ws, x, pieces)  # x quantized once a format, the team woken once
            return [self.linear(w, x) for w in ws]
        calls = self._multi_calls.get(ws)
        if calls is None:
            calls = self._multi_calls[ws] = _multi_calls(ws)
        outs: list[np.ndarray | None] = [None] * len(ws)
        for kernel, idx, data, nbytes in calls:
            if kernel is None:
                outs[idx[0]] = self.linear(ws[idx[0]], x)
                continue
            out = [np.empty((n, d.shape[0]), np.float32) for d in data]  # (n_tok, rows_i) each
            threads.use_threads_for(nbytes * n)
            kernel(*data, x, *out)
            for i, o in zip(idx, out):
                outs[i] = o
        return outs

    def _pieces(self, n: int) -> list[tuple[int, int]]:
        """The BLAS pieces of an n-row batch (none: every row on the per-row fused kernel)."""
        plan = self._plan
        if plan is not None and plan[0] == n:
            return plan[1]
        # outside a forward (logits of many rows at once): one BLAS product from BLAS_MIN_TOKENS rows on
        return [(0, n)] if n >= BLAS_MIN_TOKENS else []

    @staticmethod
    def _fused(w: QTensor, x: np.ndarray, out: np.ndarray) -> None:
        # The raw fused kernel (8-bit activations, as llama.cpp), without the checked wrapper: decode makes
        # hundreds of these calls per token; shapes were checked at load and activations are our own contiguous f32.
        threads.use_threads_for(w.data.nbytes * x.shape[0])
        simd_kernels.MUL[w.ggml_type](w.data, x, out)

    def _prefill_all(self, ws: tuple[QTensor, ...], x: np.ndarray, pieces: list[tuple[int, int]]) -> list[np.ndarray]:
        """[x @ W.T for W in ws], each in simd_kernels.PREFILL: the pieces by their prompt kernels, other rows per row."""
        if any(x.shape[1] != w.shape[1] for w in ws):
            raise simd_kernels.KernelArgumentError(f"{', '.join(w.name for w in ws)}: x {x.shape} does not fit")
        outs = [np.empty((x.shape[0], w.shape[0]), np.float32) for w in ws]  # (n_tok, rows_i) each
        self._prefill(ws, x, outs, pieces)
        for lo, hi, on_piece in segments(x.shape[0], pieces):
            if not on_piece:
                for w, out in zip(ws, outs):
                    self._fused(w, x[lo:hi], out[lo:hi])
        return outs

    @staticmethod
    def _prefill(ws: tuple[QTensor, ...], x: np.ndarray, outs: list[np.ndarray], pieces: list[tuple[int, int]]) -> None:
        """outs[i][lo:hi] = x[lo:hi] @ ws[i].T for each piece by its format's prompt kernel (simd_kernels.PREFILL,
        formats mixed or not: Gemma 3's q/k/v are Q5_0 with a Q8_0 v in half its layers): each piece's activations
        quantized once a quantizer, each team member running the kernels on one thread over its share of every
        weight's rows."""
        acts: dict = {}  # quantizer -> each piece's activations
        kernels = []  # (kernel, its activations per piece), per weight
        for w in ws:
            quantize, kernel = simd_kernels.PREFILL[w.ggml_type]
            if quantize not in acts:
                acts[quantize] = [quantize(x[lo:hi]) for lo, hi in pieces]
            kernels.append((kernel, acts[quantize]))
        team = threads.team()
        bounds = [_split(w.shape[0], team.n, 16) for w in ws]

        def part(i: int) -> None:
            for w, out, b, (kernel, w_acts) in zip(ws, outs, bounds, kernels):
                r_lo, r_hi = b[i], b[i + 1]
                if r_hi == r_lo:
                    continue
                for (lo, hi), act in zip(pieces, w_acts):
                    share = np.empty((hi - lo, r_hi - r_lo), np.float32)  # (piece tokens, this member's rows)
                    kernel(w.data[r_lo:r_hi], *act, share)
                    out[lo:hi, r_lo:r_hi] = share

        if team.n == 1:  # no team: Numba's threads over all the rows
            threads.use_threads_for(sum(w.data.nbytes for w in ws) * x.shape[0])
            for w, out, (kernel, w_acts) in zip(ws, outs, kernels):
                for (lo, hi), act in zip(pieces, w_acts):
                    kernel(w.data, *act, out[lo:hi])
            return
        team.run(part)

    def _blas(self, w: QTensor, x: np.ndarray, out: np.ndarray, pieces: list[tuple[int, int]]) -> None:
        """out[lo:hi] = x[lo:hi] @ W.T for each piece, one BLAS product per piece (its numerics are its own).

        Prefill is compute-bound: each team member dequantizes its share of the weight's rows in big chunks and
        multiplies them with single-threaded BLAS, which beats the fused integer kernel once a few tokens share
        each weight."""
        rows, cols = w.shape
        team = threads.team()
        bounds = _split(rows, team.n, 16)
        rows_kernel = simd_kernels.ROWS[w.ggml_type]
        scratches = self._team_scratch(team.n)

        def part(i: int) -> None:
            scratch = scratches[i]
            r_lo, r_hi = bounds[i], bounds[i + 1]
            chunk = max(1, min(r_hi - r_lo, len(scratch) // cols))
            for r0 in range(r_lo, r_hi, chunk):
                m = min(chunk, r_hi - r0)
                tile = scratch[: m * cols].reshape(m, cols)  # (m, cols) dequantized rows r0..r0+m
                rows_kernel(w.data, np.arange(r0, r0 + m, dtype=np.int64), tile)
                for lo, hi in pieces:  # BLAS writes the strided column block in place
                    np.matmul(x[lo:hi], tile.T, out=out[lo:hi, r0 : r0 + m])

        team.run(part)

    def linear_experts(
        self, w: QTensor, rows: int, x: np.ndarray, experts: np.ndarray, xrow: np.ndarray
    ) -> np.ndarray | None:
        """out (n_pair, rows): out[p] = expert experts[p]'s (rows, cols) slice of the stacked w . x[xrow[p]], in one
        fused call that reads only the chosen experts' rows and quantizes x once; None where w's format has no
        such kernel (the caller then goes expert by expert through `linear`). Each pair computes as `linear`
        (per_row) computes that token against that expert, bit for bit."""
        kernel = simd_kernels.EXPERTS.get(w.ggml_type)
        if kernel is None:
            return None
        n_expert = w.shape[0] // rows
        if (
            x.ndim != 2
            or x.shape[1] != w.shape[1]
            or w.shape[0] != n_expert * rows
            or experts.shape != xrow.shape
            or experts.dtype != np.int64
            or xrow.dtype != np.int64
            or not x.flags.c_contiguous
            or (
                experts.size
                and not (
                    0 <= experts.min() and experts.max() < n_expert and 0 <= xrow.min() and xrow.max() < x.shape[0]
                )
            )
        ):
            # The raw kernel checks nothing: these keep it in bounds.
            raise simd_kernels.KernelArgumentError(
                f"{w.name}: x {x.shape}, {experts.shape} expert ids / {xrow.shape} "
                f"rows do not fit {n_expert} experts of {(rows, w.shape[1])}"
            )
        out = np.empty((experts.shape[0], rows), np.float32)  # (n_pair, rows)
        threads.use_threads_for(w.data.nbytes // n_expert * experts.shape[0])
        kernel(w.data, rows, x, experts, xrow, out)
        return out

    def linear_grouped(
        self, ws: tuple[QTensor, ...], rows: int, x: np.ndarray, experts: np.ndarray, starts: np.ndarray
    ) -> list[np.ndarray] | None:
        """[out_i (n_x, rows)] for one or two stacked expert weights ws of one format: out_i[t] = expert experts[g]'s
        (rows, cols) slice of ws[i] . x[t] for x's rows t of group g (starts[g] <= t < starts[g + 1]), in one fused
        call that decodes each chosen expert's rows once per 8 of its rows of x and quantizes x once; None where
        the format has no such kernel. Each row computes as `linear` (per_row) computes it, bit for bit."""
        if len(ws) not in (1, 2) or len({w.ggml_type for w in ws}) != 1 or len({w.shape for w in ws}) != 1:
            return None
        kernel = simd_kernels.GROUPED.get(ws[0].ggml_type)
        if kernel is None:
            return None
        w = ws[0]
        n_expert = w.shape[0] // rows
        if (
            x.ndim != 2
            or x.shape[1] != w.shape[1]
            or w.shape[0] != n_expert * rows
            or not x.flags.c_contiguous
            or experts.dtype != np.int64
            or starts.dtype != np.int64
            or starts.shape != (experts.shape[0] + 1,)
            or (experts.size and not (0 <= experts.min() and experts.max() < n_expert))
            or starts[0] != 0
            or starts[-1] != x.shape[0]
            or (np.diff(starts) < 0).any()
        ):
            # The raw kernel checks nothing: these keep it in bounds.
            raise simd_kernels.KernelArgumentError(
                f"{w.name}: x {x.shape}, {experts.shape} expert ids / {starts.shape} group starts do not fit "
                f"{n_expert} experts of {(rows, w.shape[1])}"
            )
        outs = [np.empty((x.shape[0], rows), np.float32) for _ in ws]  # (n_x, rows) each
        second = ws[1].data if len(ws) == 2 else w.data[:0]  # (0, row_bytes): no second weight
        out1 = outs[1] if len(ws) == 2 else np.empty((x.shape[0], 0), np.float32)  # (n_x, 0)
        threads.use_threads_for(w.data.nbytes // n_expert * experts.shape[0] * len(ws))
        kernel(w.data, second, rows, x, experts, starts, outs[0], out1)
        return outs

    def _team_scratch(self, n: int) -> list[np.ndarray]:
        """A flat f32 scratch (SCRATCH_ELEMS / n,) per team member: pages are touched only as tiles need them."""
        if len(self._scratches) != n:
            self._scratches = [np.empty(SCRATCH_ELEMS // n, np.float32) for _ in range(n)]
        return self._scratches

    def attention(
        self,
        q,
        k_cache,
        v_cache,
        positions,
        slots,
        window: int,
        scale: float,
        out: np.ndarray,
        softcap: float = 0.0,
        table: np.ndarray | None = None,
        sinks: np.ndarray | None = None,
    ) -> np.ndarray:
        """Causal attention over the cache; see `ops.attention` for shapes, the window rule, softcap and sinks
        ((n_head,) f32 or None). With `table` (n_slots, max_blocks) the caches are a paged pool
        (n_blocks, n_kv, B, hd[_v]): `simd_kernels.paged`."""
        sinks = attend.check_sinks(sinks, q.shape[1]) if sinks is not None else None
        pieces = blas_pieces(positions, slots) if softcap >= 0 else []  # the kernel refuses a bad softcap by name

        def per_row(lo, hi):
            if table is None:
                return ops.attention(
                    q[lo:hi],
                    k_cache,
                    v_cache,
                    positions[lo:hi],
                    slots[lo:hi],
                    window,
                    scale,
                    out[lo:hi],
                    softcap,
                    sinks,
                )
            return paged.attention_paged(
                q[lo:hi],
                k_cache,
                v_cache,
                table,
                positions[lo:hi],
                slots[lo:hi],
                window,
                scale,
                out[lo:hi],
                softcap,
                sinks,
            )

        if not pieces:
            per_row(0, len(positions))
            return out
        for lo, hi, on_blas in segments(len(positions), pieces):
            if on_blas:
                _block_attention(
                    q[lo:hi],
                    k_cache,
                    v_cache,
                    positions[lo:hi],
                    int(slots[lo]),
                    window,
                    scale,
                    out[lo:hi],
                    softcap,
                    table,
                    sinks,
                )
            else:
                per_row(lo, hi)
        return out


def _block_attention(
    q,
    k_cache,
    v_cache,
    positions,
    s: int,
    window: int,
    scale: float,
    out,
    softcap: float,
    table: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
) -> None:
    """One piece (consecutive positions of slot s): per KV head, scores and mixing are two BLAS products over the
    keys from the piece's first visible one to its last position (gathered from the pool's blocks when `table`);
    sinks (n_head,) f32 join each head's softmax denominator (attend.softmax_causal)."""
    n = len(positions)
    n_head, n_kv = q.shape[1], k_cache.shape[1]
    cap = k_cache.shape[2] if table is None else table.shape[1] * k_cache.shape[2]  # positions a slot can hold
    group = n_head // n_kv
    p0, p1 = int(positions[0]), int(positions[-1])
    k0 = max(0, p0 - window + 1) if window > 0 else 0
    keys = np.arange(k0, p1 + 1)  # (n_keys,) positions
    idx = keys % cap  # ring slots of those positions (identity for full layers)
    wrapped = k0 > 0 or p1 >= cap
    if table is not None:  # the same values in the same (n_kv, n_keys, hd) layout, copied out of the slot's blocks
        if not 0 <= s < table.shape[0] or p1 >= cap:
            raise simd_kernels.KernelArgumentError(f"slot {s} / position {p1} outside the block tables {table.shape}")
        k_all, v_all = paged.gather(k_cache, table[s], k0, p1 + 1), paged.gather(v_cache, table[s], k0, p1 + 1)
    else:
        k_all = k_cache[s][:, idx] if wrapped else k_cache[s, :, : p1 + 1]  # (n_kv, n_keys, hd)
        v_all = v_cache[s][:, idx] if wrapped else v_cache[s, :, : p1 + 1]  # (n_kv, n_keys, hd_v)
    if k_all.dtype == np.uint16:  # an F16 cache's bits: the float16 values, widened exactly for BLAS
        k_all, v_all = k_all.view(np.float16).astype(np.float32), v_all.view(np.float16).astype(np.float32)
    # Query rows split over the team (the same split whenever this piece is evaluated). Every member scores all
    # keys (the masked ones too): a row's sums run over the same operands whatever the split.
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
            attend.softmax_causal(
                sc, scale, softcap, positions[a:b], k0, window, None if sinks is None else sinks[heads]
            )  # (group,) this KV head's query heads
            mixed = sc.reshape(group * m, -1) @ v  # (group * m, hd_v)
            out[a:b, heads, :] = mixed.reshape(group, m, -1).transpose(1, 0, 2)

    team.run(part)


def _multi_calls(ws: tuple[QTensor, ...]) -> list[tuple]:
    """How `linears` computes ws: (MULTI kernel, indices into ws, their raw data, bytes) per group of up to three of
    one format (two get a 0-row third: one kernel signature), (None, [i], None, 0) for a weight computed alone."""
    if any(w.shape[1] != ws[0].shape[1] for w in ws):
        raise simd_kernels.KernelArgumentError(f"{', '.join(w.name for w in ws)} do not share an input width")
    by_type: dict[int, list[int]] = {}
    for i, w in enumerate(ws):
        by_type.setdefault(w.ggml_type, []).append(i)
    calls = []
    for ggml_type, idx in by_type.items():
        kernel = simd_kernels.MULTI.get(ggml_type)
        while len(idx) > 1 and kernel is not None:
            group, idx = idx[:3], idx[3:]
            data = [ws[i].data for i in group]  # uint8 (rows_i, row_bytes) each
            if len(group) == 2:
                data.append(data[0][:0])
            calls.append((kernel, group, data, sum(d.nbytes for d in data)))
        calls += [(None, [i], None, 0) for i in idx]
    return calls


def _split(n: int, parts: int, align: int) -> list[int]:
    """parts + 1 bounds cutting range(n) into near-equal pieces starting at multiples of align."""
    cuts = [min(n, (n * i // parts + align - 1) // align * align) for i in range(parts)]
    return cuts + [n]
