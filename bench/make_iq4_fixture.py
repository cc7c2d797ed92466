"""A tiny random-weight llama whose matrices are IQ4_NL and IQ4_XS, and llama.cpp's outputs on it.

    LLAMA_CPP_LIB_PATH=... PYTHONPATH=.:<llama-cpp-python> python3 bench/make_iq4_fixture.py

Writes tests/data/iq4_tiny.gguf (with gguf_io's writer; weights quantized by quant, which is byte-exact with
ggml's quantizers) and tests/data/iq4_llamacpp.json: for fixed prompts (token ids), llama.cpp's top-8 logits at
every position of one batched prefill, and its greedy continuation by single-token decode steps with the top-2
logits of each step. tests/engine/test_iq4_model.py checks the engine against them; it needs no llama.cpp.
Needs `llama-cpp-python` (tests never do).

Shapes: n_embd 64, 4 query heads and 1 KV head of 64 (so attn_output and ffn_down have rows of 256, IQ4_XS's
super-block), n_ff 256, 2 layers, the 260-token byte-level BPE vocabulary of tests/fixtures/decoders.py. IQ4_NL:
token_embd (tied output), attn_q/k/v, ffn_gate/up; IQ4_XS: attn_output, ffn_down. About 110 KB.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import gguf_io  # noqa: E402
import quant  # noqa: E402
from fixtures.reference import BYTE_MERGES, BYTE_TOKENS, EOS_ID  # noqa: E402
from gguf_io import GGMLType, GGUFValueType  # noqa: E402

OUT_GGUF = ROOT / "tests" / "data" / "iq4_tiny.gguf"
OUT_JSON = ROOT / "tests" / "data" / "iq4_llamacpp.json"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_LAYER = 64, 4, 1, 64, 256, 2
PROMPT_LENGTHS = (7, 16, 33, 48)
N_PREDICT = 16
TOP = 8


def tensors(seed: int = 11) -> list[tuple[str, int, tuple[int, int], np.ndarray]]:
    rng = np.random.default_rng(seed)
    q_out, kv_out = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM

    def mat(name, rows, cols, ggml_type, scale=None):
        m = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale or 1 / math.sqrt(cols))
        return name, ggml_type, (rows, cols), quant.quantize(m, ggml_type)

    def norm(name):
        return name, GGMLType.F32, (N_EMBD,), (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)

    out = [mat("token_embd.weight", len(BYTE_TOKENS), N_EMBD, GGMLType.IQ4_NL, 1.0), norm("output_norm.weight")]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        out += [
            norm(p + "attn_norm.weight"),
            mat(p + "attn_q.weight", q_out, N_EMBD, GGMLType.IQ4_NL),
            mat(p + "attn_k.weight", kv_out, N_EMBD, GGMLType.IQ4_NL),
            mat(p + "attn_v.weight", kv_out, N_EMBD, GGMLType.IQ4_NL),
            mat(p + "attn_output.weight", N_EMBD, q_out, GGMLType.IQ4_XS),
            norm(p + "ffn_norm.weight"),
            mat(p + "ffn_gate.weight", N_FF, N_EMBD, GGMLType.IQ4_NL),
            mat(p + "ffn_up.weight", N_FF, N_EMBD, GGMLType.IQ4_NL),
            mat(p + "ffn_down.weight", N_EMBD, N_FF, GGMLType.IQ4_XS),
        ]
    return out


def metadata() -> tuple[dict, dict]:
    a = "llama"
    meta = {
        "general.architecture": a,
        "general.name": "iq4-tiny",
        "general.file_type": 25,  # MOSTLY_IQ4_NL
        f"{a}.block_count": N_LAYER,
        f"{a}.context_length": 256,
        f"{a}.embedding_length": N_EMBD,
        f"{a}.feed_forward_length": N_FF,
        f"{a}.attention.head_count": N_HEAD,
        f"{a}.attention.head_count_kv": N_HEAD_KV,
        f"{a}.attention.key_length": HEAD_DIM,
        f"{a}.attention.value_length": HEAD_DIM,
        f"{a}.rope.dimension_count": HEAD_DIM,
        f"{a}.rope.freq_base": 10000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": BYTE_TOKENS,
        "tokenizer.ggml.token_type": [1] * (len(BYTE_TOKENS) - 1) + [3],
        "tokenizer.ggml.merges": BYTE_MERGES,
        "tokenizer.ggml.eos_token_id": EOS_ID,
        "tokenizer.ggml.bos_token_id": EOS_ID,
        "tokenizer.ggml.add_bos_token": False,
    }
    types = {
        f"{a}.rope.freq_base": GGUFValueType.FLOAT32,
        f"{a}.attention.layer_norm_rms_epsilon": GGUFValueType.FLOAT32,
        "tokenizer.ggml.token_type": (GGUFValueType.ARRAY, GGUFValueType.INT32),
    }
    return meta, types


def prompts(seed: int = 5) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, EOS_ID, n).tolist() for n in PROMPT_LENGTHS]  # never the EOS token


def _top(row: np.ndarray, k: int) -> list[list]:
    idx = np.argsort(-row, kind="stable")[:k]
    return [[int(i), float(row[i])] for i in idx]


def llama_cpp_outputs(path: Path) -> list[dict]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, logits_all=True, n_threads=2, verbose=False, seed=0)
    entries = []
    for ids in prompts():
        llm.reset()
        llm.eval(ids)  # one batched prefill
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)  # (len(ids), n_vocab)
        entry = {"ids": ids, "top_logits": [_top(s, TOP) for s in scores], "continuation": []}
        nxt = int(np.argmax(scores[-1]))
        for _ in range(N_PREDICT):  # greedy, one token per decode step
            llm.eval([nxt])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            entry["continuation"].append({"id": nxt, "next_top2": _top(row, 2)})
            nxt = int(np.argmax(row))
        entries.append(entry)
    return entries


def main() -> None:
    meta, types = metadata()
    gguf_io.write(OUT_GGUF, meta, tensors(), metadata_types=types)
    import llama_cpp

    doc = {
        "note": "llama.cpp's logits on tests/data/iq4_tiny.gguf; made by bench/make_iq4_fixture.py",
        "llama_cpp_python": llama_cpp.__version__,
        "n_threads": 2,
        "top": TOP,
        "entries": llama_cpp_outputs(OUT_GGUF),
    }
    OUT_JSON.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{OUT_GGUF.name}: {OUT_GGUF.stat().st_size} bytes; {OUT_JSON.name}: {OUT_JSON.stat().st_size} bytes")


if __name__ == "__main__":
    main()
