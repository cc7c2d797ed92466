"""Tiny GGUF files for store/create/library tests, written with the `gguf` package's GGUFWriter
(an independent writer, so our reader is checked against files it did not produce)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


N_VOCAB = 16


def tiny_tensors(arch: str, n_embd: int, rng) -> dict[str, np.ndarray]:
    """One block of a llama-shaped model (2 heads, 1 KV head, n_ff = 2 n_embd), gemma3's extra norms too; all F32.

    Every tensor the engine's validator asks for is there, so create accepts the file."""
    hd, n_ff = n_embd // 2, 2 * n_embd

    def mat(rows, cols):
        return rng.standard_normal((rows, cols)).astype(np.float32)

    t = {
        "token_embd.weight": mat(N_VOCAB, n_embd),
        "output_norm.weight": np.ones(n_embd, np.float32),
    }  # (n_vocab, n_embd), (n_embd,)
    p = "blk.0."
    t.update(
        {
            p + "attn_norm.weight": np.ones(n_embd, np.float32),  # (n_embd,)
            p + "attn_q.weight": mat(2 * hd, n_embd),  # (n_head * head_dim, n_embd)
            p + "attn_k.weight": mat(hd, n_embd),  # (n_head_kv * head_dim, n_embd)
            p + "attn_v.weight": mat(hd, n_embd),
            p + "attn_output.weight": mat(n_embd, 2 * hd),
            p + "ffn_norm.weight": np.ones(n_embd, np.float32),
            p + "ffn_gate.weight": mat(n_ff, n_embd),
            p + "ffn_up.weight": mat(n_ff, n_embd),
            p + "ffn_down.weight": mat(n_embd, n_ff),
        }
    )
    if arch == "gemma3":
        for name, n in (
            ("attn_q_norm", hd),
            ("attn_k_norm", hd),
            ("post_attention_norm", n_embd),
            ("post_ffw_norm", n_embd),
        ):
            t[f"{p}{name}.weight"] = np.ones(n, np.float32)
    return t


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    general_type: str | None = "model",
    file_type: int | None = 0,
    extra: dict | None = None,
    n_embd: int = 8,
    seed: int = 0,
) -> Path:
    """A small valid llama-shaped GGUF (see tiny_tensors) with a 16-token vocabulary; all F32.

    `extra` adds string/int/float metadata (int -> UINT32, float -> FLOAT32)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    if general_type is not None:
        w.add_type(general_type)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(2 * n_embd)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
    for key, value in (extra or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    for name, arr in tiny_tensors(arch, n_embd, rng).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def n_params(n_embd: int = 8, arch: str = "llama") -> int:
    return sum(a.size for a in tiny_tensors(arch, n_embd, np.random.default_rng(0)).values())


def write_tiny_adapter(path: Path, *, arch: str = "llama", n_embd: int = 8) -> Path:
    """A LoRA-adapter-shaped GGUF (general.type=adapter, adapter.type=lora) with one A/B pair."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", rng.standard_normal((2, n_embd)).astype(np.float32))  # (rank, n_embd)
    w.add_tensor("blk.0.attn_q.weight.lora_b", rng.standard_normal((n_embd, 2)).astype(np.float32))  # (n_embd, rank)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_tiny_split(directory: Path, n_embd: int = 8) -> list[Path]:
    """A 3-part split set (one tensor per part) as llama.cpp's gguf-split names it; returns the parts."""
    rng = np.random.default_rng(2)
    w = gguf.GGUFWriter(str(Path(directory) / "split.gguf"), "llama", split_max_tensors=1)
    w.add_type("model")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", rng.standard_normal((16, n_embd)).astype(np.float32))  # (n_vocab, n_embd)
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((n_embd, n_embd)).astype(np.float32))  # (n_embd, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))  # (n_embd,)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(Path(directory).glob("split-*-of-*.gguf"))
