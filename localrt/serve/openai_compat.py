"""The OpenAI-compatible `/v1` layer: OpenAI requests become native requests, native events become OpenAI replies.

A translation at the edge, never a second engine path. Fields follow the native rule (api.types): unknown ones
are ignored and listed in the request's `ignored`, one we know but cannot do is a 400 naming it.
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
    PROMPT_CACHED_KEY,
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
    sf = f.nested(f.obj("stream_options") or {}, "stream_options.")
    include = bool(sf.bool("include_usage", False))
    sf.finish()
    return Opts(stream, include)


# OpenAI-style sampling fields other servers (vLLM, llama.cpp's server, litellm's `openai/`) accept, and the
# native option each one is. vLLM's repetition_penalty is the same multiplicative penalty as repeat_penalty.
_EXTRA_SAMPLING = {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"}


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
    for key, native in _EXTRA_SAMPLING.items():
        v = f.any(key)
        if v is not None:
            opts[native] = v  # checked by name in api.options; a bad value is a 400 naming the option
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


def _tool_call(c: Any) -> dict:
    if not isinstance(c, dict):
        raise InvalidRequest("tool_calls entries must be objects")
    fn = c.get("function") or {}
    args = fn.get("arguments") or "{}"
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        raise InvalidRequest("invalid tool call arguments") from None
    return {"id": c.get("id"), "function": {"name": fn.get("name"), "arguments": parsed}}


# Where replayed histories carry an assistant turn's reasoning: Ollama's /v1 `reasoning`, the
# `reasoning_content` of DeepSeek/vLLM/litellm, and the native name.
_REASONING_KEYS = ("reasoning", "reasoning_content", "thinking")


def _message(m: Any, i: int, parent: Fields) -> Message:
    if not isinstance(m, dict):
        raise InvalidRequest(f"messages[{i}] must be an object")
    f = parent.nested(m, "messages[].")
    role = f.any("role")
    native: dict[str, Any] = {"role": "system" if role == "developer" else role}
    native["content"] = _content(f.any("content"), i)
    calls = [_tool_call(c) for c in f.list("tool_calls") or []]
    if calls:
        native["tool_calls"] = calls
    call_id = f.str("tool_call_id")
    if call_id:
        native["tool_call_id"] = call_id
    reasoning = next((v for v in (f.any(k) for k in _REASONING_KEYS) if isinstance(v, str) and v), "")
    if reasoning:
        native["thinking"] = reasoning
    f.any("refusal")  # an assistant turn's refusal text: it was shown as the answer; nothing to render
    name = m.get("name")
    if name and native["role"] == "tool":
        native["tool_name"] = f.str("name")  # a participant's name on other roles has no slot in a template
    f.finish()
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


def _tools(f: Fields) -> tuple[list, str | None]:
    """(tools, forced): forced is "" for tool_choice "required", a function's name for a named choice, else None."""
    tools = f.list("tools") or []
    choice = f.any("tool_choice")
    forced = None
    if choice == "none":
        tools = []
    elif choice == "required":
        forced = ""
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
        if not isinstance(forced, str) or not forced:
            raise InvalidRequest("tool_choice.function.name must be a non-empty string")
    elif choice not in (None, "auto"):
        raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                             '{"name": ...}}')
    if forced is not None:
        names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
        if not names:
            raise InvalidRequest("tool_choice asks for a tool call but no tools were given")
        if forced and forced not in names:
            raise InvalidRequest(f"tool_choice names {forced!r}, which is not among the tools")
    f.bool("parallel_tool_calls")  # several calls per reply are allowed either way; we never merge them
    if f.any("functions") or f.any("function_call") not in (None, "none", "auto"):
        raise InvalidRequest("functions and function_call (the deprecated function-calling fields) are not "
                             "supported; send tools instead")
    return tools, forced


def _reasoning(f: Fields, model: str) -> None:
    """Ollama maps reasoning_effort to `think`; no model here thinks, so only "none" (or nothing) is served."""
    effort = f.any("reasoning_effort")
    nested = f.any("reasoning")
    if isinstance(nested, dict):
        effort = nested.get("effort", effort)
    elif nested is not None:
        raise InvalidRequest("reasoning must be an object")
    if effort not in (None, "none"):
        raise InvalidRequest(f"reasoning_effort {effort!r}: {model} does not support thinking")


# OpenAI fields that change what the reply is, and that we cannot do; any value but the neutral one is a 400.
_REFUSED = {"modalities": (None, [], ["text"]), "audio": (None,), "web_search_options": (None, {})}


def chat_request(body: dict) -> tuple[ChatRequest, Opts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    msgs = f.list("messages")
    if not msgs:
        raise InvalidRequest("[] is too short - 'messages'")
    opts = _stream_opts(f)
    options = _sampling_options(f)
    tools, forced = _tools(f)
    fmt = _response_format(f.any("response_format"))
    if forced is not None and fmt is not None:
        raise InvalidRequest("tool_choice that forces a call cannot be combined with response_format")
    _reasoning(f, model)
    for key, neutral in _REFUSED.items():
        if f.any(key) not in neutral:
            raise InvalidRequest(f"{key} is not supported")
    req = ChatRequest(model=model, messages=[_message(m, i, f) for i, m in enumerate(msgs)], tools=tools,
                      tool_choice=forced, stream=True, format=fmt, keep_alive=f.any("keep_alive"), options=options)
    # Unread (store, metadata, service_tier, prompt_cache_key, safety_identifier, verbosity, prediction, ...):
    # none changes what a local model answers, so they are ignored, as Ollama does, and logged by name.
    req.ignored = f.finish()
    return req, opts


def completion_request(body: dict) -> tuple[GenerateRequest, Opts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    prompt = f.any("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the openai client's list form, with one prompt
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
    req.ignored = f.finish()
    return req, opts


def _usage(done: dict | None) -> dict:
    """OpenAI's usage: the whole prompt, and how much of it came from the prompt cache (Ollama has no field)."""
    p = int((done or {}).get("prompt_eval_count", 0))
    c = int((done or {}).get("eval_count", 0))
    cached = int((done or {}).get(PROMPT_CACHED_KEY, 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached}}


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
    """Native /api/chat events -> chat.completion(.chunk) objects.

    Streamed as OpenAI does: `role` only in the first delta, content and tool calls in deltas of their own,
    and a last chunk with an empty delta that carries finish_reason."""

    def __init__(self, model: str, opts: Opts):
        self.model, self.opts = model, opts
        self.id = "chatcmpl-" + secrets.token_hex(6)
        self.created = int(time.time())  # one value for the whole stream
        self.n_tools = 0
        self.sent_role = False
        self.done: dict | None = None

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_localrt"}

    def _chunk(self, delta: dict, finish: str | None) -> bytes:
        out = self._base("chat.completion.chunk")
        out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return sse(out)

    def chunk(self, item: dict) -> bytes:
        msg = item.get("message") or {}
        delta: dict[str, Any] = {}
        if not self.sent_role:
            delta["role"] = "assistant"
            self.sent_role = True
        if msg.get("content") or not item.get("done"):
            delta["content"] = msg.get("content", "")
        if msg.get("tool_calls"):
            delta["tool_calls"] = _tool_calls(msg["tool_calls"], self.n_tools)
            self.n_tools += len(msg["tool_calls"])
        if not item.get("done"):
            return self._chunk(delta, None)
        self.done = item
        head = self._chunk({"content": "", **delta}, None) if delta else b""
        return head + self._chunk({}, _finish_reason(item, self.n_tools > 0))

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
    req.ignored = f.finish()
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
