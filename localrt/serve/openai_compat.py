"""The OpenAI-compatible `/v1` layer: OpenAI requests become native requests, native events become OpenAI replies.

A translation at the edge, never a second engine path. Fields follow the native rule (api.types): unknown ones
are ignored and listed in the request's `ignored`, one we know but cannot do is a 400 naming it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np

from ..api.types import (
    TOP_LOGPROBS_MAX,
    ChatRequest,
    EmbedRequest,
    Fields,
    GenerateRequest,
    Message,
    cache_salt,
    check_tools,
    logprobs_fields,
    parse_message,
)
from ..errors import InvalidRequest

LOGIT_BIAS_MAX = 100  # OpenAI's range is -100..100 (the engine's sampler checks it again)


N_MAX = 8  # choices per request: each is a sequence of its own


@dataclass(frozen=True)
class Opts:
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices; choice i samples with the request's seed + i
    logprobs: bool = False  # the reply carries each choice's logprobs
    echo: tuple[str, ...] | None = None  # /v1/completions echo: per prompt, the text its choices' texts start with
    best_of: int = 1  # candidates generated (>= n); the n with the highest mean token logprob are the choices


def error_body(status: int, message: str, code: str | None = None) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 401: "authentication_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


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


def sampling_options(f: Fields, limits: tuple[str, ...] = ("max_completion_tokens", "max_tokens")) -> dict:
    """The sampling fields every endpoint shares, as native options; Ollama's `options` extra body wins.
    `limits`: the fields that bound the output's tokens, the first one given wins."""
    opts: dict[str, Any] = {}
    given = [v for v in (f.int(key, None, 1) for key in limits) if v is not None]
    if given:
        opts["num_predict"] = given[0]
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
    f.str("user")  # an end-user id for abuse tracking; it has no effect on output by definition
    extra = f.obj("options") or {}
    return {**opts, **extra}


def _logit_bias(f: Fields) -> dict[int, float] | None:
    """OpenAI's logit_bias: {"token id": bias in -100..100}; ids are checked against the vocabulary by the engine."""
    v = f.any("logit_bias")
    if v is None or v == {}:
        return None
    if not isinstance(v, dict):
        raise InvalidRequest("logit_bias must be an object mapping token ids to biases")
    out: dict[int, float] = {}
    for key, bias in v.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12):
            raise InvalidRequest(f"logit_bias: key {str(key)[:40]!r} is not a token id")
        if (
            isinstance(bias, bool)
            or not isinstance(bias, (int, float))
            or not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX
        ):
            raise InvalidRequest(f"logit_bias: the bias of token {key} must be a number between -100 and 100")
        out[int(key)] = out.get(int(key), 0.0) + float(bias)  # "7" and "007" name one token
    return out


def _extras(f: Fields, req: ChatRequest | GenerateRequest, opts: Opts, chat: bool) -> Opts:
    """n, logit_bias and logprobs onto the native request; the Opts the reply needs to know them."""
    n = f.int("n", 1, 1, N_MAX) or 1
    req.logit_bias = _logit_bias(f)
    req.cache_salt = cache_salt(f)
    if chat:
        req.logprobs, req.top_logprobs = logprobs_fields(f)
    else:
        top = f.int("logprobs", None, 0, TOP_LOGPROBS_MAX)  # legacy: how many alternatives; 0 = the token only
        req.logprobs, req.top_logprobs = top is not None, top or 0
    return Opts(opts.stream, opts.include_usage, n, req.logprobs)


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
    except (ValueError, RecursionError):
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
    native: dict[str, Any] = {"role": {"developer": "system", "function": "tool"}.get(role, role)}
    native["content"] = _content(f.any("content"), i)
    calls = [_tool_call(c) for c in f.list("tool_calls") or []]
    legacy_call = f.obj("function_call")  # the deprecated single call of an assistant turn
    if legacy_call is not None:
        calls.append(_tool_call({"function": legacy_call}))
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


def _legacy_functions(f: Fields) -> tuple[list | None, Any]:
    """The deprecated `functions` / `function_call` as `tools` / `tool_choice` (vLLM's translation): each function
    becomes a function tool, "none" / "auto" stay, {"name": X} forces X. None where neither is given."""
    functions, call = f.list("functions"), f.any("function_call")
    if functions is None and call is None:
        return None, None
    for i, fn in enumerate(functions or []):  # named as the client sent them, not as the tools they become
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"functions[{i}].name is required")
    tools = [{"type": "function", "function": fn} for fn in functions or []]
    if isinstance(call, dict):
        if not isinstance(call.get("name"), str) or not call["name"]:
            raise InvalidRequest("function_call.name is required")
        call = {"type": "function", "function": {"name": call["name"]}}
    elif call not in (None, "none", "auto"):
        raise InvalidRequest('function_call must be "none", "auto" or {"name": ...}')
    return tools, call


