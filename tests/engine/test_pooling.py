"""Embeddings pooled as the file says (`{arch}.pooling_type`, issue 45): mean, cls (first token), last (last token:
qwen3-embedding); a file without it is mean-pooled; a reranker's or an unknown type is refused; a file that names a
pooling type is an embedding model (`embedding` capability, chat refused)."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.decoders import write_tiny

from localrt.engine.loader import load_model
from localrt.engine.pooling import pool, pooling_type
from localrt.errors import InvalidRequest, ModelLoadError

IDS = [1, 5, 2, 7]


@pytest.mark.parametrize("value, pick", [(None, "mean"), (1, "mean"), (2, "cls"), (3, "last"), (0, "mean")])
def test_pooling_follows_the_file(tmp_path, value, pick):
    extra = {} if value is None else {"llama.pooling_type": value}
    path = write_tiny(tmp_path / "m.gguf", extra=extra)
    model = load_model(path, num_ctx=64, tokenizer=False)
    try:
        hidden = model.hidden(IDS)
        want = {"mean": hidden.mean(axis=0), "cls": hidden[0], "last": hidden[-1]}[pick]
        np.testing.assert_allclose(model.embed(IDS), want, rtol=1e-5, atol=1e-6)
    finally:
        model.close()


def test_rank_and_unknown_types_are_refused():
    with pytest.raises(InvalidRequest, match="reranker"):
        pool(np.ones((2, 4), np.float32), pooling_type({"llama.pooling_type": 4}, "llama"))
    with pytest.raises(ModelLoadError, match="llama.pooling_type"):
        pooling_type({"llama.pooling_type": 9}, "llama")


def test_a_model_that_names_its_pooling_embeds_and_refuses_chat(tmp_path):
    import httpx
    import ollama
    from _daemon_fakes import real_daemon

    from fixtures.decoders import small, write_model

    path = tmp_path / "emb.gguf"
    write_model(path, small(), extra={"llama.pooling_type": 3})
    with real_daemon(tmp_path / "models") as srv:
        client = ollama.Client(host=srv.url)
        client.create(model="emb", files={"emb.gguf": client.create_blob(path)})
        assert client.show("emb").capabilities == ["embedding"]
        assert len(client.embed(model="emb", input="the the").embeddings[0]) == small().n_embd
        r = httpx.post(
            srv.url + "/api/chat",
            json={"model": "emb", "stream": False, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert r.status_code == 400 and "does not support chat" in r.json()["error"], r.text


@pytest.mark.parametrize("label, cos_tol", [("f32", 1e-5), ("q8_0", 2e-3)])
def test_qwen3_embedding_last_token_pooling_matches_llamacpp(tmp_path, label, cos_tol):
    """qwen3-embedding's layout in miniature (decoders.QWEN3_LAST: qwen3 with pooling type 3) embeds as llama.cpp
    does: the last token's state after the output norm (tests/data/bert/qwen3_last_*.npz, llama.cpp's pooling last,
    and none for every token). Q8_0: llama.cpp quantizes activations to 8 bits at other points than we do."""
    from fixtures import decoders
    from fixtures import encoders

    ref = np.load(encoders.DATA / f"qwen3_last_{label}.npz")
    ids = [int(i) for i in ref["ids"]]
    assert ids == decoders.QWEN3_LAST_IDS
    np.testing.assert_array_equal(ref["last"], ref["tokens"][-1])  # llama.cpp's last pooling is its last row
    wtype = {"f32": decoders.F32, "q8_0": decoders.Q8_0}[label]
    model = load_model(decoders.write(tmp_path / "m.gguf", decoders.QWEN3_LAST, wtype), num_ctx=64, tokenizer=False)
    try:
        got, want = model.embed(ids), ref["last"]
        assert encoders.cosine(got, want) > 1 - cos_tol
        mean = ref["tokens"].mean(axis=0)  # mean pooling would be far off: the test tells them apart
        assert encoders.cosine(got, mean) < 0.99
    finally:
        model.close()
