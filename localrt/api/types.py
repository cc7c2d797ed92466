"""Wire types of the native API: validated request dataclasses built from parsed JSON.

Only validated requests reach the service. Ollama's rule for keys: one we do not know is ignored, and every
request lists what it ignored in `ignored` (the HTTP edge logs them in one warning line); a key we know is
checked, and one we know but do not implement (`images`, ...) is refused with a 400 that names
it. Neutral values of such keys (`tools: []`, `format: ""`, ...) are accepted as the no-op
they are.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from .options import ignored_options

# A key of the service's final reply that only /v1 reports (usage.prompt_tokens_details.cached_tokens); the
# native framing leaves keys that start with "_" out.
PROMPT_CACHED_KEY = "_prompt_cached_count"
MAX_MESSAGES = 10_000
MAX_TEXT_CHARS = 32 * 1024 * 1024  # one prompt or message; the body cap bounds the total anyway


def parse_json_body(raw: bytes) -> dict:
    """Parse a request body as a JSON object, whatever the Content-Type (as Ollama does)."""
    if not raw or not raw.strip():
        raise InvalidRequest("missing request body")
    try:
        data = json.loads(raw, parse_float=_json_float, parse_int=_json_int)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidRequest(f"invalid JSON in request body: {e}") from None
    except RecursionError:
        raise InvalidRequest("invalid JSON in request body: nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def _json_float(text: str) -> float:
    """A JSON number beyond float range (1e400) would become inf and overflow later: refused here."""
    v = float(text)
    if math.isinf(v):
        raise InvalidRequest(f"number {text[:40]} in request body is out of range")
    return v


def _json_int(text: str) -> int:
    """An integer beyond float range cannot be compared with or converted to a float field: refused here."""
    v = int(text)
    if abs(v) >= 1 << 1024:
        raise InvalidRequest(f"number {text[:40]} in request body is out of range")
    return v


class Fields:
    """Typed reads of a request object; `finish()` adds the keys nobody read to `ignored`, each as
    `prefix + key` (`messages[].name`), once."""

    def __init__(self, data: dict, ignored: list[str] | None = None, prefix: str = ""):
        self._data = data
        self._seen: set[str] = set()
        self.ignored = ignored if ignored is not None else []
        self._prefix = prefix

    def _get(self, key: str) -> Any:
        self._seen.add(key)
        return self._data.get(key)

    def str(self, key: str, default: str | None = None, *, required: bool = False, msg: str = "") -> str | None:
        v = self._get(key)
        if v is None:
            if required:
                raise InvalidRequest(msg or f"{key} is required")
            return default
        if not isinstance(v, str):
            raise InvalidRequest(f"{key} must be a string")
        if len(v) > MAX_TEXT_CHARS:
            raise InvalidRequest(f"{key} is too long ({len(v)} characters, at most {MAX_TEXT_CHARS})")
        return v

    def bool(self, key: str, default: bool | None = None) -> bool | None:
        v = self._get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InvalidRequest(f"{key} must be a boolean")
        return v

    def int(self, key: str, default: int | None = None, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self._get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (math.inf, -math.inf):
            raise InvalidRequest(f"{key} must be an integer")
        v = int(v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise InvalidRequest(f"{key} must be between {lo} and {hi}, got {v}")
        return v

    def obj(self, key: str) -> dict | None:
        v = self._get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise InvalidRequest(f"{key} must be an object")
        return v

    def list(self, key: str) -> list | None:
        v = self._get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise InvalidRequest(f"{key} must be an array")
        return v

    def any(self, key: str) -> Any:
        return self._get(key)

    def alias(self, key: str, old: str) -> str | None:
        """A field with a deprecated alias (`model` / `name`)."""
        return self.str(key) or self.str(old)

    def nested(self, data: dict, prefix: str) -> "Fields":
        """Reads of an object inside this one; what it ignores is reported with this request's keys."""
        return Fields(data, self.ignored, self._prefix + prefix)

    def finish(self) -> list[str]:
        for key in sorted(set(self._data) - self._seen):
            name = self._prefix + str(key)
            if name not in self.ignored:
                self.ignored.append(name)
        return self.ignored


def ignored_keys(req: Any) -> list[str]:
    """Every key a parsed request ignores: its own unknown fields, then `options.<key>` for its options."""
    return list(req.ignored) + ["options." + k for k in ignored_options(req.options)]


