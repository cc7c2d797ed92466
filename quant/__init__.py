"""GGML block formats as data, with slow, obvious NumPy reference dequantizers and quantizers."""

from quant.dequant import dequantize
from quant.formats import (
    FORMATS,
    KVALUES_IQ4NL,
    KVALUES_MXFP4,
    QK,
    QK_K,
    VEC_DOT_TYPE,
    BlockFormat,
    GGMLType,
    QuantError,
    get_format,
    row_bytes,
)
from quant.quantize import quantize, quantize_activations

__all__ = [
    "FORMATS",
    "KVALUES_IQ4NL",
    "KVALUES_MXFP4",
    "QK",
    "QK_K",
    "VEC_DOT_TYPE",
    "BlockFormat",
    "GGMLType",
    "QuantError",
    "dequantize",
    "get_format",
    "quantize",
    "quantize_activations",
    "row_bytes",
]
