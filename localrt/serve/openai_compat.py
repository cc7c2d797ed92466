"""The OpenAI-compatible `/v1` layer: OpenAI requests become native requests, native events become OpenAI replies.

A translation at the edge, never a second engine path. A field we do not implement is a 400 naming it.
"""
from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from ..api.types import (
    ChatRequest,
    EmbedRequest,
    Fields,
    GenerateRequest,
    Message,
    parse_message,
)
from ..errors import InvalidRequest


@dataclass(frozen=True)
class Opts:
    stream: bool = False
    include_usage: bool = False


def error_body(status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 401: "authentication_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_error(message: str) -> bytes:
    return sse(error_body(500, message)) + b"data: [DONE]\n\n"


def _stream_opts(f: Fields) -> Opts:
    stream = bool(f.bool("stream", False))
    so = f.obj("stream_options") or {}
    sf = Fields(so, "stream_options")
    include = bool(sf.bool("include_usage", False))
    sf.finish()
    return Opts(stream, include)


def _sampling_options(f: Fields) -> dict:
    """The sampling fields both endpoints share, as native options; Ollama's `options` extra body wins."""
    opts: dict[str, Any] = {}
    max_tokens = f.int("max_tokens", None, 1)
    max_completion = f.int("max_completion_tokens", None, 1)
    if max_tokens is not None or max_completion is not None:
        opts["num_predict"] = max_completion if max_completion is not None else max_tokens
    for key in ("temperature", "top_p"):
        v = f.any(key)
        opts[key] = 1.0 if v is None else v  # OpenAI's defaults, not Ollama's
    for key in ("seed", "frequency_penalty", "presence_penalty"):
        v = f.any(key)
        if v is not None:
            opts[key] = v
    stop = f.any("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequest("stop must be a string or an array of strings")
        opts["stop"] = stop
    if f.int("n", 1, 1, 1) != 1:
        raise InvalidRequest("n must be 1")
    if f.any("logit_bias"):
        raise InvalidRequest("logit_bias is not supported")
    if f.any("logprobs") not in (None, False, 0):
        raise InvalidRequest("logprobs is not supported yet")
    if f.any("top_logprobs") not in (None, 0):
        raise InvalidRequest("top_logprobs is not supported yet")
    f.str("user")  # an end-user id for abuse tracking; it has no effect on output by definition
    extra = f.obj("options") or {}
    return {**opts, **extra}


def _content(value: Any, i: int) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        parts = []
        for p in value:
            if not isinstance(p, dict) or p.get("type") not in ("text", "input_text"):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise InvalidRequest(f"messages[{i}].content: part type {kind!r} is not supported (text only)")
            parts.append(str(p.get("text", "")))
        return "\n".join(parts)
    raise InvalidRequest(f"messages[{i}].content must be a string or an array of parts")


def _message(m: Any, i: int) -> Message:
    if not isinstance(m, dict):
        raise InvalidRequest(f"messages[{i}] must be an object")
    native: dict[str, Any] = {"role": "system" if m.get("role") == "developer" else m.get("role")}
    native["content"] = _content(m.get("content"), i)
    calls = []
    for c in m.get("tool_calls") or []:
        fn = (c or {}).get("function") or {}
        args = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            raise InvalidRequest("invalid tool call arguments") from None
        calls.append({"id": c.get("id"), "function": {"name": fn.get("name"), "arguments": parsed}})
    if calls:
        native["tool_calls"] = calls
    if m.get("tool_call_id"):
        native["tool_call_id"] = m["tool_call_id"]
    if m.get("name") and native["role"] == "tool":
        native["tool_name"] = m["name"]
    unknown = set(m) - {"role", "content", "tool_calls", "tool_call_id", "name", "refusal"}
    if unknown:
        raise InvalidRequest(f"messages[{i}]: unsupported field(s): {', '.join(sorted(unknown))}")
    return parse_message(native, i)


def _response_format(v: Any) -> str | dict | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise InvalidRequest("response_format must be an object")
    kind = v.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = (v.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format.json_schema.schema must be an object")
        return schema
    raise InvalidRequest(f"response_format.type {kind!r} is not supported")


def chat_request(body: dict) -> tuple[ChatRequest, Opts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    msgs = f.list("messages")
    if not msgs:
        raise InvalidRequest("[] is too short - 'messages'")
    opts = _stream_opts(f)
    options = _sampling_options(f)
    tools = f.list("tools") or []
    choice = f.any("tool_choice")
    if choice == "none":
        tools = []
    elif choice not in (None, "auto"):
        raise InvalidRequest("tool_choice: only 'auto' and 'none' are supported")
    f.bool("parallel_tool_calls")  # several calls per reply are allowed either way; we never merge them
    fmt = _response_format(f.any("response_format"))
    if f.any("reasoning_effort") not in (None, "none") or f.any("reasoning") is not None:
        raise InvalidRequest("reasoning is not supported: no thinking-capable model support yet")
    req = ChatRequest(model=model, messages=[_message(m, i) for i, m in enumerate(msgs)], tools=tools,
                      stream=True, format=fmt, keep_alive=f.any("keep_alive"), options=options)
    for key in ("store", "metadata", "service_tier", "modalities", "audio", "prediction", "web_search_options"):
        if f.any(key) not in (None, False, {}, []):
            raise InvalidRequest(f"{key} is not supported")
    f.finish()
    return req, opts


def completion_request(body: dict) -> tuple[GenerateRequest, Opts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    prompt = f.any("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string")
    opts = _stream_opts(f)
    options = _sampling_options(f)
    if f.bool("echo"):
        raise InvalidRequest("echo is not supported")
    if f.int("best_of", 1, 1, 1) != 1:
        raise InvalidRequest("best_of must be 1")
    req = GenerateRequest(model=model, prompt=prompt, suffix=f.str("suffix", "") or "", stream=True,
                          keep_alive=f.any("keep_alive"), options=options)
    f.finish()
    return req, opts


def _usage(done: dict | None) -> dict:
    p = int((done or {}).get("prompt_eval_count", 0))
    c = int((done or {}).get("eval_count", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish_reason(done: dict, had_tools: bool) -> str:
    if had_tools:
        return "tool_calls"
    return "length" if done.get("done_reason") == "length" else "stop"


def _tool_calls(calls: list[dict], start: int) -> list[dict]:
    out = []
    for k, c in enumerate(calls):
        fn = c.get("function", {})
        out.append({"id": c.get("id") or "call_" + secrets.token_hex(4), "index": start + k, "type": "function",
                    "function": {"name": fn.get("name"), "arguments": json.dumps(fn.get("arguments", {}))}})
    return out


def _tail(base: dict, opts: Opts, done: dict | None) -> bytes:
    """The end of an SSE stream: the usage chunk when asked for (`choices: []`), then [DONE]."""
    extra = sse({**base, "choices": [], "usage": _usage(done)}) if opts.include_usage else b""
    return extra + b"data: [DONE]\n\n"


class ChatStream:
    """Native /api/chat events -> chat.completion(.chunk) objects."""

    def __init__(self, model: str, opts: Opts):
        self.model, self.opts = model, opts
        self.id = "chatcmpl-" + secrets.token_hex(6)
        self.n_tools = 0
        self.done: dict | None = None

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": int(time.time()), "model": self.model,
                "system_fingerprint": "fp_localrt"}

    def chunk(self, item: dict) -> bytes:
        msg = item.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content", "")}
        if msg.get("tool_calls"):
            delta["tool_calls"] = _tool_calls(msg["tool_calls"], self.n_tools)
            self.n_tools += len(msg["tool_calls"])
        finish = None
        if item.get("done"):
            self.done = item
            finish = _finish_reason(item, self.n_tools > 0)
        out = self._base("chat.completion.chunk")
        out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return sse(out)

    def tail(self) -> bytes:
        return _tail(self._base("chat.completion.chunk"), self.opts, self.done)

    def whole(self, items: list[dict]) -> dict:
        done = items[-1] if items else {}
        content = "".join((i.get("message") or {}).get("content", "") for i in items)
        calls = [c for i in items for c in (i.get("message") or {}).get("tool_calls", [])]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = _tool_calls(calls, 0)
        out = self._base("chat.completion")
        out["choices"] = [{"index": 0, "message": message, "finish_reason": _finish_reason(done, bool(calls))}]
        out["usage"] = _usage(done)
        return out


class CompletionStream:
    """Native /api/generate events -> text_completion objects."""

    def __init__(self, model: str, opts: Opts):
        self.model, self.opts = model, opts
        self.id = "cmpl-" + secrets.token_hex(6)
        self.done: dict | None = None

    def _base(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": int(time.time()), "model": self.model,
                "system_fingerprint": "fp_localrt"}

    def chunk(self, item: dict) -> bytes:
        finish = None
        if item.get("done"):
            self.done = item
            finish = _finish_reason(item, False)
        out = self._base()
        out["choices"] = [{"text": item.get("response", ""), "index": 0, "finish_reason": finish}]
        return sse(out)

    def tail(self) -> bytes:
        return _tail(self._base(), self.opts, self.done)

    def whole(self, items: list[dict]) -> dict:
        done = items[-1] if items else {}
        out = self._base()
        out["choices"] = [{"text": "".join(i.get("response", "") for i in items), "index": 0,
                           "finish_reason": _finish_reason(done, False)}]
        out["usage"] = _usage(done)
        return out


def embeddings_request(body: dict) -> tuple[EmbedRequest, str]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    raw = f.any("input")
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        inputs = list(raw)
    else:
        raise InvalidRequest("invalid input: a string or a non-empty array of strings is required")
    encoding = f.str("encoding_format", "float") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
    dims = f.int("dimensions", None, 1, 1 << 20)
    f.str("user")
    req = EmbedRequest(model=model, inputs=inputs, dimensions=dims, keep_alive=f.any("keep_alive"),
                       options=f.obj("options") or {})
    f.finish()
    return req, encoding


def embeddings_reply(model: str, native: dict, encoding: str) -> dict:
    data = []
    for i, vec in enumerate(native.get("embeddings", [])):
        emb: Any = vec
        if encoding == "base64":
            emb = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "embedding": emb, "index": i})
    n = int(native.get("prompt_eval_count", 0))
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}


def _model_obj(entry: dict) -> dict:
    name = entry["name"]
    created = int(datetime.fromisoformat(entry["modified_at"]).timestamp()) if entry.get("modified_at") else 0
    owner = name.split("/")[-2] if name.count("/") >= 1 else "library"
    return {"id": name, "object": "model", "created": created, "owned_by": owner}


def models_reply(tags: dict) -> dict:
    return {"object": "list", "data": [_model_obj(m) for m in tags.get("models", [])]}


def model_reply(tags: dict, name: str) -> dict | None:
    want = name if ":" in name else name + ":latest"
    for m in tags.get("models", []):
        if m["name"] == want:
            obj = _model_obj(m)
            obj["id"] = name
            return obj
    return None
