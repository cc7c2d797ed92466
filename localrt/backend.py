"""The compute seam between the model graph and a device.

The arch files call only `Backend` methods for weight products (`linear`, `embed`) and the
`simd_kernels.ops` kernels for the rest, so a device (CPU now, CUDA later) is one class here.
Weights are `QTensor`s: raw GGUF blocks viewed in place in the mmap, never dequantized whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import simd_kernels

F32 = 0


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

    def vector(self, w: QTensor) -> np.ndarray:
        """A small tensor (norm weights, biases) as float32 (shape,): zero-copy when F32."""
        if w.ggml_type == F32:
            return w.data.reshape(-1).view(np.float32).reshape(w.shape)
        return simd_kernels.get_rows(w.ggml_type, w.data, np.arange(w.data.shape[0])).reshape(w.shape)

    def embed(self, w: QTensor, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of an embedding matrix: (len(ids), n_embd) float32."""
        return simd_kernels.get_rows(w.ggml_type, w.data, ids)

    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """y = x @ W.T: x (n_tok, cols) float32 -> (n_tok, rows) float32."""
        return simd_kernels.matmul(w.ggml_type, w.data, x, out)
