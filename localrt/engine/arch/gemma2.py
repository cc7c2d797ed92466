"""gemma2: gemma3's forward (scaled embedding, sandwich norms, GELU-tanh gated FFN, alternating sliding-window
layers) without q/k norms, with attention-logit and final-logit soft-capping (`attn_softcap`, `final_logit_softcap`
in the config: llama.cpp's defaults 50 and 30 when the file has no keys).

Even layers are local (sliding_window_pattern 2, window 4096 by default); local layers use the global rope base
and scaling unless the file has rope.freq_base_swa. The output is always token_embd (llama.cpp reads no
output.weight for gemma2). Norm weights in the file already include Gemma's +1.
"""

from __future__ import annotations

from simd_kernels import ops

from .common import TensorSource, Weights, block_tensors, load_common
from .gemma3 import forward

__all__ = ["BLOCK", "GLOBALS", "ROPE_MODE", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
BLOCK = block_tensors(sandwich=True)
GLOBALS = {
    "token_embd.weight": (("n_vocab", "n_embd"), True),
    "output_norm.weight": (("n_embd",), True),
}


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK, GLOBALS)
