"""Every GGML block format described once, as data: elements per block, bytes per block, byte layout.

A block's layout is a NumPy structured dtype built from `fields` (name, dtype, count) in byte order,
so `raw.view(fmt.dtype)` exposes every field of every block without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gguf_io import BLOCK_SIZES, GGMLType

QK = 32  # elements per block of the legacy types (QK4_0 = ... = QK8_1)
QK_K = 256  # elements per super-block of the K-quants

# The 16 levels of the non-linear 4-bit formats (IQ4_NL, IQ4_XS): a 4-bit index q stands for
# KVALUES_IQ4NL[q] (ggml's kvalues_iq4nl), denser near zero where weights crowd.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

# MXFP4's 16 E2M1 values, doubled so that they are integers (ggml's kvalues_mxfp4): code q stands for
# KVALUES_MXFP4[q] / 2 times the block's power-of-two scale; bit 3 is the sign (codes 0 and 8 are both zero).
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


class QuantError(ValueError):
    """Bad input to quant: unknown type, shape/size mismatch, non-finite values to quantize."""


@dataclass(frozen=True)
class BlockFormat:
    name: str
    ggml_type: int
    block_size: int  # elements per block (gguf_io.BLOCK_SIZES, the one table of sizes)
    type_size: int  # bytes per block
    fields: tuple[tuple[str, str, int], ...]  # (name, little-endian dtype, count) in byte order
    activations_only: bool = False  # Q8_1 / Q8_K: built on the fly for dot products, never in files
    dtype: np.dtype = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dtype = np.dtype([(n, t) if c == 1 else (n, t, (c,)) for n, t, c in self.fields])
        if dtype.itemsize != self.type_size:
            raise AssertionError(f"{self.name}: fields take {dtype.itemsize} bytes, not {self.type_size}")
        object.__setattr__(self, "dtype", dtype)


def _block(name: str, fields: tuple[tuple[str, str, int], ...], activations_only: bool = False) -> BlockFormat:
    """The format of GGML type `name`, its sizes read from gguf_io's table; the fields must fill its bytes."""
    ggml_type = GGMLType[name]
    block_size, type_size = BLOCK_SIZES[ggml_type]
    return BlockFormat(name, ggml_type, block_size, type_size, fields, activations_only)


_K_SCALE_SIZE = 12  # packed 6-bit scales and mins of Q4_K / Q5_K, and 16 6-bit scales of Q3_K

FORMATS: dict[int, BlockFormat] = {
    f.ggml_type: f
    for f in (
        _block("F32", (("x", "<f4", 1),)),
        _block("F16", (("x", "<f2", 1),)),
        _block("BF16", (("x", "<u2", 1),)),
        _block("Q4_0", (("d", "<f2", 1), ("qs", "u1", 16))),
        _block("Q4_1", (("d", "<f2", 1), ("m", "<f2", 1), ("qs", "u1", 16))),
        _block("Q5_0", (("d", "<f2", 1), ("qh", "<u4", 1), ("qs", "u1", 16))),
        _block("Q5_1", (("d", "<f2", 1), ("m", "<f2", 1), ("qh", "<u4", 1), ("qs", "u1", 16))),
        _block("Q8_0", (("d", "<f2", 1), ("qs", "i1", 32))),
        _block("Q8_1", (("d", "<f2", 1), ("s", "<f2", 1), ("qs", "i1", 32)), activations_only=True),
        _block("Q2_K", (("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2", 1), ("dmin", "<f2", 1))),
        _block("Q3_K", (("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", _K_SCALE_SIZE), ("d", "<f2", 1))),
        _block("Q4_K", (("d", "<f2", 1), ("dmin", "<f2", 1), ("scales", "u1", _K_SCALE_SIZE), ("qs", "u1", 128))),
        _block(
            "Q5_K",
            (("d", "<f2", 1), ("dmin", "<f2", 1), ("scales", "u1", _K_SCALE_SIZE), ("qh", "u1", 32), ("qs", "u1", 128)),
        ),
        _block("Q6_K", (("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2", 1))),
        # y = d * KVALUES_IQ4NL[q]; q: element j in the low nibble of qs[j], element j+16 in the high one
        _block("IQ4_NL", (("d", "<f2", 1), ("qs", "u1", 16))),
        # 8 sub-blocks of 32, each with a 6-bit scale ls (low 4 bits in scales_l nibble j, high 2 bits in
        # bits 2j..2j+1 of scales_h); y = d * (ls - 32) * KVALUES_IQ4NL[q], qs as 8 IQ4_NL quant arrays
        _block("IQ4_XS", (("d", "<f2", 1), ("scales_h", "<u2", 1), ("scales_l", "u1", 4), ("qs", "u1", 128))),
        # y = 2^(e - 128) * KVALUES_MXFP4[q] (half the E8M0 scale 2^(e - 127): the table is doubled); e is a biased
        # exponent byte, no sign or mantissa; q: element j in the low nibble of qs[j], element j+16 in the high one
        _block("MXFP4", (("e", "u1", 1), ("qs", "u1", 16))),
        _block("Q8_K", (("d", "<f4", 1), ("qs", "i1", 256), ("bsums", "<i2", 16)), activations_only=True),
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
    GGMLType.MXFP4: GGMLType.Q8_0,
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
