"""The compute seam between the model graph and a device.

The arch files call only `Backend` methods for weight products (`linear`, `embed`) and the
`simd_kernels.ops` kernels for the rest, so a device (CPU now, CUDA later) is one class here.
Weights are `QTensor`s: raw GGUF blocks viewed in place in the mmap, never dequantized whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32, F16 = 0, 1


@dataclass(frozen=True, eq=False)
class QTensor:
    """A weight as stored in the file: `data` is the raw uint8 view (n_rows, row_bytes) into the mmap."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # NumPy order: (rows, cols) for a matrix, (n,) for a vector
    data: np.ndarray

    @property
    def rows(self) -> int:
        return self.shape[0]


class CPUBackend:
    """NumPy + Numba on the host. Stateless apart from a per-tensor cache for the fallback path."""

    name = "cpu"

    def __init__(self) -> None:
        self._dequant: dict[int, np.ndarray] = {}

    def vector(self, w: QTensor) -> np.ndarray:
        """A small F32/F16 tensor (norm weights, biases) as float32 (shape,), zero-copy when F32."""
        if w.ggml_type == F32:
            return w.data.reshape(-1).view(np.float32).reshape(w.shape)
        return self._full(w).reshape(w.shape)

    def embed(self, w: QTensor, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of an embedding matrix: (len(ids), n_embd) float32."""
        from gguf import quants

        return quants.dequantize(w.data[ids], w.ggml_type).reshape(len(ids), w.shape[1])

    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """y = x @ W.T: x (n_tok, cols) float32 -> (n_tok, rows) float32."""
        full = self._full(w)
        if out is None:
            return x @ full.T
        np.matmul(x, full.T, out=out)
        return out

    def _full(self, w: QTensor) -> np.ndarray:
        # Temporary path until the fused kernels land: dequantize once per tensor.
        key = id(w)
        if key not in self._dequant:
            from gguf import quants

            self._dequant[key] = np.ascontiguousarray(quants.dequantize(w.data, w.ggml_type))
        return self._dequant[key]