def _keep_alive(v: Any) -> float | str | None:
    if v is None or isinstance(v, (str, float, int)) and not isinstance(v, bool):
        return v
    raise InvalidRequest("keep_alive must be a number of seconds or a duration string")


def _format(v: Any) -> str | dict | None:
    if v is None or v == "":
        return None
    if v == "json" or isinstance(v, dict):
        return v
    raise InvalidRequest(f'invalid format: {json.dumps(v)[:80]}; expected "json" or a valid JSON Schema object')


def _no_images(v: list | None, where: str) -> None:
    if v:
        raise InvalidRequest(f"{where}: images are not supported: no loaded model here has vision capability")


THINK_LEVELS = ("low", "medium", "high")


def _think(v: Any) -> bool | str | None:
    """Ollama's think: true, false, "low", "medium" or "high"; None when not sent (a thinking model thinks)."""
    if v is None or isinstance(v, bool) or v in THINK_LEVELS:
        return v
    raise InvalidRequest(f'invalid think value: {str(v)[:40]!r} (true, false, "low", "medium" or "high")')


TOP_LOGPROBS_MAX = 20  # Ollama's and OpenAI's bound


def logprobs_fields(f: Fields, flag: str = "logprobs") -> tuple[bool, int]:
    """(logprobs, top_logprobs): Ollama's (and /v1 chat's) pair. top_logprobs without logprobs would change nothing
    (Ollama then reports nothing), so it is refused by name rather than ignored."""
    on = bool(f.bool(flag, False))
    top = f.int("top_logprobs", 0, 0, TOP_LOGPROBS_MAX) or 0
    if top and not on:
        raise InvalidRequest(f"top_logprobs requires {flag}: true")
    return on, top


def cache_salt(f: Fields) -> str:
    """vLLM's cache_salt: requests reuse each other's cached prompt prefixes only under the same salt (and client)."""
    salt = f.str("cache_salt", "") or ""
    if len(salt) > 256:
        raise InvalidRequest("cache_salt must be at most 256 characters")
    return salt


def _inference_fields(f: Fields, r: "GenerateRequest | ChatRequest") -> None:
    """The fields /api/generate and /api/chat share; then what was left unread is `r.ignored`."""
    r.format = _format(f.any("format"))
    r.keep_alive = _keep_alive(f.any("keep_alive"))
    r.options = f.obj("options") or {}
    r.think = _think(f.any("think"))
    r.logprobs, r.top_logprobs = logprobs_fields(f)
    r.truncate = bool(f.bool("truncate", True))
    r.cache_salt = cache_salt(f)
    if f.bool("shift"):
        # the engine stops at num_ctx with done_reason "length"; it never drops old tokens to go on
        raise InvalidRequest("shift (context shifting) is not supported: generation stops when the context is full")
    if f.bool("_debug_render_only"):
        raise InvalidRequest("_debug_render_only is not supported")
    r.ignored = f.finish()


@dataclass
class Message:
    role: str
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str = ""  # a replayed assistant turn's reasoning; templates that know `.Thinking` render it

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.thinking:
            d["thinking"] = self.thinking
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        if self.tool_name:
            d["tool_name"] = self.tool_name
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


ROLES = ("system", "user", "assistant", "tool")


def parse_message(m: Any, i: int, parent: Fields | None = None) -> Message:
    if not isinstance(m, dict):
        raise InvalidRequest(f"messages[{i}] must be an object")
    f = parent.nested(m, "messages[].") if parent is not None else Fields(m, prefix="messages[].")
    role = (f.str("role", required=True, msg=f"messages[{i}].role is required") or "").lower()
    if role not in ROLES:
        raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
    content = f.str("content", "") or ""
    _no_images(f.list("images"), f"messages[{i}]")
    thinking = f.str("thinking", "") or ""
    calls = f.list("tool_calls") or []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"messages[{i}].tool_calls entries need function.name")
        if not isinstance(fn.get("arguments", {}), dict):
            raise InvalidRequest(f"messages[{i}].tool_calls[].function.arguments must be an object")
    msg = Message(role, content, calls, f.str("tool_name"), f.str("tool_call_id"), thinking)
    f.finish()
    return msg


