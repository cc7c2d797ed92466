"""Every GGML block format described once, as data: elements per block, bytes per block, byte layout.

A block's layout is a NumPy structured dtype built from `fields` (name, dtype, count) in byte order,
so `raw.view(fmt.dtype)` exposes every field of every block without copying.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gguf_io import GGMLType

QK = 32  # elements per block of the legacy types (QK4_0 = ... = QK8_1)
QK_K = 256  # elements per super-block of the K-quants

# The 16 levels of the non-linear 4-bit formats (IQ4_NL, IQ4_XS): a 4-bit index q stands for
# KVALUES_IQ4NL[q] (ggml's kvalues_iq4nl), denser near zero where weights crowd.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class QuantError(ValueError):
    """Bad input to quant: unknown type, shape/size mismatch, non-finite values to quantize."""


@dataclass(frozen=True)
class BlockFormat:
    name: str
    ggml_type: int
    block_size: int  # elements per block
    type_size: int  # bytes per block
    fields: tuple[tuple[str, str, int], ...]  # (name, little-endian dtype, count) in byte order
    activations_only: bool = False  # Q8_1 / Q8_K: built on the fly for dot products, never in files
    dtype: np.dtype = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dtype = np.dtype([(n, t) if c == 1 else (n, t, (c,)) for n, t, c in self.fields])
        if dtype.itemsize != self.type_size:
            raise AssertionError(f"{self.name}: fields take {dtype.itemsize} bytes, not {self.type_size}")
        object.__setattr__(self, "dtype", dtype)


_K_SCALE_SIZE = 12  # packed 6-bit scales and mins of Q4_K / Q5_K, and 16 6-bit scales of Q3_K

FORMATS: dict[int, BlockFormat] = {
    f.ggml_type: f
    for f in (
        BlockFormat("F32", GGMLType.F32, 1, 4, (("x", "<f4", 1),)),
        BlockFormat("F16", GGMLType.F16, 1, 2, (("x", "<f2", 1),)),
        BlockFormat("BF16", GGMLType.BF16, 1, 2, (("x", "<u2", 1),)),
        BlockFormat("Q4_0", GGMLType.Q4_0, QK, 18, (("d", "<f2", 1), ("qs", "u1", 16))),
        BlockFormat("Q4_1", GGMLType.Q4_1, QK, 20, (("d", "<f2", 1), ("m", "<f2", 1), ("qs", "u1", 16))),
        BlockFormat("Q5_0", GGMLType.Q5_0, QK, 22, (("d", "<f2", 1), ("qh", "<u4", 1), ("qs", "u1", 16))),
        BlockFormat(
            "Q5_1", GGMLType.Q5_1, QK, 24,
            (("d", "<f2", 1), ("m", "<f2", 1), ("qh", "<u4", 1), ("qs", "u1", 16)),
        ),
        BlockFormat("Q8_0", GGMLType.Q8_0, QK, 34, (("d", "<f2", 1), ("qs", "i1", 32))),
        BlockFormat(
            "Q8_1", GGMLType.Q8_1, QK, 36, (("d", "<f2", 1), ("s", "<f2", 1), ("qs", "i1", 32)),
            activations_only=True,
        ),
        BlockFormat(
            "Q2_K", GGMLType.Q2_K, QK_K, 84,
            (("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2", 1), ("dmin", "<f2", 1)),
        ),
        BlockFormat(
            "Q3_K", GGMLType.Q3_K, QK_K, 110,
            (("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", _K_SCALE_SIZE), ("d", "<f2", 1)),
        ),
        BlockFormat(
            "Q4_K", GGMLType.Q4_K, QK_K, 144,
            (("d", "<f2", 1), ("dmin", "<f2", 1), ("scales", "u1", _K_SCALE_SIZE), ("qs", "u1", 128)),
        ),
        BlockFormat(
            "Q5_K", GGMLType.Q5_K, QK_K, 176,
            (
                ("d", "<f2", 1), ("dmin", "<f2", 1), ("scales", "u1", _K_SCALE_SIZE),
                ("qh", "u1", 32), ("qs", "u1", 128),
            ),
        ),
        BlockFormat(
            "Q6_K", GGMLType.Q6_K, QK_K, 210,
            (("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2", 1)),
        ),
        # y = d * KVALUES_IQ4NL[q]; q: element j in the low nibble of qs[j], element j+16 in the high one
        BlockFormat("IQ4_NL", GGMLType.IQ4_NL, QK, 18, (("d", "<f2", 1), ("qs", "u1", 16))),
        # 8 sub-blocks of 32, each with a 6-bit scale ls (low 4 bits in scales_l nibble j, high 2 bits in
        # bits 2j..2j+1 of scales_h); y = d * (ls - 32) * KVALUES_IQ4NL[q], qs as 8 IQ4_NL quant arrays
        BlockFormat(
            "IQ4_XS", GGMLType.IQ4_XS, QK_K, 136,
            (("d", "<f2", 1), ("scales_h", "<u2", 1), ("scales_l", "u1", 4), ("qs", "u1", 128)),
        ),
        BlockFormat(
            "Q8_K", GGMLType.Q8_K, QK_K, 292,
            (("d", "<f4", 1), ("qs", "i1", 256), ("bsums", "<i2", 16)),
            activations_only=True,
        ),
    )
}

# The activation format llama.cpp's CPU backend converts x to before each weight-type dot product.
VEC_DOT_TYPE: dict[int, int] = {
    GGMLType.F32: GGMLType.F32,
    GGMLType.F16: GGMLType.F16,
    GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0,
    GGMLType.Q5_0: GGMLType.Q8_0,
    GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1,
    GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K,
    GGMLType.Q3_K: GGMLType.Q8_K,
    GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.IQ4_NL: GGMLType.Q8_0,
    GGMLType.IQ4_XS: GGMLType.Q8_K,
}


def get_format(ggml_type: int) -> BlockFormat:
    fmt = FORMATS.get(int(ggml_type))
    if fmt is None:
        raise QuantError(f"unsupported ggml tensor type id {int(ggml_type)}")
    return fmt


def row_bytes(ggml_type: int, n_cols: int) -> int:
    """Bytes of one row of n_cols elements; n_cols must be a whole number of blocks."""
    fmt = get_format(ggml_type)
    if n_cols <= 0 or n_cols % fmt.block_size:
        raise QuantError(f"{fmt.name} rows need a positive multiple of {fmt.block_size} elements, got {n_cols}")
    return n_cols // fmt.block_size * fmt.type_size
