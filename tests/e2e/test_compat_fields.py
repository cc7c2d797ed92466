"""Ollama's rule for request keys, through a real daemon (scripted model): a key we do not know is ignored and
named in one warning line per request; a key we know is checked (a bad value is a 400 naming it), and one we
know but cannot do is refused by name. The fields that carry meaning are mapped (/v1 top_k, min_p,
repetition_penalty; replayed reasoning)."""

from __future__ import annotations

import logging

import httpx
import ollama
import pytest

from _daemon_fakes import MODEL, fake_daemon
from localrt.api.options import resolve
from localrt.api.types import ChatRequest, GenerateRequest, ignored_keys
from localrt.errors import InvalidRequest


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with fake_daemon(tmp_path_factory.mktemp("models")) as (srv, lab):
        yield srv, lab


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "localrt.server" and r.levelno == logging.WARNING]


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=30)


def test_parsing_lists_every_ignored_key_once_with_where_it_was():
    req = ChatRequest.from_json(
        {
            "model": "m",
            "bogus": 1,
            "messages": [
                {"role": "user", "content": "a", "name": "ann"},
                {"role": "user", "content": "b", "name": "bob", "x": 2},
            ],
            "options": {"temperature": 0.1, "draft_p_min": 4, "keep_alive": "5m", "numa": False},
        }
    )
    keys = ignored_keys(req)
    assert sorted(keys) == [
        "bogus",
        "messages[].name",
        "messages[].x",
        "options.draft_p_min",
        "options.keep_alive",
        "options.numa",
    ]
    assert keys[-3:] == ["options.draft_p_min", "options.keep_alive", "options.numa"]  # in their order
    assert GenerateRequest.from_json({"model": "m", "prompt": "p"}).ignored == []


def test_resolve_ignores_unknown_options_only_when_asked():
    opts = resolve({"draft_p_min": 4, "top_k": 3}, ignore_unknown=True)
    assert opts.top_k == 3 and opts.ignored == ("draft_p_min",)
    with pytest.raises(InvalidRequest, match="unknown option 'draft_p_min'"):
        resolve({"draft_p_min": 4})  # one parameter set by name (the REPL's /set) is still refused


def test_unknown_fields_and_options_are_ignored_with_one_warning(daemon, caplog):
    srv, _ = daemon
    caplog.set_level(logging.WARNING, logger="localrt.server")
    body = {
        "model": MODEL,
        "stream": False,
        "some_future_field": {"a": 1},
        "messages": [{"role": "user", "content": "hi [fields-1]", "name": "ann"}],
        "options": {"num_predict": 3, "draft_p_min": 4, "keep_alive": 0, "functions_unsupported_model": []},
    }
    r = _post(srv, "/api/chat", body)
    assert r.status_code == 200, r.text
    reply = ollama.ChatResponse.model_validate(r.json())
    assert reply.done and reply.message.content == "xxx"
    lines = [w for w in _warnings(caplog) if "/api/chat" in w]
    assert len(lines) == 1, lines
    for key in (
        "some_future_field",
        "messages[].name",
        "options.draft_p_min",
        "options.keep_alive",
        "options.functions_unsupported_model",
    ):
        assert key in lines[0]
    assert r.headers["x-request-id"] in lines[0]
    # keep_alive inside options is not the request's keep_alive (Ollama: "invalid option provided"), so the
    # model is not unloaded after this request.
    assert any(m["name"] == MODEL for m in httpx.get(srv.url + "/api/ps").json()["models"])


def test_a_request_that_ignores_nothing_logs_nothing(daemon, caplog):
    srv, _ = daemon
    caplog.set_level(logging.WARNING, logger="localrt.server")
    r = _post(srv, "/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 1}})
    assert r.status_code == 200 and _warnings(caplog) == []


@pytest.mark.parametrize(
    "path, body, word",
    [
        ("/api/chat", {"format": 5}, "format"),
        ("/api/chat", {"keep_alive": True}, "keep_alive"),
        ("/api/chat", {"options": {"temperature": "hot"}}, "temperature"),
        ("/api/chat", {"options": {"num_ctx": 2.5}}, "num_ctx"),
        ("/api/chat", {"think": True}, "think"),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "images"),
        ("/api/chat", {"messages": [{"role": "assistant", "content": "a", "thinking": 5}]}, "thinking"),
        ("/api/chat", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ("/api/generate", {"prompt": "p", "top_logprobs": 2}, "top_logprobs"),
        ("/api/generate", {"prompt": "p", "shift": True}, "shift"),
        ("/v1/chat/completions", {"top_k": -1}, "top_k"),
        ("/v1/chat/completions", {"min_p": 2}, "min_p"),
        ("/v1/chat/completions", {"repetition_penalty": 0}, "repeat_penalty"),
        ("/v1/chat/completions", {"reasoning_effort": "high"}, "reasoning_effort"),
        ("/v1/chat/completions", {"function_call": "maybe"}, "function_call"),
        ("/v1/chat/completions", {"functions": [{"description": "no name"}]}, "functions[0].name is required"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}], "function_call": {}}, "function_call.name is required"),
        (
            "/v1/chat/completions",
            {"functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
            "functions",
        ),
        ("/v1/chat/completions", {"tool_choice": "required", "tools": []}, "tool_choice"),
        ("/v1/chat/completions", {"logit_bias": {"x": 5}}, "logit_bias"),
        ("/v1/chat/completions", {"n": 9}, "n must be"),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
        ("/v1/chat/completions", {"messages": [{"role": "assistant", "tool_calls": ["x"]}]}, "tool_calls"),
        ("/v1/completions", {"echo": True, "logprobs": 1}, "echo with logprobs"),
        ("/v1/completions", {"n": 3, "best_of": 2}, "best_of must be at least n"),
        ("/v1/completions", {"best_of": 2, "stream": True}, "best_of"),
        ("/v1/completions", {"best_of": 9}, "best_of must be"),
    ],
)
def test_known_fields_with_bad_or_unsupported_values_are_400_naming_them(daemon, path, body, word):
    srv, _ = daemon
    if path.startswith("/api/"):
        full = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
        if path == "/api/generate":
            full.pop("messages")
    else:
        full = {
            "model": MODEL,
            **({"prompt": "p"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}),
            **body,
        }
    r = _post(srv, path, full)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert word in (err["message"] if isinstance(err, dict) else err)


