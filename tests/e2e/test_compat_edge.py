"""The small drop-in behaviours, on a real daemon over the scripted model: /v1 stream framing (role once, an empty
finish delta) checked with openai's own `.stream()` helper, x-request-id, /v1 refusals in OpenAI's error shape,
general.parameter_count in /api/show, num_gpu on a machine without a GPU, create --quantize of a quantized
model, and a create/copy over a loaded model's name taking effect on the next request."""

from __future__ import annotations

import dataclasses
import json
import logging

import gguf_io
import httpx
import ollama
import openai
import pytest

from _daemon_fakes import MODEL, fake_daemon, make_config
from fixtures.decoders import write_tiny
from localrt.engine.backends.devices import DeviceReport
from localrt.models.create import create
from localrt.runtime.service import Service
from localrt.serve import openai_compat, openai_replies
from localrt.serve.daemon import BackgroundServer

NO_GPU = DeviceReport(None, "no CUDA device in this test")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with fake_daemon(tmp_path_factory.mktemp("models"), service_kw={"gpu_probe": lambda _main_gpu: NO_GPU}) as d:
        yield d


def _sse(r: httpx.Response) -> list[dict]:
    lines = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_v1_stream_sends_the_role_once_and_an_empty_finish_delta(daemon):
    srv, _ = daemon
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(c) for c in _sse(r)]
    deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices]
    assert deltas == [{"role": "assistant", "content": "x"}, {"content": "x"}, {"content": "x"}, {}]
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, None, None, "length"]
    assert chunks[-1].usage.completion_tokens == 3 and len({c.id for c in chunks}) == 1
    assert len({c.created for c in chunks}) == 1


def test_openai_stream_helper_accumulates_one_assistant_message(daemon):
    srv, _ = daemon
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "hi [eos]"}], max_tokens=4
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.role == "assistant" and message.content == "xxxx"
    assert final.choices[0].finish_reason == "stop" and "content.done" in events


def test_the_finish_chunk_keeps_late_content_and_tool_calls_in_a_delta_of_their_own():
    stream = openai_replies.ChatStream("m", openai_compat.Opts(stream=True))
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    done = {
        "message": {"role": "assistant", "content": "held", "tool_calls": [call]},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 3,
        "eval_count": 2,
    }
    body = stream.chunk({"message": {"role": "assistant", "content": "a"}, "done": False}) + stream.chunk(done)
    chunks = [json.loads(x[len(b"data: ") :]) for x in body.split(b"\n\n") if x]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": "a"}
    assert deltas[1]["content"] == "held" and deltas[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "role" not in deltas[1] and deltas[2] == {}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "tool_calls"]


def test_every_reply_has_an_x_request_id(daemon):
    srv, _ = daemon
    mine = httpx.get(srv.url + "/api/tags", headers={"X-Request-ID": "client-abc-123"})
    assert mine.headers["x-request-id"] == "client-abc-123"
    fresh = [
        httpx.get(srv.url + "/api/tags"),
        httpx.post(srv.url + "/api/show", json={"model": "nope"}),
        httpx.get(srv.url + "/api/tags", headers={"Host": "evil.example.com"}),
        httpx.get(srv.url + "/v1/models", headers={"x-request-id": "bad id with spaces"}),
    ]
    assert [r.status_code for r in fresh] == [200, 404, 403, 200]
    ids = [r.headers["x-request-id"] for r in fresh]
    assert all(i.startswith("req_") for i in ids) and len(set(ids)) == len(ids)


def test_v1_refusals_of_the_guard_have_openais_error_shape(tmp_path):
    conf = dataclasses.replace(make_config(tmp_path), api_key="s3cret")
    service = Service(conf, load_model=lambda *a, **k: None)
    try:
        with BackgroundServer(service, conf) as srv:
            bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong")
            with pytest.raises(openai.AuthenticationError) as e:
                bad.models.list()
            assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
            assert set(e.value.body) >= {"message", "type", "code"} and "bearer token" in e.value.body["message"]
            refused = httpx.get(srv.url + "/api/tags").json()  # the native shape stays Ollama's
            assert (
                list(refused) == ["error"]
                and refused["error"].startswith("unauthorized: a valid bearer token is required")
                and "LOCALRT_API_KEY" in refused["error"]
            )
            ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret")
            assert ok.models.list().data is not None
    finally:
        service.close()


