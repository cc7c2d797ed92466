"""Tiny GGUF files for store/create/library tests, written with the `gguf` package's GGUFWriter
(an independent writer, so our reader is checked against files it did not produce)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


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
    """A small llama-shaped GGUF: token_embd (16, n_embd), one attention weight, output_norm; all F32.

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
    for key, value in (extra or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    w.add_tensor("token_embd.weight", rng.standard_normal((16, n_embd)).astype(np.float32))  # (n_vocab, n_embd)
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((n_embd, n_embd)).astype(np.float32))  # (n_embd, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))  # (n_embd,)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def n_params(n_embd: int = 8) -> int:
    return 16 * n_embd + n_embd * n_embd + n_embd


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
