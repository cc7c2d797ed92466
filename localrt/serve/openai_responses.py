"""OpenAI's Responses API (`POST /v1/responses`) -> a native chat request: the subset Ollama serves, in front of the
same chat pipeline as /v1/chat/completions (templates, tool calls, constrained decoding), never a second path.

`input` is a string (one user turn) or a list of items: messages (`{"role", "content"}` with a string or
`input_text` / `output_text` / `refusal` parts; `developer` is a system turn), replayed `function_call` items (an
assistant turn's tool calls) and `function_call_output` items (tool turns), and `reasoning` items (an assistant
turn's thinking). `instructions` is a system turn before them. Nothing is stored: what needs a stored response or
conversation (`previous_response_id`, `conversation`, `background`, `prompt`, `item_reference`) is a 400 naming
it, as are non-function tools, images, files and audio. Unknown fields are ignored and named in one warning.
The reply side is openai_responses_reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..api.types import MAX_MESSAGES, TOP_LOGPROBS_MAX, ChatRequest, Fields, cache_salt, parse_message
from ..errors import InvalidRequest
from .openai_compat import allowed_tools, check_forced, reasoning, sampling_options

# `include` values OpenAI documents. Only logprobs adds anything here; the others ask for data of hosted tools,
# images or encrypted reasoning, none of which a reply from this runtime ever has, so there is nothing to add.
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_INCLUDE = frozenset(
    {
        LOGPROBS_INCLUDE,
        "reasoning.encrypted_content",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "message.input_image.image_url",
        "web_search_call.action.sources",
        "web_search_call.results",
    }
)
# Fields that need state this runtime does not keep (stored responses, conversations, prompt templates, a job
# queue) or a limit it cannot honour: any value but the neutral one is a 400 that names the field.
_REFUSED = {
    "previous_response_id": (None, ""),
    "conversation": (None, ""),
    "background": (None, False),
    "prompt": (None,),
}


@dataclass
class ResponsesOpts:
    """What the reply echoes of the request (OpenAI's response object repeats its settings) and how to send it."""

    stream: bool = False
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    tools: list[dict] = field(default_factory=list)  # as the request gave them (the Responses' flat shape)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text_format: dict = field(default_factory=lambda: {"type": "text"})
    truncation: str = "disabled"
    metadata: dict = field(default_factory=dict)
    logprobs: bool = False
    max_tool_calls: int | None = None  # function calls past this many are left out of the response (0: no tools)


def _texts(parts: list) -> str:
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _text(part: Any, where: str) -> str:
    """A content part's text: input_text (a user/system turn), output_text or refusal (a replayed assistant turn)."""
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where}: content parts must be objects")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
    elif kind == "refusal":
        text = part.get("refusal")
    elif kind in ("input_image", "input_file", "input_audio"):
        raise InvalidRequest(f"{where}: {kind} is not supported: no model here reads images, files or audio")
    else:
        raise InvalidRequest(f"{where}: content part type {kind!r} is not supported")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}: a {kind} part needs a string")
    return text


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(p, f"{where}[{k}]") for k, p in enumerate(value))  # joined as Ollama joins them
    if value is None:
        return ""
    raise InvalidRequest(f"{where} must be a string or an array of content parts")