def test_show_reports_the_parameter_count(daemon, smollm2_path):
    srv, _ = daemon
    with gguf_io.open(smollm2_path) as f:
        assert "general.parameter_count" not in f.metadata
        want = sum(int(n) for n in (_elements(t.shape) for t in f.tensors.values()))
    c = ollama.Client(host=srv.url)
    c.pull(MODEL)  # show never creates a built-in model; pull does, offline
    info = c.show(MODEL).modelinfo
    assert info["general.parameter_count"] == want == 134_515_008  # SmolLM2-135M


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def test_num_gpu_without_a_gpu_runs_on_the_cpu_with_a_warning(daemon, caplog):
    srv, lab = daemon
    caplog.set_level(logging.WARNING, logger="localrt.service")
    c = ollama.Client(host=srv.url)
    r = c.generate(model=MODEL, prompt="hi [num-gpu]", options={"num_gpu": 20, "num_predict": 1})
    assert r.done and lab.loaded_from[-1][1]["num_gpu"] == 0
    assert any("num_gpu 20" in rec.getMessage() and "CPU" in rec.getMessage() for rec in caplog.records)
    (entry,) = [m for m in c.ps().models if m.model == MODEL]
    assert entry.size_vram == 0


def test_quantize_refuses_an_already_quantized_model_by_its_type(daemon):
    srv, _ = daemon
    with pytest.raises(ollama.ResponseError) as e:
        list(ollama.Client(host=srv.url).create(model="requant", from_=MODEL, quantize="q4_K_M", stream=True))
    assert e.value.status_code == 400 and "Q4_1" in e.value.error and "F16" in e.value.error
    assert "requant:latest" not in [m.model for m in ollama.Client(host=srv.url).list().models]


CHAT = "{{ range .Messages }}[{{ .Role }}] {{ .Content }}\n{{ end }}[assistant]"


def test_create_and_copy_over_a_loaded_name_take_effect_on_the_next_request(daemon, tmp_path):
    srv, lab = daemon
    c = ollama.Client(host=srv.url)
    c.create(model="swap", from_=MODEL, system="You are A.")
    c.chat(model="swap", messages=[{"role": "user", "content": "one [swap-1]"}], options={"num_predict": 1})
    assert "You are A." in lab.wait_run("[swap-1]").text
    loads = lab.loads
    # Same weights, new system and template: the loaded instance serves them without a reload.
    c.create(model="swap", from_=MODEL, system="You are B.", template=CHAT)
    c.chat(model="swap", messages=[{"role": "user", "content": "two [swap-2]"}], options={"num_predict": 1})
    text = lab.wait_run("[swap-2]").text
    assert "[system] You are B." in text and "You are A." not in text and lab.loads == loads
    # Other weights copied over the name: the old instance goes and the new weights are loaded.
    tiny = write_tiny(tmp_path / "tiny.gguf")
    list(create(srv.service.store, "tiny", f"FROM {tiny}\nTEMPLATE {json.dumps(CHAT)}\n"))
    c.copy("tiny", "swap")
    c.chat(model="swap", messages=[{"role": "user", "content": "three [swap-3]"}], options={"num_predict": 1})
    assert lab.loads == loads + 1
    assert lab.loaded_from[-1][0] == str(srv.service.store.model_record("tiny").model_path)
    assert "You are B." not in lab.wait_run("[swap-3]").text


def test_load_time_options_reach_the_loader(tmp_path):
    # num_parallel 0: the automatic slot count, whose memory estimate runs before the load too
    with fake_daemon(tmp_path, service_kw={"gpu_probe": lambda _main_gpu: NO_GPU}, num_parallel=0) as (srv, lab):
        c = ollama.Client(host=srv.url)
        r = c.generate(
            model=MODEL, prompt="hi [load-options]", options={"num_thread": 1, "use_mmap": False, "num_predict": 1}
        )
        assert r.done
        assert lab.loaded_from[-1][1]["num_thread"] == 1 and lab.loaded_from[-1][1]["use_mmap"] is False
