"""Fused dequantize x dot for the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Weights w: uint8 (rows, n_blocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1
(Q4_1, Q5_1) as llama.cpp does; each block's dot product is an exact integer sum.
Output out: float32 (n_tok, rows). Each weight row is decoded once per 8 tokens (the last 1-7 in one more pass);
tokens go in chunks so that their quantized activations stay in cache while every row streams past
(simd.fused_kernel).

The row dots are the prompt kernels' (simd_kernels.block32_prompt: eight blocks transposed in registers, one convert and one
FMA per eight blocks and token), on every host, so a decoded token, a drafted one and a prompt piece's compute alike,
and the same bits whatever integer-dot instructions the CPU has (tests/simd_kernels/test_kernels_x86.py). On AVX2 without
VNNI the row dots add the vpmaddubsw pair sums of 8 (Q4) or 4 (Q5) registers as words before one vpmaddwd, and dot
Q8_0's quants signed (vpsignb) rather than offset (ir.lane_dots). The figures behind both choices are in
docs/measurements.md.
"""

from __future__ import annotations

from .block32_prompt import QUANTIZE, ROWDOTS
from .simd import fused_kernel


def _kernel(name, doc):
    return fused_kernel(f"mul_{name}", doc, QUANTIZE[name], ROWDOTS[name], __name__)


mul_q8_0 = _kernel("q8_0", "Q8_0 block (34 B): d f16, qs int8[32]; y = d*q.")
mul_q4_0 = _kernel("q4_0", "Q4_0 block (18 B): d f16, qs[16]; y = d*(q - 8).")
mul_q4_1 = _kernel("q4_1", "Q4_1 block (20 B): d f16, m f16, qs[16]; y = d*q + m, dotted as d*dx*Σq*x + m*s (Q8_1).")
mul_q5_0 = _kernel("q5_0", "Q5_0 block (22 B): d f16, qh u32, qs[16]; y = d*(q - 16).")
mul_q5_1 = _kernel("q5_1", "Q5_1 block (24 B): d f16, m f16, qh u32, qs[16]; y = d*q + m (Q8_1 activations).")