class _Turns:
    """Input items -> native messages (dicts for api.types.parse_message), merging as a chat history has them."""

    def __init__(self, f: Fields) -> None:
        self.f = f
        self.msgs: list[dict] = []
        self.thinking = ""  # a reasoning item waits for the assistant turn that follows it
        self.call_names: dict[str, str] = {}  # call_id -> function name (the tool turn's tool_name)

    def _assistant(self) -> dict:
        last = self.msgs[-1] if self.msgs else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": ""}
            self.msgs.append(last)
        if self.thinking:
            last["thinking"], self.thinking = self.thinking, ""
        return last

    def add(self, item: Any, i: int) -> None:
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object")
        f = self.f.nested(item, "input[].")
        kind = f.str("type") or ("message" if "role" in item else None)
        f.str("id")  # an item id from an earlier reply: nothing refers to it here
        f.str("status")
        if kind == "message":
            self._message(f, where)
        elif kind == "function_call":
            self._call(f, where)
        elif kind == "function_call_output":
            call_id = f.str("call_id", required=True, msg=f"{where}.call_id is required")
            msg = {"role": "tool", "content": _content(f.any("output"), f"{where}.output"), "tool_call_id": call_id}
            if call_id in self.call_names:
                msg["tool_name"] = self.call_names[call_id]
            self.msgs.append(msg)
        elif kind == "reasoning":
            full, summary = _texts(f.list("content") or []), _texts(f.list("summary") or [])
            # the full text (as this server sends it), else the summary, else Ollama's way: the text in
            # encrypted_content
            self.thinking = full or summary or (f.str("encrypted_content") or "")
        elif kind is None:
            raise InvalidRequest(f"{where}: an input item needs a type (or a role)")
        else:
            raise InvalidRequest(
                f"{where}: input item type {kind!r} is not supported (message, function_call, "
                "function_call_output and reasoning are)"
            )
        f.finish()

    def _message(self, f: Fields, where: str) -> None:
        role = f.str("role", required=True, msg=f"{where}.role is required")
        native_role = "system" if role == "developer" else role
        if native_role not in ("system", "user", "assistant"):
            raise InvalidRequest(f"{where}.role must be one of user, assistant, system, developer; got {role!r}")
        content = _content(f.any("content"), f"{where}.content")
        if native_role == "assistant":
            turn = self._assistant()
            if turn.get("tool_calls"):  # text after calls is a turn of its own
                self.msgs.append({"role": "assistant", "content": content})
            else:
                turn["content"] += content
        else:
            self.msgs.append({"role": native_role, "content": content})

    def _call(self, f: Fields, where: str) -> None:
        call_id = f.str("call_id") or ""
        name = f.str("name", required=True, msg=f"{where}.name is required")
        raw = f.str("arguments", "") or ""
        try:
            args = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            raise InvalidRequest(f"{where}.arguments is not valid JSON") from None
        if not isinstance(args, dict):
            raise InvalidRequest(f"{where}.arguments must be a JSON object")
        if call_id:
            self.call_names[call_id] = name or ""
        call = {"function": {"name": name, "arguments": args}, **({"id": call_id} if call_id else {})}
        self._assistant().setdefault("tool_calls", []).append(call)

    def messages(self) -> list:
        if self.thinking:
            self._assistant()
        if len(self.msgs) > MAX_MESSAGES:
            raise InvalidRequest(f"too many input items ({len(self.msgs)} turns, at most {MAX_MESSAGES})")
        return [parse_message(m, i) for i, m in enumerate(self.msgs)]


def _tools(f: Fields) -> tuple[list[dict], list[dict]]:
    """(as given, in the chat shape the templates take); only function tools, in the Responses' flat shape."""
    given = f.list("tools") or []
    chat = []
    for k, t in enumerate(given):
        if not isinstance(t, dict):
            raise InvalidRequest(f"tools[{k}] must be an object")
        kind = t.get("type")
        if kind != "function":
            raise InvalidRequest(f"tools[{k}]: tool type {kind!r} is not supported (only function tools are)")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools[{k}].name must be a non-empty string")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest(f"tools[{k}].parameters must be an object")
        fn: dict[str, Any] = {"name": name, "parameters": params or {"type": "object", "properties": {}}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        chat.append({"type": "function", "function": fn})
    return given, chat


def _tool_choice(choice: Any, chat_tools: list) -> tuple[list, str | None]:
    """(tools the model sees, forced): forced "" for "required", a name for {"type": "function", "name"}."""
    forced = None
    if choice == "none":
        return [], None
    if choice == "required":
        forced = ""
    elif isinstance(choice, dict) and choice.get("type") == "function":
        forced = choice.get("name")
        if not isinstance(forced, str) or not forced:
            raise InvalidRequest("tool_choice.name must be a non-empty string")
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        chat_tools, forced = allowed_tools(choice, chat_tools, flat=True)
    elif isinstance(choice, dict):
        raise InvalidRequest(
            f"tool_choice type {choice.get('type')!r} is not supported (function and allowed_tools are)"
        )
    elif choice not in (None, "auto"):
        raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}')
    check_forced(forced, chat_tools)
    return chat_tools, forced