def test_v1_sampling_fields_reach_the_sampler(daemon):
    srv, lab = daemon
    r = _post(
        srv,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi [v1-sampling]"}],
            "max_tokens": 2,
            "top_k": 7,
            "min_p": 0.05,
            "repetition_penalty": 1.3,
        },
    )
    assert r.status_code == 200, r.text
    opts = lab.wait_run("[v1-sampling]").options
    assert (opts["top_k"], opts["min_p"], opts["repeat_penalty"], opts["num_predict"]) == (7, 0.05, 1.3, 2)


def test_v1_metadata_fields_are_ignored_by_name(daemon, caplog):
    srv, _ = daemon
    caplog.set_level(logging.WARNING, logger="localrt.server")
    extras = {
        "service_tier": "auto",
        "metadata": {"k": "v"},
        "store": True,
        "prompt_cache_key": "abc",
        "safety_identifier": "u1",
        "verbosity": "low",
        "prediction": {"type": "content", "content": "x"},
    }
    r = _post(
        srv,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi", "name": "ann"}],
            "max_tokens": 1,
            "functions": None,
            "function_call": None,
            "reasoning_effort": "none",
            "user": "u1",
            "stream_options": None,
            **extras,
        },
    )
    assert r.status_code == 200, r.text
    (line,) = [w for w in _warnings(caplog) if "/v1/chat/completions" in w]
    for key in [*extras, "messages[].name"]:
        assert key in line
    for known in ("functions", "reasoning_effort", "user,", "max_tokens"):
        assert known not in line


def test_replayed_reasoning_is_accepted_on_both_apis(daemon):
    srv, _ = daemon
    history = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "2+2 is 4"},
        {"role": "user", "content": "and 3+3?"},
    ]
    r = _post(srv, "/api/chat", {"model": MODEL, "messages": history, "stream": False, "options": {"num_predict": 1}})
    assert r.status_code == 200, r.text
    for key in ("reasoning_content", "reasoning"):
        v1 = [history[0], {"role": "assistant", "content": "4", key: "2+2 is 4"}, history[2]]
        r = _post(srv, "/v1/chat/completions", {"model": MODEL, "messages": v1, "max_tokens": 1})
        assert r.status_code == 200, r.text


def test_unknown_create_fields_are_ignored_with_a_warning(daemon, caplog):
    """Clients send create fields we do not know (newer Ollama versions add them): ignored and named once."""
    srv, _ = daemon
    with caplog.at_level(logging.WARNING, logger="localrt.catalog"):
        r = _post(
            srv,
            "/api/create",
            {"model": "extra-fields", "from": MODEL, "stream": False, "renderer": "x", "parser": "y"},
        )
    assert r.status_code == 200, r.text
    warned = [rec.getMessage() for rec in caplog.records if rec.name == "localrt.catalog"]
    assert len(warned) == 1 and "parser, renderer" in warned[0]


@pytest.mark.parametrize(
    "tool, what",
    [
        ({"type": "function", "function": {"parameters": {"type": "object"}}}, "tools[0].function.name"),
        ({"type": "function", "function": {"name": ""}}, "tools[0].function.name"),
        ({"type": "function", "function": {"name": "f", "parameters": "x"}}, "tools[0].function.parameters"),
    ],
)
def test_a_tool_without_a_name_is_a_400_naming_it(daemon, tool, what):
    srv, _ = daemon
    msgs = [{"role": "user", "content": "hi"}]
    for path, body in (
        ("/api/chat", {"model": MODEL, "stream": False, "messages": msgs, "tools": [tool]}),
        ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": [tool]}),
    ):
        r = _post(srv, path, body)
        assert r.status_code == 400 and what in r.text, (path, r.status_code, r.text)


def test_tool_call_arguments_nested_past_the_parser_are_a_400(daemon):
    srv, _ = daemon
    deep = "[" * 100000 + "]" * 100000
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}],
        },
    ]
    r = _post(srv, "/v1/chat/completions", {"model": MODEL, "messages": msgs})
    assert r.status_code == 400 and "arguments" in r.text, r.text