def allowed_tools(choice: dict, tools: list, flat: bool = False) -> tuple[list, str | None]:
    """tool_choice {"type": "allowed_tools"}: the model sees only the listed tools (by name), and must call one of
    them with mode "required". Chat's shape nests {"mode", "tools": [{"function": {"name"}}]} under "allowed_tools";
    the Responses API's (`flat`) has "mode" and "tools": [{"name"}] beside "type"."""
    spec = choice if flat else choice.get("allowed_tools")
    if not isinstance(spec, dict) or not isinstance(spec.get("tools"), list) or not spec["tools"]:
        raise InvalidRequest("tool_choice.allowed_tools needs a non-empty tools array")
    mode = spec.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise InvalidRequest(f"tool_choice: allowed_tools mode must be 'auto' or 'required', got {mode!r}")
    names = set()
    for t in spec["tools"]:
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest("tool_choice: each allowed tool needs a function name")
        names.add(name)
    kept = [t for t in tools if (t.get("function") or {}).get("name") in names]
    missing = names - {(t.get("function") or {}).get("name") for t in kept}
    if missing:
        raise InvalidRequest(f"tool_choice: allowed tool {sorted(missing)[0]!r} is not among the tools")
    return kept, "" if mode == "required" else None


def _tools(f: Fields) -> tuple[list, str | None]:
    """(tools, forced): forced is "" for tool_choice "required", a function's name for a named choice, else None."""
    tools = f.list("tools")
    choice = f.any("tool_choice")
    legacy_tools, legacy_choice = _legacy_functions(f)
    if legacy_tools is not None or legacy_choice is not None:
        if tools is not None or choice is not None:
            raise InvalidRequest("functions / function_call cannot be combined with tools / tool_choice")
        tools, choice = legacy_tools, legacy_choice
    tools = check_tools(tools or [])
    forced = None
    if choice == "none":
        tools = []
    elif choice == "required":
        forced = ""
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
        if not isinstance(forced, str) or not forced:
            raise InvalidRequest("tool_choice.function.name must be a non-empty string")
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        tools, forced = allowed_tools(choice, tools)
    elif choice not in (None, "auto"):
        raise InvalidRequest(
            'tool_choice must be "none", "auto", "required", {"type": "function", "function": '
            '{"name": ...}} or {"type": "allowed_tools", ...}'
        )
    check_forced(forced, tools)
    f.bool("parallel_tool_calls")  # several calls per reply are allowed either way; we never merge them
    return tools, forced


def check_forced(forced: str | None, tools: list) -> None:
    """A tool_choice that forces a call needs tools, and a named one must be among them."""
    if forced is None:
        return
    names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
    if not names:
        raise InvalidRequest("tool_choice asks for a tool call but no tools were given")
    if forced and forced not in names:
        raise InvalidRequest(f"tool_choice names {forced!r}, which is not among the tools")


