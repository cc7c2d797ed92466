"""The HTTP edge on a real socket, driven by the official `ollama` and `openai` clients, over a scripted service.

The service here is a stand-in for the engine, so these tests pin the wire format (framing, folding, errors,
guards) without weights; the end-to-end tests with real models live in test_daemon_*.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import httpx
import ollama
import openai
import pytest

from localrt import config as cfg
from localrt import errors
from localrt.serve.daemon import BackgroundServer, free_port

WORDS = ["Hello", ",", " world", "!"]


class Events:
    """An event iterator with a thread-safe cancel(), like the scheduler's."""

    def __init__(self, items, on_cancel=None):
        self._it = iter(items)
        self.cancelled = threading.Event()
        self.on_cancel = on_cancel

    def __iter__(self):
        return self

    def __next__(self):
        if self.cancelled.is_set():
            raise StopIteration
        item = next(self._it)
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self):
        self.cancelled.set()


def _done(extra):
    return {
        "done": True,
        "done_reason": "stop",
        "total_duration": 10,
        "load_duration": 1,
        "prompt_eval_count": 3,
        "prompt_eval_duration": 2,
        "eval_count": len(WORDS),
        "eval_duration": 5,
        **extra,
    }


class FakeService:
    def __init__(self):
        self.last = None

    def _base(self, req):
        return {"model": req.model, "created_at": "2026-11-29T18:00:00.000000Z"}

    def generate(self, req):
        self.last = req
        if req.model == "missing":
            raise errors.ModelNotFound(req.model)
        if req.model == "broken":
            return Events([{**self._base(req), "response": "a", "done": False}, RuntimeError("boom")])
        if not req.prompt:
            reason = "unload" if req.keep_alive == 0 else "load"
            return Events([{**self._base(req), "response": "", "done": True, "done_reason": reason}])
        chunks = [{**self._base(req), "response": w, "done": False} for w in WORDS]
        return Events(chunks + [{**self._base(req), "response": "", **_done({"context": [1, 2, 3]})}])

    def chat(self, req):
        self.last = req
        if req.model == "missing":
            raise errors.ModelNotFound(req.model)
        msg = lambda t: {"role": "assistant", "content": t}  # noqa: E731
        chunks = [{**self._base(req), "message": msg(w), "done": False} for w in WORDS]
        return Events(chunks + [{**self._base(req), "message": msg(""), **_done({})}])

    def embed(self, req, cancel=None):
        self.last = req
        return {"model": req.model, "embeddings": [[0.6, 0.8] for _ in req.inputs], "prompt_eval_count": 2}

    def tags(self):
        return {
            "models": [
                {
                    "name": "tiny:latest",
                    "model": "tiny:latest",
                    "modified_at": "2026-11-29T18:00:00+00:00",
                    "size": 10,
                    "digest": "ab" * 32,
                    "details": {"format": "gguf", "family": "llama"},
                }
            ]
        }

    def ps(self):
        return {"models": []}

    def show(self, body):
        return {"model_info": None, "modelfile": "FROM x", "template": "", "parameters": "", "license": ""}

    def copy(self, body):
        if body.get("source") == "missing":
            raise errors.ModelNotFound("missing")

    def delete(self, body):
        pass

    def create(self, body):
        return Events([{"status": "parsing modelfile"}, {"status": "success"}])

    pull = push = create

    def blob_exists(self, digest):
        return False

    def blob_writer(self, digest):
        raise errors.InvalidRequest("no blobs here")


@pytest.fixture(scope="module")
def daemon():
    service = FakeService()
    conf = dataclasses.replace(cfg.load({}), port=free_port())
    with BackgroundServer(service, conf) as srv:
        srv.service = service
        yield srv


def test_root_and_version(daemon):
    assert httpx.get(daemon.url + "/").text == "Ollama is running"
    assert httpx.get(daemon.url + "/api/version").json()["version"]


