"""The CUDA device of the compute seam (CuPy): same methods as `backend.CPUBackend`, arrays are CuPy.

A layer placed here has its raw GGUF blocks copied to the GPU once (`adopt_layer`); weights stay
quantized there. Decode (few tokens) runs the fused dequantize x dot kernel, reading each weight byte
once; prefill dequantizes row tiles into a scratch and lets cuBLAS multiply. Norms, rope, the gated
activations, the KV store and attention are kernels from `cuda_source`; `ops` mirrors the
`simd_kernels.ops` functions the arch code calls, so a layer's code is written once for both devices.
Only the hidden state crosses the CPU <-> GPU boundary (`put` / `to_host`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import simd_kernels
from simd_kernels import checks

from ...errors import ModelLoadError
from . import cuda_source
from .backend import QTensor

FUSED_MAX_TOKENS = 8  # up to this many tokens: the fused kernel (one pass over the weight); above: tiles + cuBLAS
TILE_ELEMS = 1 << 24  # (rows, cols) f32 of one dequantized tile: 64 MiB
THREADS = 256
_TYPE_NAMES = {t: name for name, (t, _, _) in cuda_source.FORMATS.items()}


class CUDABackend:
    """One GPU (`index` = main_gpu) driven through CuPy; every array argument and result is a CuPy array."""

    name = "cuda"
    invariant_rows = FUSED_MAX_TOKENS  # rows per call that keep the fused kernel's per-row numerics (cuBLAS above)
    invariant_run = FUSED_MAX_TOKENS  # attention runs per (token, head) at any row count: the same bound

    def __init__(self, index: int = 0, cupy=None) -> None:
        if cupy is None:
            import cupy  # the optional extra localrt[cuda]; callers probe with localrt.engine.backends.devices first
        self.cp = self.xp = cupy
        self.index = index
        self.device = cupy.cuda.Device(index)
        self.device.use()
        self._mod = cupy.RawModule(code=cuda_source.kernel_source(), options=("-std=c++14",))
        self._fn: dict[str, object] = {}
        self._tile = None  # flat f32 scratch, allocated on first prefill
        self._host_cache: dict[int, tuple[np.ndarray, object]] = {}  # id(host array) -> (array, device copy)
        self.ops = CudaOps(self)

    # -- placement -------------------------------------------------------------------------------

    def check(self, w: QTensor) -> None:
        if w.ggml_type not in _TYPE_NAMES:
            raise ModelLoadError(
                f"tensor {w.name!r} has ggml type {w.ggml_type}, which the CUDA device cannot compute with"
            )

    def upload(self, w: QTensor) -> QTensor:
        """The same weight with its raw blocks copied once into GPU memory (still quantized)."""
        self.check(w)
        return QTensor(w.name, w.ggml_type, w.shape, self.cp.asarray(np.ascontiguousarray(w.data)))

    def adopt_layer(self, layer):
        """A copy of an arch `Layer` whose matrices and vectors live on this GPU."""
        changes = {}
        for f in dataclasses.fields(layer):
            v = getattr(layer, f.name)
            if isinstance(v, QTensor):
                changes[f.name] = self.upload(v)
            elif isinstance(v, np.ndarray):
                changes[f.name] = self.cp.asarray(v, dtype=self.cp.float32)
        return dataclasses.replace(layer, **changes)

    def zeros(self, shape: tuple[int, ...]):
        return self.cp.zeros(shape, self.cp.float32)

    def put(self, a):
        """a host or device f32 array -> a C-contiguous device array (the boundary crossing)."""
        return self.cp.ascontiguousarray(self.cp.asarray(a, dtype=self.cp.float32))

    def to_host(self, a) -> np.ndarray:
        return self.cp.asnumpy(a)

    def host_constant(self, a: np.ndarray):
        """A device copy of a small host array that lives as long as the model (positions, rope factors)."""
        hit = self._host_cache.get(id(a))
        if hit is None or hit[0] is not a:
            hit = (a, self.cp.asarray(a))
            if len(self._host_cache) > 64:
                self._host_cache.clear()
            self._host_cache[id(a)] = hit
        return hit[1]

    # -- weight products -------------------------------------------------------------------------

    def vector(self, w: QTensor):
        """A small tensor as f32 on the device (dequantized on the host: norms and biases are tiny)."""
        host = simd_kernels.get_rows(w.ggml_type, np.ascontiguousarray(w.data), np.arange(w.data.shape[0]))
        return self.cp.asarray(host.reshape(w.shape))

    def embed(self, w: QTensor, ids):
        """Rows ids of a device matrix: (len(ids), cols) f32."""
        ids = self.cp.asarray(
            np.asarray(ids, np.int64) if isinstance(ids, (list, np.ndarray)) else ids, dtype=self.cp.int64
        )
        cols = w.shape[1]
        out = self.cp.empty((ids.size, cols), self.cp.float32)  # (n, cols)
        self._rows(w, ids, out)
        return out

    def linears(self, ws, x):
        """[x @ W.T for W in ws] for weights that read the same x (the CPU backend's seam): one `linear` each."""
        return [self.linear(w, x) for w in ws]

    def linear(self, w: QTensor, x, out=None):
        """y = x @ W.T: x (n_tok, cols) f32 -> (n_tok, rows) f32, W raw blocks on this device."""
        cp = self.cp
        rows, cols = w.shape
        n_tok = x.shape[0]
        x = cp.ascontiguousarray(x)
        if out is None:
            out = cp.empty((n_tok, rows), cp.float32)  # (n_tok, rows)
        if n_tok <= FUSED_MAX_TOKENS:
            warps_per_block = THREADS // 32
            grid = (rows + warps_per_block - 1) // warps_per_block
            self._k("mul_" + _TYPE_NAMES[w.ggml_type])(
                (grid,),
                (THREADS,),
                (w.data, np.int64(w.data.shape[1]), np.int32(rows), np.int32(cols), x, np.int32(n_tok), out),
            )
            return out
        chunk = max(1, min(rows, TILE_ELEMS // cols))
        if self._tile is None:
            self._tile = cp.empty(TILE_ELEMS, cp.float32)  # flat; viewed as (chunk, cols)
        for r0 in range(0, rows, chunk):
            n = min(chunk, rows - r0)
            tile = self._tile[: n * cols].reshape(n, cols)  # (n, cols) dequantized rows r0..r0+n
            self._rows(w, cp.arange(r0, r0 + n, dtype=cp.int64), tile)
            if n == rows:
                cp.matmul(x, tile.T, out=out)
            else:
                out[:, r0 : r0 + n] = x @ tile.T
        return out

    def _rows(self, w: QTensor, ids, out) -> None:
        cols = w.shape[1]
        total = int(ids.size) * cols
        grid = max(1, min((total + THREADS - 1) // THREADS, 65535))
        self._k("rows_" + _TYPE_NAMES[w.ggml_type])(
            (grid,), (THREADS,), (w.data, np.int64(w.data.shape[1]), ids, np.int32(ids.size), np.int32(cols), out)
        )

    # -- attention -------------------------------------------------------------------------------

    def attention(
        self, q, k_cache, v_cache, positions, slots, window: int, scale: float, out, softcap: float = 0.0, sinks=None
    ):
        """Causal attention over this device's cache layer; shapes and softcap as `simd_kernels.ops.attention`.
        Attention sinks (gpt-oss) have no kernel here: refused by name, never ignored (gpt-oss is a mixture of
        experts, whose layers `offload` keeps on the CPU)."""
        if sinks is not None:
            raise checks.KernelArgumentError("attention sinks (attn_sinks) are not supported on the CUDA device")
        cp = self.cp
        if checks.attention(q, k_cache, v_cache, positions, slots, window, out) == 0:
            return out
        if not softcap >= 0:
            raise checks.KernelArgumentError(f"softcap must be 0 (off) or positive, got {softcap}")
        n_tok, n_head, hd = q.shape
        n_kv, cap, hd_v = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
        pmax = int(np.max(positions)) + 1
        max_keys = min(window, pmax) if window > 0 else pmax
        scores = cp.empty((n_tok * n_head, max_keys), cp.float32)  # (n_tok * n_head, n_keys) scratch
        self._k("attention")(
            (n_tok * n_head,),
            (128,),
            (
                cp.ascontiguousarray(q),
                k_cache,
                v_cache,
                self.host_constant(positions),
                self.host_constant(slots),
                np.int32(n_head),
                np.int32(n_kv),
                np.int32(cap),
                np.int32(hd),
                np.int32(hd_v),
                np.int32(window),
                np.float32(scale),
                np.float32(softcap),
                scores,
                np.int32(max_keys),
                out,
            ),
        )
        return out

    def _k(self, name: str):
        fn = self._fn.get(name)
        if fn is None:
            fn = self._fn[name] = self._mod.get_function(name)
        return fn


class CudaOps:
    """The `simd_kernels.ops` functions the arch code calls, on device arrays (same signatures)."""

    ROPE_NEOX = 2

    def __init__(self, dev: CUDABackend) -> None:
        self._dev = dev

    def _grid(self, n: int) -> tuple[int]:
        return (max(1, min((n + THREADS - 1) // THREADS, 65535)),)

    def rms_norm(self, x, w, eps, out):
        checks.norm(x, w, eps, out)
        return self._norm(x, None, w, eps, out)

    def add_rms_norm(self, x, delta, w, eps, out):
        checks.norm(x, w, eps, out, delta)
        return self._norm(x, delta, w, eps, out)

    def _norm(self, x, delta, w, eps, out):
        n = x.shape[-1]
        rows = x.size // n
        self._dev._k("add_rms_norm")(
            (rows,), (THREADS,), (x, delta if delta is not None else np.uint64(0), w, np.float32(eps), np.int32(n), out)
        )
        return out

    def rms_norm_heads(self, x, w, eps):
        """In place per head: x (n_tok, n_head, head_dim), w (head_dim,)."""
        checks.norm_heads(x, w, eps)
        return self._norm(x, None, w, eps, x)

    def rope(self, x, positions, n_rot, base, freq_scale, freq_factors, mode, yarn=None):
        if yarn is not None:  # no YaRN kernel here: refused by name, never ignored
            raise checks.KernelArgumentError("YaRN rope (rope.scaling.type 'yarn') is not supported on the CUDA device")
        checks.rope(x, positions, n_rot, base, freq_factors, mode, (0, self.ROPE_NEOX))
        n_tok, n_head, hd = x.shape
        half = n_rot // 2
        theta_scale = np.float32(np.float32(base) ** np.float32(-2.0 / n_rot))
        grid = (max(1, math.ceil(n_head * half / THREADS)), n_tok)
        self._dev._k("rope")(
            grid,
            (THREADS,),
            (
                x,
                self._dev.host_constant(positions),
                np.int32(n_head),
                np.int32(hd),
                np.int32(n_rot),
                theta_scale,
                np.float32(freq_scale),
                self._dev.host_constant(freq_factors),
                np.int32(1 if mode == self.ROPE_NEOX else 0),
            ),
        )
        return x

    def add_bias(self, x, b):
        x += b
        return x

    def swiglu(self, gate, up, out):
        return self._gated(gate, up, out, 0)

    def geglu_tanh(self, gate, up, out):
        return self._gated(gate, up, out, 1)

    def _gated(self, gate, up, out, gelu: int):
        checks.gated(gate, up, out)
        self._dev._k("gated")(self._grid(gate.size), (THREADS,), (gate, up, np.int64(gate.size), np.int32(gelu), out))
        return out

    def softcap(self, x, cap):
        checks.positive("softcap", cap)
        self._dev._k("softcap")(self._grid(x.size), (THREADS,), (x, np.int64(x.size), np.float32(cap)))
        return x

    def kv_store(self, k, v, k_cache, v_cache, positions, slots, as_f16=False):
        checks.kv_store(k, v, k_cache, v_cache, positions, slots)
        n_tok, n_kv, hd = k.shape
        hd_v = v.shape[2]
        total = n_tok * n_kv * max(hd, hd_v)
        self._dev._k("kv_store")(
            self._grid(total),
            (THREADS,),
            (
                self._dev.cp.ascontiguousarray(k),
                self._dev.cp.ascontiguousarray(v),
                k_cache,
                v_cache,
                self._dev.host_constant(positions),
                self._dev.host_constant(slots),
                np.int32(n_tok),
                np.int32(n_kv),
                np.int32(k_cache.shape[2]),
                np.int32(hd),
                np.int32(hd_v),
                np.int32(1 if as_f16 else 0),
            ),
        )