# reasoning_effort -> Ollama's think, as Ollama's middleware maps it ("none" switches thinking off); OpenAI's
# "minimal" and "xhigh" go to the nearest level a template knows.
_EFFORTS = {"none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def reasoning(f: Fields, req) -> None:
    """reasoning_effort (chat) or reasoning.effort (both APIs) onto the request's `think`; a model that cannot think
    refuses any effort but "none" (a 400 naming the field, from the service)."""
    effort, name = f.any("reasoning_effort"), "reasoning_effort"
    nested = f.any("reasoning")
    if isinstance(nested, dict):
        if nested.get("effort") is not None:
            effort, name = nested["effort"], "reasoning.effort"
    elif nested is not None:
        raise InvalidRequest("reasoning must be an object")
    if effort is None:
        return
    if not isinstance(effort, str) or effort not in _EFFORTS:
        raise InvalidRequest(f"{name} must be one of {', '.join(_EFFORTS)}, got {str(effort)[:40]!r}")
    req.think, req.think_field = _EFFORTS[effort], f"{name} {effort!r}"


# OpenAI fields that change what the reply is, and that we cannot do; any value but the neutral one is a 400.
_REFUSED = {"modalities": (None, [], ["text"]), "audio": (None,), "web_search_options": (None, {})}


def chat_request(body: dict) -> tuple[ChatRequest, Opts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    msgs = f.list("messages")
    if not msgs:
        raise InvalidRequest("[] is too short - 'messages'")
    opts = _stream_opts(f)
    options = sampling_options(f)
    tools, forced = _tools(f)
    fmt = _response_format(f.any("response_format"))
    if forced is not None and fmt is not None:
        raise InvalidRequest("tool_choice that forces a call cannot be combined with response_format")
    for key, neutral in _REFUSED.items():
        if f.any(key) not in neutral:
            raise InvalidRequest(f"{key} is not supported")
    req = ChatRequest(
        model=model,
        messages=[_message(m, i, f) for i, m in enumerate(msgs)],
        tools=tools,
        tool_choice=forced,
        stream=True,
        format=fmt,
        keep_alive=f.any("keep_alive"),
        options=options,
    )
    reasoning(f, req)
    opts = _extras(f, req, opts, chat=True)
    # Unread (store, metadata, service_tier, prompt_cache_key, safety_identifier, verbosity, prediction, ...):
    # none changes what a local model answers, so they are ignored, as Ollama does, and logged by name.
    req.ignored = f.finish()
    return req, opts


def _prompts(raw: Any) -> list[str | list[int]]:
    """/v1/completions' prompt: a string, an array of strings, token ids, or an array of arrays of token ids."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        return list(raw)
    if isinstance(raw, list) and raw and all(_is_id(t) for t in raw):
        return [list(raw)]
    if isinstance(raw, list) and raw and all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in raw):
        return [list(p) for p in raw]
    raise InvalidRequest(
        "prompt must be a string, an array of strings, an array of token ids or an array of "
        "non-empty arrays of token ids"
    )


def completion_request(body: dict) -> tuple[list[GenerateRequest], Opts]:
    """One native request per prompt; choice i of the reply is prompt i // n's (i % n)th choice, as OpenAI numbers
    them."""
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    prompts = _prompts(f.any("prompt"))
    opts = _stream_opts(f)
    options = sampling_options(f)
    echo = bool(f.bool("echo", False))
    best_of = f.int("best_of", None, 1, N_MAX)
    req = GenerateRequest(
        model=model,
        suffix=f.str("suffix", "") or "",
        stream=True,  # OpenAI never cuts a prompt
        keep_alive=f.any("keep_alive"),
        options=options,
        truncate=False,
    )
    opts = _extras(f, req, opts, chat=False)
    if echo and req.logprobs:
        raise InvalidRequest("echo with logprobs is not supported: the prompt tokens' logprobs are not computed")
    if (echo or req.suffix) and any(not isinstance(p, str) for p in prompts):
        raise InvalidRequest(f"{'echo' if echo else 'suffix'} is not supported with a prompt of token ids")
    if best_of is not None and best_of < opts.n:
        raise InvalidRequest(f"best_of must be at least n ({opts.n}), got {best_of}")
    if best_of is not None and best_of > 1 and opts.stream:
        raise InvalidRequest("best_of greater than 1 cannot be streamed")
    if best_of is not None and best_of > opts.n:
        if len(prompts) > 1:
            raise InvalidRequest("best_of greater than n is supported with one prompt only")
        req.logprobs = True  # the candidates are ranked by their tokens' logprobs; the reply shows them only if asked
    if len(prompts) * max(best_of or 1, opts.n) > N_MAX:
        raise InvalidRequest(f"prompts times choices must be at most {N_MAX}")
    texts = tuple(p if isinstance(p, str) else "" for p in prompts)
    opts = replace(opts, echo=texts if echo else None, best_of=max(best_of or 1, opts.n))
    req.ignored = f.finish()
    reqs = [replace(req, prompt=p) if isinstance(p, str) else replace(req, raw=True, prompt_tokens=p) for p in prompts]
    return reqs, opts


def embeddings_request(body: dict) -> tuple[EmbedRequest, str]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    raw = f.any("input")
    if isinstance(raw, str):
        inputs: list = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        inputs = list(raw)
    elif isinstance(raw, list) and raw and all(_is_id(x) for x in raw):
        inputs = [list(raw)]  # one input given as token ids
    elif isinstance(raw, list) and raw and all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in raw):
        inputs = [list(x) for x in raw]  # several, each as token ids (checked against the vocabulary on the model)
    else:
        raise InvalidRequest(
            "invalid input: a string, an array of strings, an array of token ids or an array of "
            "non-empty arrays of token ids is required"
        )
    empty = [i for i, x in enumerate(inputs) if x == ""]
    if empty:  # as OpenAI: an empty string has nothing to embed
        raise InvalidRequest(
            f"invalid input: input[{empty[0]}] is an empty string"
            if isinstance(raw, list)
            else "invalid input: the input is an empty string"
        )
    encoding = f.str("encoding_format", "float") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
    dims = f.int("dimensions", None, 1, 1 << 20)
    f.str("user")
    # OpenAI refuses an input longer than the context (a 400 with context_length_exceeded); it never truncates
    req = EmbedRequest(
        model=model,
        inputs=inputs,
        dimensions=dims,
        keep_alive=f.any("keep_alive"),
        options=f.obj("options") or {},
        truncate=False,
    )
    req.ignored = f.finish()
    return req, encoding


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 31


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
