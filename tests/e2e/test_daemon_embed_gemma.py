"""A gemma-embedding model end to end: a real daemon on a free port, the tiny EmbeddingGemma of encoders.write_gemma
(with its Dense projections) created through /api/blobs and /api/create, then /api/embed, /v1/embeddings and
/api/show, the vectors compared with llama.cpp's on the same file (tests/data/bert/gemma_f32_dense.npz)."""

from __future__ import annotations

import _ollama_files
from fixtures import encoders
import httpx
import numpy as np
import pytest
from _daemon_fakes import create_from_file, real_daemon

MODEL = "tiny-gemma-embed"
OLLAMA_MODEL = "tiny-embeddinggemma-ollama"  # the same weights in Ollama's pre-2026 layout (tests/_ollama_files.py)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    files = tmp_path_factory.mktemp("files")
    path = encoders.write_gemma(files / "m.gguf", dense=True)
    ollama = _ollama_files.embeddinggemma(path, files / "ollama.gguf")
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        create_from_file(srv.url, MODEL, path)
        create_from_file(srv.url, OLLAMA_MODEL, ollama)
        yield srv


@pytest.fixture(scope="module")
def ref():
    return np.load(encoders.DATA / "gemma_f32_dense.npz")


def _unit(v) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


def test_api_embed_equals_llamacpp_normalized(daemon, ref):
    r = httpx.post(
        daemon.url + "/api/embed", json={"model": MODEL, "input": [encoders.GEMMA_TEXT, "w5 w9"]}, timeout=120
    )
    assert r.status_code == 200, r.text
    body = r.json()
    got = np.asarray(body["embeddings"][0])
    assert len(got) == encoders.N_EMBD and abs(np.linalg.norm(got) - 1) < 1e-6  # Dense projections back to n_embd
    assert float(got @ _unit(ref["text_mean"])) > 1 - 2e-4
    assert body["prompt_eval_count"] == len(ref["text_ids"]) + 4  # [CLS] w5 w9 [SEP]


def test_v1_embeddings_equal_api_embed(daemon, ref):
    r = httpx.post(daemon.url + "/v1/embeddings", json={"model": MODEL, "input": encoders.GEMMA_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(ref["text_ids"])
    assert float(np.asarray(body["data"][0]["embedding"]) @ _unit(ref["text_mean"])) > 1 - 2e-4


def test_show_reports_the_embedding_capability_and_chat_is_refused(daemon):
    r = httpx.post(daemon.url + "/api/show", json={"model": MODEL}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["capabilities"] == ["embedding"]
    r = httpx.post(
        daemon.url + "/api/chat",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False},
        timeout=60,
    )
    assert r.status_code == 400 and "embedding model" in r.json()["error"]


def test_ollamas_own_embeddinggemma_layout_is_served_the_same(daemon):
    r = httpx.post(daemon.url + "/api/show", json={"model": OLLAMA_MODEL}, timeout=30)
    assert r.status_code == 200 and r.json()["capabilities"] == ["embedding"], r.text
    vectors = []
    for name in (MODEL, OLLAMA_MODEL):
        r = httpx.post(daemon.url + "/api/embed", json={"model": name, "input": encoders.GEMMA_TEXT}, timeout=120)
        assert r.status_code == 200, r.text
        vectors.append(r.json()["embeddings"][0])
    assert vectors[0] == vectors[1]
