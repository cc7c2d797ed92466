"""Tool calls parsed out of model output, streaming-aware, for the formats chat templates define:

- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one block per call)
- Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, or the newer `[TOOL_CALLS]name[ARGS]{...}`
- Llama 3 JSON (tag "{"): output that starts with `{"name": ..., "parameters": {...}}` (or "arguments")
- any other tag a Go template opens its tool calls with (`tool_call_tag`), followed by an object or a list

Text that might still become a tool call is held back; everything else streams as content at once. A
call body that is not valid JSON, has no string `name` and object `arguments`/`parameters`, names a tool
the request did not offer, or is cut off by the end of output is given back verbatim as content: no call
is ever invented. `arguments` are returned as objects (the native API); `openai_tool_calls` gives the
/v1 shape with JSON-string arguments.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

HERMES, MISTRAL, JSON_START = "<tool_call>", "[TOOL_CALLS]", "{"
_CLOSERS = {HERMES: "</tool_call>"}
_MISTRAL_ARGS = "[ARGS]"
_ID_ALPHABET = string.ascii_lowercase + string.digits
MAX_CALL_CHARS = 1 << 20  # a body longer than this is not treated as a call (held-back text is bounded)


@dataclass
class ToolCall:
    name: str
    arguments: dict
    index: int
    id: str = field(default_factory=lambda: "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(8)))

    def native(self) -> dict:
        """Ollama /api/chat `message.tool_calls` entry."""
        return {"id": self.id, "function": {"index": self.index, "name": self.name, "arguments": self.arguments}}

    def openai(self) -> dict:
        """OpenAI `tool_calls` entry (also usable as a streaming delta: it carries `index`)."""
        return {
            "id": self.id,
            "index": self.index,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class Parsed:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def tag_for_template(template) -> str:
    """The tool-call tag of a chat template object from `localrt.templates` (Go: read from the tree as
    Ollama does; Jinja: the Hermes or Mistral tag when the source writes it, else "{")."""
    if getattr(template, "kind", None) == "go":
        from . import tool_call_tag

        return tool_call_tag(template.template)
    source = getattr(template, "source", "") or ""
    for tag in (HERMES, MISTRAL):
        if tag in source:
            return tag
    return JSON_START


class ToolCallParser:
    """Feed generated text as it comes; get content to emit now and the calls completed so far."""

    def __init__(self, tag: str = HERMES, tools: list[dict] | None = None) -> None:
        if not tag:
            raise ValueError("a tool-call tag is required")
        self.tag = tag
        self.names = _tool_names(tools)
        self.buf = ""  # text not yet emitted
        self.in_call = False  # buf starts with the tag (or, for "{", with the JSON body)
        self.seen_text = False  # any non-blank content emitted (the "{" format only applies at the start)
        self.n_calls = 0

    def feed(self, text: str) -> Parsed:
        self.buf += text
        out = Parsed()
        while self.buf:
            if self.in_call:
                if not self._take_call(out, final=False):
                    break
                continue
            start = self._find_start()
            if start is None:
                keep = self._holdback()
                self._emit(out, self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                break
            self._emit(out, self.buf[:start])
            self.buf = self.buf[start:]
            self.in_call = True
        return out

    def flush(self) -> Parsed:
        """End of output: a call still open is given back as text."""
        out = Parsed()
        if self.in_call:
            self._take_call(out, final=True)
        self._emit(out, self.buf)
        self.buf = ""
        self.in_call = False
        return out

    # -- scanning ------------------------------------------------------------------------------------

    def _find_start(self) -> int | None:
        if self.tag == JSON_START:
            if self.seen_text:
                return None
            return 0 if self.buf.lstrip().startswith("{") else None  # leading blanks stay with the call
        i = self.buf.find(self.tag)
        return i if i >= 0 else None

    def _holdback(self) -> int:
        """How many trailing characters of buf might be the start of the tag."""
        if self.tag == JSON_START:
            return len(self.buf) if not self.seen_text and not self.buf.strip() else 0
        for n in range(min(len(self.tag) - 1, len(self.buf)), 0, -1):
            if self.tag.startswith(self.buf[-n:]):
                return n
        return 0

    def _emit(self, out: Parsed, text: str) -> None:
        if text:
            out.content += text
            self.seen_text = self.seen_text or bool(text.strip())

    def _take_call(self, out: Parsed, final: bool) -> bool:
        """Consume one call at the start of buf. False when more text is needed (and not final)."""
        body_at = 0 if self.tag == JSON_START else len(self.tag)
        if len(self.buf) < body_at:
            return self._give_back(out) if final else False
        result = _parse_body(self.buf, body_at, self.tag)
        if result is None:  # incomplete
            if final or len(self.buf) > MAX_CALL_CHARS:
                return self._give_back(out)
            return False
        if result is False:
            return self._give_back(out)
        calls, end = result
        closer = _CLOSERS.get(self.tag)
        if closer is not None:
            rest = self.buf[end:]
            stripped = rest.lstrip()
            if stripped.startswith(closer):
                end += len(rest) - len(stripped) + len(closer)
            elif closer.startswith(stripped) and not final:
                return False  # the closing tag may still come
            # a missing closer at the end of output is tolerated: the body parsed completely
        if self.names is not None and any(name not in self.names for name, _ in calls):
            return self._give_back(out)
        for name, args in calls:
            out.calls.append(ToolCall(name, args, self.n_calls))
            self.n_calls += 1
        self.buf = self.buf[end:]
        self.in_call = False
        return True

    def _give_back(self, out: Parsed) -> bool:
        """Not a call: the held text becomes content, and scanning resumes after the tag."""
        cut = len(self.tag) if self.tag != JSON_START else len(self.buf)
        self._emit(out, self.buf[:cut])
        self.buf = self.buf[cut:]
        self.in_call = False
        if self.tag == JSON_START:
            self.seen_text = True
        return True


def parse_tool_calls(text: str, tag: str = HERMES, tools: list[dict] | None = None) -> Parsed:
    """Whole-output form of ToolCallParser."""
    p = ToolCallParser(tag, tools)
    first = p.feed(text)
    last = p.flush()
    return Parsed(first.content + last.content, first.calls + last.calls)


def _tool_names(tools: list[dict] | None) -> set[str] | None:
    if not tools:
        return None
    names = set()
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _parse_body(buf: str, at: int, tag: str):
    """(calls, end index) for a complete body, None when it may still be incomplete, False when it is
    not a call."""
    i = at
    while i < len(buf) and buf[i].isspace():
        i += 1
    if i == len(buf):
        return None
    if tag == MISTRAL and buf[i] not in "[{":
        return _parse_mistral_named(buf, i)
    if buf[i] not in "[{":
        return False
    end = _json_end(buf, i)
    if end is None:
        return None
    if end < 0:
        return False
    try:
        value = json.loads(buf[i:end])
    except (ValueError, RecursionError):
        return False
    items = value if isinstance(value, list) else [value]
    calls = [_call_of(v) for v in items]
    if not calls or any(c is None for c in calls):
        return False
    return calls, end


def _parse_mistral_named(buf: str, i: int):
    """`name[ARGS]{...}` (Mistral's v11+ format)."""
    j = buf.find(_MISTRAL_ARGS, i)
    if j < 0:
        return None if len(buf) - i < 256 and all(c.isalnum() or c in "_-." for c in buf[i:]) else False
    name = buf[i:j]
    if not name or not all(c.isalnum() or c in "_-." for c in name):
        return False
    k = j + len(_MISTRAL_ARGS)
    if k >= len(buf):
        return None
    end = _json_end(buf, k)
    if end is None:
        return None
    if end < 0:
        return False
    try:
        args = json.loads(buf[k:end])
    except (ValueError, RecursionError):
        return False
    return ([(name, args)], end) if isinstance(args, dict) else False


def _json_end(buf: str, i: int) -> int | None:
    """Index just past the JSON object/array starting at buf[i]; None if it does not close yet; -1 if
    the brackets do not match."""
    stack = []
    in_str = esc = False
    for k in range(i, len(buf)):
        c = buf[k]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            stack.append("]" if c == "[" else "}")
        elif c in "]}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return k + 1
    return None


def _call_of(value: Any) -> tuple[str, dict] | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # {"type": "function", "function": {...}}
        value = value["function"]
    name = value.get("name")
    args = value.get("arguments", value.get("parameters"))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    extra = set(value) - {"name", "arguments", "parameters", "type", "id"}
    return None if extra else (name, args)


def tool_call_schema(tools: list[dict]) -> dict:
    """A JSON schema matching one call `{"name": ..., "arguments": {...}}` of any offered tool, arguments
    checked against that tool's `parameters`: hand it to `localrt.structured.compile_format` to constrain
    a call body once the tag has been generated."""
    alts = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters") or {"type": "object"}
        alts.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not alts:
        raise ValueError("no tools")
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def forced_call_format(tag: str, tools: list[dict]):
    """The constrained-decoding format that makes the model call one of `tools` (OpenAI's `tool_choice`
    "required", or one named function): the call object of `tool_call_schema`, framed the way this template's
    model writes calls (Hermes: `<tool_call>` lines; Mistral or another literal tag: the tag then the object;
    no tag: the bare object)."""
    from ..structured import Framed

    schema = tool_call_schema(tools)
    if tag == HERMES:
        return Framed.of(HERMES + "\n", schema, "\n" + _CLOSERS[HERMES])
    return Framed.of("" if tag == JSON_START else tag, schema, "")


def opened_call_format(tag: str, tools: list[dict]):
    """(trigger, format, at_start) for tool_choice "auto": once the model writes `trigger` by itself, `format`
    (the call object of `tool_call_schema`, from the trigger on, blanks allowed around it) constrains the rest of
    that call, so an opened call always parses. The "{" format's call is the whole reply: only at the start."""
    from ..structured import Framed

    schema = tool_call_schema(tools)
    if tag == JSON_START:
        return JSON_START, Framed.of("", schema, "", blanks=True), True
    return tag, Framed.of(tag, schema, _CLOSERS.get(tag, ""), blanks=True), False
