"""Files as Ollama's converter wrote them before 2026, made from the llama.cpp-layout test files of fixtures.decoders and
fixtures.encoders: the same weights and values under Ollama's names (what `engine.compat.ollama_layout` reads back)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf_io


def _rewrite(src: Path, dst: Path, rename_key, rename_tensor, drop_keys=(), add: dict | None = None) -> Path:
    with gguf_io.open(src) as f:
        md = {rename_key(k): v for k, v in f.metadata.items() if not k.startswith("GGUF.") and k not in drop_keys}
        types = {rename_key(k): t for k, t in f.metadata_types.items() if k in f.metadata and k not in drop_keys}
        tensors = [(rename_tensor(n), t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items()]
    md.update(add or {})
    gguf_io.write(dst, md, tensors, metadata_types=types)
    return Path(dst)


def gptoss(src: Path, dst: Path) -> Path:
    """the decoder builder's gpt-oss file as Ollama's `gptoss`: keys under that prefix, neither expert_feed_forward_length nor
    rope.scaling.type, tensors attn_out, attn_sinks (no .weight) and ffn_norm."""

    def tensor(name: str) -> str:
        return (
            name.replace(".attn_output.", ".attn_out.")
            .replace(".post_attention_norm.", ".ffn_norm.")
            .replace(".attn_sinks.weight", ".attn_sinks")
        )

    def key(k: str) -> str:
        return "gptoss." + k[len("gpt-oss.") :] if k.startswith("gpt-oss.") else k

    return _rewrite(
        src,
        dst,
        key,
        tensor,
        drop_keys=("gpt-oss.expert_feed_forward_length", "gpt-oss.rope.scaling.type"),
        add={"general.architecture": "gptoss"},
    )


def embeddinggemma(src: Path, dst: Path) -> Path:
    """the encoder builder's gemma-embedding file (with its Dense layers) as Ollama's embeddinggemma: architecture gemma3, its rope
    bases as rope.global.freq_base / rope.local.freq_base, no dense width keys, tensors dense.0, dense.1 and norm."""
    renames = {
        "dense_2.weight": "dense.0.weight",
        "dense_3.weight": "dense.1.weight",
        "output_norm.weight": "norm.weight",
    }
    keys = {"rope.freq_base": "rope.global.freq_base", "rope.freq_base_swa": "rope.local.freq_base"}

    def key(k: str) -> str:
        if not k.startswith("gemma-embedding."):
            return k
        rest = k[len("gemma-embedding.") :]
        return "gemma3." + keys.get(rest, rest)

    drop = tuple(f"gemma-embedding.dense_{i}_feat_{d}" for i in (2, 3) for d in ("in", "out"))
    return _rewrite(
        src,
        dst,
        key,
        lambda n: renames.get(n, n),
        drop_keys=drop,
        add={"general.architecture": "gemma3", "gemma3.attention.causal": False},
    )


def gemma3(src: Path, dst: Path, extra_tokens: int = 0) -> Path:
    """the decoder builder's gemma3 file as Ollama's converter wrote gemma3 1B: rope bases as rope.global/local.freq_base, no
    layer_norm_rms_epsilon, and `extra_tokens` more tokens in the tokenizer's arrays than token_embd has rows (as
    Ollama's multimodal gemma3 files keep)."""
    keys = {
        "gemma3.rope.freq_base": "gemma3.rope.global.freq_base",
        "gemma3.rope.freq_base_swa": "gemma3.rope.local.freq_base",
    }
    with gguf_io.open(src) as f:
        tokens, types = list(f.metadata["tokenizer.ggml.tokens"]), list(f.metadata["tokenizer.ggml.token_type"])
    add = {
        "tokenizer.ggml.tokens": tokens + [f"<extra_{i}>" for i in range(extra_tokens)],
        "tokenizer.ggml.token_type": types + [4] * extra_tokens,
    }  # 4: user defined
    return _rewrite(
        src, dst, lambda k: keys.get(k, k), lambda n: n, drop_keys=("gemma3.attention.layer_norm_rms_epsilon",), add=add
    )