def _text_format(f: Fields) -> tuple[dict, str | dict | None]:
    """(the format to echo, the native `format`): text, json_object ("json") or json_schema (its schema)."""
    text = f.obj("text") or {}
    tf = f.nested(text, "text.")
    fmt = tf.obj("format")
    tf.any("verbosity")  # a hint for reasoning models' length; these models have no such setting
    tf.finish()
    if fmt is None or fmt.get("type") == "text":
        return {"type": "text"}, None
    kind = fmt.get("type")
    if kind == "json_object":
        return fmt, "json"
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("text.format.schema must be an object")
        return fmt, schema
    raise InvalidRequest(f"text.format.type {kind!r} is not supported (text, json_object and json_schema are)")


def _include(f: Fields) -> bool:
    """Whether `include` asks for logprobs; values OpenAI does not document are a 400."""
    include = f.list("include") or []
    for v in include:
        if v not in _INCLUDE:
            raise InvalidRequest(f"include value {v!r} is not supported")
    return LOGPROBS_INCLUDE in include


def responses_request(body: dict) -> tuple[ChatRequest, ResponsesOpts]:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required") or ""
    for key, neutral in _REFUSED.items():
        if f.any(key) not in neutral:
            raise InvalidRequest(
                f"{key} is not supported: this server keeps no responses, conversations or prompt templates"
            )
    turns = _Turns(f)
    instructions = f.str("instructions")
    if instructions:
        turns.msgs.append({"role": "system", "content": instructions})
    raw = f.any("input")
    if isinstance(raw, str):
        turns.msgs.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            turns.add(item, i)
    else:
        raise InvalidRequest("input must be a string or an array of input items")
    messages = turns.messages()
    if not any(m.role != "system" for m in messages):
        raise InvalidRequest("input has no turns")
    opts = ResponsesOpts(stream=bool(f.bool("stream", False)), instructions=instructions or None)
    so = f.nested(f.obj("stream_options") or {}, "stream_options.")
    so.bool("include_obfuscation")  # padding against length side channels: nothing to pad on a local stream
    so.finish()
    options = sampling_options(f, ("max_output_tokens",))
    opts.max_output_tokens = options.get("num_predict")
    opts.temperature, opts.top_p = options["temperature"], options["top_p"]
    opts.tools, chat_tools = _tools(f)
    opts.tool_choice = f.any("tool_choice") or "auto"
    tools, forced = _tool_choice(opts.tool_choice, chat_tools)
    opts.max_tool_calls = f.int("max_tool_calls", None, 0, 1 << 20)
    if opts.max_tool_calls == 0:
        if forced is not None:
            raise InvalidRequest("max_tool_calls 0 cannot be combined with a tool_choice that forces a call")
        tools = []
    opts.parallel_tool_calls = bool(f.bool("parallel_tool_calls", True))  # several calls are allowed either way
    opts.text_format, fmt = _text_format(f)
    if forced is not None and fmt is not None:
        raise InvalidRequest("tool_choice that forces a call cannot be combined with text.format")
    opts.truncation = f.str("truncation", "disabled") or "disabled"
    if opts.truncation not in ("disabled", "auto"):
        raise InvalidRequest(f"truncation must be 'disabled' or 'auto', got {opts.truncation!r}")
    opts.metadata = f.obj("metadata") or {}
    opts.logprobs = _include(f)
    opts.top_logprobs = f.int("top_logprobs", 0, 0, TOP_LOGPROBS_MAX) or 0
    req = ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=forced,
        stream=True,
        format=fmt,
        keep_alive=f.any("keep_alive"),
        options=options,
        truncate=opts.truncation == "auto",
        logprobs=opts.logprobs or opts.top_logprobs > 0,
        top_logprobs=opts.top_logprobs,
    )
    reasoning(f, req)
    req.cache_salt = cache_salt(f)  # vLLM's field, as on /v1/chat/completions
    opts.logprobs = req.logprobs
    # Unread (store, service_tier, user, safety_identifier, prompt_cache_key, ...): none changes what a local
    # model answers, so they are ignored, as Ollama does, and logged by name.
    req.ignored = f.finish()
    return req, opts
