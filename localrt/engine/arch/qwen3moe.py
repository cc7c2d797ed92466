"""qwen3moe (Qwen 3 30B-A3B / 235B-A22B): the qwen3 graph (per-head q/k RMS norms before NEOX rope, no biases)
with a mixture-of-experts FFN in every block (see .moe): the router `ffn_gate_inp` (n_expert, n_embd) and the
experts stacked in 3-D tensors `ffn_{gate,up}_exps` (n_expert, n_ff_exp, n_embd), `ffn_down_exps`
(n_expert, n_embd, n_ff_exp), each expert viewed in place."""

from __future__ import annotations

from simd_kernels import ops

from .common import TensorSource, Weights, block_tensors, load_common
from .llama import forward
from .qwen3 import GLOBALS

__all__ = ["BLOCK", "GLOBALS", "ROPE_MODE", "load", "forward"]


ROPE_MODE = ops.ROPE_NEOX
BLOCK = {
    name: spec
    for name, spec in block_tensors(qk_norm=True).items()
    if not name.startswith("ffn_") or name == "ffn_norm.weight"
}
BLOCK.update(
    {
        "ffn_gate_inp.weight": (("n_expert", "n_embd"), True),
        "ffn_gate_exps.weight": (("n_expert", "n_ff_exp", "n_embd"), True),
        "ffn_up_exps.weight": (("n_expert", "n_ff_exp", "n_embd"), True),
        "ffn_down_exps.weight": (("n_expert", "n_embd", "n_ff_exp"), True),
    }
)


def load(cfg, src: TensorSource) -> Weights:
    return load_common(cfg, src, BLOCK, GLOBALS)
