"""Fused dequantize x dot for the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Weights w: uint8 (rows, n_blocks * block_bytes), raw GGUF blocks read in place.
Activations x: float32 (n_tok, cols), quantized once per call to Q8_0 (Q4_0, Q5_0, Q8_0) or Q8_1
(Q4_1, Q5_1) as llama.cpp does; each block's dot product is an exact integer sum.
Output out: float32 (n_tok, rows). Each weight row is decoded once per 8 tokens (the last 1-7 in one more pass);
tokens go in chunks so that their quantized activations stay in cache while every row streams past
(simd.fused_kernel).

The row dots are the prompt kernels' (simd_kernels.block32_prompt: eight blocks transposed in registers, one convert and one
FMA per eight blocks and token), on every host, so a decoded token, a drafted one and a prompt piece's compute alike,
and the same bits whatever integer-dot instructions the CPU has (tests/test_kernels_x86.py). Against the row dots these
kernels had before (one convert, broadcast and FMA per block and token), measured on 2 threads of a Zen 4 EPYC, us per
call at 1 / 2 / 4 / 8 tokens: SmolLM2's Q4_1 1536 x 576 35 / 51 / 88 / 163 -> 37 / 45 / 61 / 87; 2048 x 2048 Q4_0 106 /
162 / 254 / 463 -> 73 / 90 / 133 / 191, Q8_0 96 / 121 / 218 / 390 -> 60 / 75 / 105 / 178, Q5_0 128 / 178 / 277 / 501 ->
92 / 109 / 146 / 204. SmolLM2's whole forward of 1 / 2 / 4 / 8 rows: 9.0 / 11.5 / 17.5 / 30.9 -> 6.6 / 7.2 / 9.0 / 14.0
ms.
On AVX2 without VNNI the row dots add the vpmaddubsw pair sums of 8 (Q4) or 4 (Q5) registers as words before one
vpmaddwd, and dot Q8_0's quants signed (vpsignb) rather than offset (prefill._lane_dots): measured on 2 threads of a
Zen 3 EPYC (a noisy shared VM, best of two interleaved runs), 2048 x 2048 us per call at 1 / 4 / 8 tokens, Q4_0
135 / 285 / 470 -> 101 / 183 / 273, Q4_1 125 / 234 / 363 -> 104 / 178 / 289, Q8_0 194 / 533 / 1097 -> 111 / 264 /
473, Q5_0 and Q5_1 0.98-1.2x; SmolLM2's whole forward of 1 / 2 / 4 / 5 / 8 rows 8.6 / 10.3 / 14.5 / 16.6 / 23.5 ->
7.9 / 9.7 / 12.9 / 14.4 / 19.6 ms.
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