def test_ollama_generate_stream_and_fold(daemon):
    c = ollama.Client(host=daemon.url)
    parts = list(c.generate(model="tiny", prompt="hi", stream=True))
    assert "".join(p.response for p in parts) == "Hello, world!"
    assert parts[-1].done and parts[-1].done_reason == "stop" and parts[-1].eval_count == 4
    whole = c.generate(model="tiny", prompt="hi")
    assert whole.response == "Hello, world!" and whole.context == [1, 2, 3]


def test_ollama_chat_and_load_only(daemon):
    c = ollama.Client(host=daemon.url)
    r = c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert r.message.content == "Hello, world!" and r.message.role == "assistant"
    r = c.generate(model="tiny", prompt="", stream=True)  # load-only: one object even when streaming
    assert [p.done_reason for p in r] == ["load"]
    r = c.generate(model="tiny", keep_alive=0)
    assert r.done_reason == "unload"


def test_errors_map_to_status(daemon):
    c = ollama.Client(host=daemon.url)
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="missing", prompt="hi")
    assert e.value.status_code == 404 and "not found" in e.value.error
    r = httpx.post(daemon.url + "/api/generate", content=b"")
    assert r.status_code == 400 and r.json() == {"error": "missing request body"}
    r = httpx.post(daemon.url + "/api/generate", content=b"{nope")
    assert r.status_code == 400
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "x", "bogus": 1, "stream": False})
    assert r.status_code == 200 and r.json()["response"] == "Hello, world!"  # unknown keys are ignored (Ollama)
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "x", "images": ["aGk="]})
    assert r.status_code == 400 and "images" in r.json()["error"]


def test_error_after_first_byte_is_an_error_line(daemon):
    with httpx.stream("POST", daemon.url + "/api/generate", json={"model": "broken", "prompt": "x"}) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[0]["response"] == "a" and "error" in lines[-1]


def test_openai_chat_stream_usage_and_whole(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello, world!" and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 4
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=9,
            seed=1,
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Hello, world!" and chunks[-1].usage.total_tokens == 7
    opts = daemon.service.last.options
    assert opts["num_predict"] == 9 and opts["seed"] == 1 and opts["temperature"] == 1.0


def test_openai_rejects_bad_field_values(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], logit_bias={"1": 200})
    assert "logit_bias" in str(e.value)


def test_openai_completions_embeddings_models(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    r = c.completions.create(model="tiny", prompt="hi")
    assert r.choices[0].text == "Hello, world!"
    e = c.embeddings.create(model="tiny", input=["a", "b"])
    # the openai client asks for base64 by default and decodes little-endian float32
    assert [d.embedding for d in e.data] == [pytest.approx([0.6, 0.8], rel=1e-6)] * 2
    f = c.embeddings.create(model="tiny", input="a", encoding_format="float")
    assert f.data[0].embedding == [0.6, 0.8]
    assert [m.id for m in c.models.list().data] == ["tiny:latest"]
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


def test_guards_host_origin_and_body_cap(daemon):
    r = httpx.get(daemon.url + "/api/tags", headers={"Host": "evil.example.com"})
    assert r.status_code == 403
    r = httpx.post(daemon.url + "/api/chat", headers={"Origin": "https://evil.example.com"}, json={"model": "tiny"})
    assert r.status_code == 403
    r = httpx.get(daemon.url + "/api/tags", headers={"Origin": "null"})
    assert r.status_code == 403
    r = httpx.get(daemon.url + "/api/tags", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert _raw_post(daemon, "/api/generate", 1 << 40).startswith(b"HTTP/1.1 413")


def _raw_post(daemon, path: str, declared_length: int) -> bytes:
    """A request that declares a huge body and sends none: the cap must answer before reading it."""
    import socket

    with socket.create_connection((daemon.config.host, daemon.config.port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared_length}\r\n\r\n".encode())
        return s.recv(4096)


def test_api_key_required_when_configured():
    conf = dataclasses.replace(cfg.load({}), port=free_port(), api_key="s3cret")
    with BackgroundServer(FakeService(), conf) as srv:
        assert httpx.get(srv.url + "/api/tags").status_code == 401
        ok = httpx.get(srv.url + "/api/tags", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(srv.url + "/").status_code == 200