@dataclass
class GenerateRequest:
    model: str
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool = True
    raw: bool = False
    format: str | dict | None = None
    keep_alive: float | str | None = None
    options: dict = field(default_factory=dict)
    truncate: bool = True
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token when logprobs is on
    logit_bias: dict[int, float] | None = None  # /v1 only: token id -> bias added before sampling
    cache_salt: str = ""  # reuse of cached prefixes only among requests of one client with this salt
    prompt_tokens: list[int] | None = None  # /v1/completions only: the prompt as token ids, run as given (raw)
    think: bool | str | None = None  # None: a thinking model thinks; False: it does not where it can; a level
    think_field: str = "think"  # how the request asked (/v1: "reasoning_effort 'high'"), for the error that refuses it
    ignored: list[str] = field(default_factory=list)  # request keys nobody knows (options: see api.options)

    @classmethod
    def from_json(cls, data: dict) -> "GenerateRequest":
        f = Fields(data)
        r = cls(model=f.alias("model", "name") or "")
        if not r.model:
            raise InvalidRequest("model is required")
        r.prompt = f.str("prompt", "") or ""
        r.suffix = f.str("suffix", "") or ""
        r.system = f.str("system")
        r.template = f.str("template")
        ctx = f.list("context")
        if ctx is not None:
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ctx):
                raise InvalidRequest("context must be an array of token ids")
            r.context = ctx
        r.stream = f.bool("stream", True)
        r.raw = bool(f.bool("raw", False))
        if r.raw and (r.template or r.system or r.context):
            raise InvalidRequest("raw mode does not support template, system, or context")
        _no_images(f.list("images"), "request")
        _inference_fields(f, r)
        return r


@dataclass
class ChatRequest:
    model: str
    messages: list[Message] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    tool_choice: str | None = None  # /v1 only: "" = call any tool, a name = call that one; None = model decides
    stream: bool = True
    format: str | dict | None = None
    keep_alive: float | str | None = None
    options: dict = field(default_factory=dict)
    truncate: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] | None = None
    cache_salt: str = ""
    think: bool | str | None = None  # as GenerateRequest.think
    think_field: str = "think"
    ignored: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict) -> "ChatRequest":
        f = Fields(data)
        r = cls(model=f.alias("model", "name") or "")
        if not r.model:
            raise InvalidRequest("model is required")
        msgs = f.list("messages") or []
        if len(msgs) > MAX_MESSAGES:
            raise InvalidRequest(f"too many messages ({len(msgs)}, at most {MAX_MESSAGES})")
        r.messages = [parse_message(m, i, f) for i, m in enumerate(msgs)]
        tools = f.list("tools") or []
        r.tools = check_tools(tools)
        r.stream = f.bool("stream", True)
        _inference_fields(f, r)
        return r


def check_tools(tools: list) -> list:
    """tools as both APIs send them: objects with a `function` that has a name (and, if any, object parameters)."""
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise InvalidRequest(f"tools[{i}] must be an object")
        if t.get("type", "function") != "function":
            raise InvalidRequest(f"tools[{i}].type {str(t.get('type'))[:40]!r} is not supported (function is)")
        if not isinstance(t.get("function"), dict):
            raise InvalidRequest(f"tools[{i}].function is required: an object with the function's name")
        name, params = t["function"].get("name"), t["function"].get("parameters")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools[{i}].function.name must be a non-empty string")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be an object")
    return tools


@dataclass
class EmbedRequest:
    model: str
    inputs: list[str | list[int]]  # token ids only from /v1/embeddings (OpenAI accepts them; Ollama does not)
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: float | str | None = None
    options: dict = field(default_factory=dict)
    legacy: bool = False  # /api/embeddings: one prompt, not normalised
    ignored: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict, legacy: bool = False) -> "EmbedRequest":
        f = Fields(data)
        model = f.alias("model", "name") or ""
        if not model:
            raise InvalidRequest("model is required")
        if legacy:
            prompt = f.str("prompt", "") or ""
            inputs = [prompt] if prompt else []
        else:
            raw = f.any("input")
            if raw is None or raw == "":
                inputs = []
            elif isinstance(raw, str):
                inputs = [raw]
            elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
                inputs = list(raw)
            else:
                raise InvalidRequest("invalid input type")
        r = cls(model, inputs, legacy=legacy)
        if not legacy:
            r.truncate = f.bool("truncate", True)
            r.dimensions = f.int("dimensions", None, 1, 1 << 20)
        r.keep_alive = _keep_alive(f.any("keep_alive"))
        r.options = f.obj("options") or {}
        r.ignored = f.finish()
        return r
