"""Fused dequantize x dot for the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Weights w: uint8 (rows, n_blocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1
(Q4_1, Q5_1) as llama.cpp does; each block's dot product is an exact integer sum (simd.ROWDOTS).
Output out: float32 (n_tok, rows). Each weight row is decoded once per 8 tokens (Q5_0: 4; the last 1-3 in one
more pass); tokens go in chunks so that their quantized activations stay in cache while every row streams past
(simd.fused_kernel).
Each format's block layout and decode step is in simd._LAYOUTS.
"""
from __future__ import annotations

from .actquant import quantize_q8_0, quantize_q8_1
from .simd import ROWDOTS, fused_kernel


def _kernel(name, doc, quantize):
    rowdots = ROWDOTS[name][:4] if name == "q5_0" else ROWDOTS[name]  # Q5_0: 4 tokens per pass (see simd.ROW_TOKENS)
    return fused_kernel(f"mul_{name}", doc, quantize, rowdots, __name__)


mul_q8_0 = _kernel("q8_0", "Q8_0 block (34 B): d f16, qs int8[32]; y = d*q.", quantize_q8_0)
mul_q4_0 = _kernel("q4_0", "Q4_0 block (18 B): d f16, qs[16]; y = d*(q - 8).", quantize_q8_0)
mul_q4_1 = _kernel("q4_1", "Q4_1 block (20 B): d f16, m f16, qs[16]; y = d*q + m, dotted as d*dx*Σq*x + m*s (Q8_1).",
                   quantize_q8_1)
mul_q5_0 = _kernel("q5_0", "Q5_0 block (22 B): d f16, qh u32, qs[16]; y = d*(q - 16).", quantize_q8_0)
mul_q5_1 = _kernel("q5_1", "Q5_1 block (24 B): d f16, m f16, qh u32, qs[16]; y = d*q + m (Q8_1 activations).",
                   quantize_q8_1)
