"""OpenAI's harmony chat format (gpt-oss): detection, the `think` level it is rendered with, and a streaming parser
that splits the model's output into reasoning, answer and tool calls, as Ollama's harmony parser does.

Written here rather than taken from `openai-harmony` (PyPI): that library's encodings load o200k's vocabulary by
downloading it at first use (openai/harmony#46, #95, #101: it fails offline unless a file is placed by hand), a
native extension for each platform, and it renders and parses whole token lists, where the engine needs text pieces
as they stream and the file's own chat template to render. The format itself is small and stable (below).

An assistant message is `<|start|>assistant<|channel|>CHANNEL<|message|>BODY<|end|>`; the prompt ends with
`<|start|>assistant`, so the output begins at `<|channel|>`. Channels: `analysis` is reasoning, `final` is the
answer, `commentary` is answer text unless its header names a recipient (`to=functions.NAME`): then the body is a
tool call's JSON arguments, ended by `<|call|>`. `<|return|>` and `<|call|>` end the generation (the engine stops
there and they seldom reach the text), so a body also ends with the output.

Parsing follows Ollama: a message with a recipient on the analysis or commentary channel is a call; any other
channel, or none, is answer text; `functions.` is stripped from the recipient. Beyond Ollama it tolerates a missing
`<|start|>assistant` before a new `<|channel|>`, and a new message opening before the last one's `<|end|>`; text
outside any message is answer text, never dropped. A call whose arguments are not a JSON object is given back as
answer text (no call is invented). Output that ends inside a message keeps what came: a cut-off reasoning stays
reasoning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from .toolcalls import MAX_CALL_CHARS, ToolCall

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
CHANNELS = ("analysis", "commentary", "final")
LEVELS = ("low", "medium", "high")
DEFAULT_LEVEL = "medium"  # Ollama's level for think true (and for a thinking model that is not sent think)
FINAL_OPENS = CHANNEL + "final" + MESSAGE  # where a harmony model's answer begins (a format holds from there)
MAX_HEADER = 512  # characters; a header longer than this without <|message|> is answer text, not a header

_MARKERS = (START, CHANNEL, MESSAGE)  # all three in a template: it writes harmony
_BODY_ENDS = (END, RETURN, CALL)  # close a message
_BODY_BREAKS = (START, CHANNEL)  # open the next message: the last one ended without its <|end|>
_OPENERS = (START, CHANNEL)


class Harmony:
    """The marker `runtime.reasoning.tags_for` gives for a harmony template (in place of a pair of tags)."""

    def __repr__(self) -> str:
        return "HARMONY"


HARMONY = Harmony()


def is_harmony_source(source: str) -> bool:
    return all(m in source for m in _MARKERS)


def is_harmony(template: Any) -> bool:
    """Whether a chat template object (Go or Jinja) writes the harmony format."""
    return is_harmony_source(getattr(template, "source", "") or "")


def render_think(think: bool | str | None) -> bool | str:
    """The `think` a harmony template is rendered with, as Ollama passes it: a model that thinks is sent true when
    the request says nothing; false is passed on (Ollama's gpt-oss template then writes no `Reasoning:` line; the
    model still reasons, and its reasoning is still reported)."""
    return True if think is None else think


def reasoning_effort(think: bool | str | None) -> str | None:
    """The HF template's `reasoning_effort` for a request's think: its level, "medium" for true or unset (Ollama's
    level for true); None for false, which leaves the template's own default."""
    if isinstance(think, str):
        return think
    return None if think is False else DEFAULT_LEVEL


@dataclass(frozen=True)
class Header:
    """A message header: `ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]`."""

    role: str = ""
    channel: str = ""
    recipient: str = ""
    constrain: str = ""

    @property
    def is_call(self) -> bool:
        return bool(self.recipient) and self.channel in ("analysis", "commentary")

    @property
    def is_reasoning(self) -> bool:
        return self.channel == "analysis" and not self.recipient


_CHANNEL_RE = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")


def parse_header(raw: str) -> Header:
    """The parts of a header's text (everything between `<|start|>` and `<|message|>`)."""
    channel = ""
    m = _CHANNEL_RE.search(raw)
    if m is not None:
        channel = m.group(1)
        raw = raw[: m.start()] + " " + raw[m.end() :]
    raw = raw.replace(CONSTRAIN, " " + CONSTRAIN + " ")
    words = raw.split()
    role = recipient = constrain = ""
    for i, w in enumerate(words):
        if w.startswith("to="):
            recipient = recipient or w[3:]
        elif w == CONSTRAIN:
            constrain = words[i + 1] if i + 1 < len(words) else ""
        elif not role and i == 0:
            role = w
        elif w == "json" and not constrain:  # the HF template writes `commentary json` without <|constrain|>
            constrain = w
    return Header(role, channel, recipient, constrain)


@dataclass
class Piece:
    """What one feed or flush gives: reasoning and answer text to send now, and the tool calls completed."""

    thinking: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


# states
_BETWEEN = "between"  # outside any message: waiting for <|start|> (or a bare <|channel|>)
_HEADER = "header"  # inside a header, until <|message|>
_BODY = "body"  # inside a message body, until its end


class HarmonyParser:
    """feed(text) -> Piece for each piece of generated text; flush() -> Piece at the end of output.

    `for_prompt(prompt)` starts where the rendered prompt leaves the model (normally inside the header that
    `<|start|>assistant` opened)."""

    def __init__(self, state: str = _HEADER, head: str = "assistant", header: Header | None = None) -> None:
        self.state = state
        self.role_known = bool(head.strip())  # the prompt gave the role: the model writes only the rest
        self.head = head  # the header text so far (the prompt's part included)
        self.head_out = 0  # how much of `head` the model wrote (given back as text if it is no header)
        self.header = header or Header()
        self.model_opened = False  # the model wrote this header's <|start|> or <|channel|>: it is a header
        self.buf = ""  # text not yet placed
        self.args = ""  # a tool call's arguments so far
        self.n_calls = 0

    @classmethod
    def for_prompt(cls, prompt: str) -> HarmonyParser:
        """A parser for the output that continues `prompt`. A prompt that ends inside a message body (a prefilled
        answer or reasoning) continues that body; its channel must be one harmony knows (a 400 naming it)."""
        at = prompt.rfind(START)
        tail = prompt[at + len(START) :] if at >= 0 else ""
        if at < 0 or any(e in tail for e in _BODY_ENDS):
            return cls(_BETWEEN, "")
        if MESSAGE not in tail:
            return cls(_HEADER, tail)
        header = parse_header(tail[: tail.index(MESSAGE)])
        if header.channel not in CHANNELS:
            which = f"on channel {header.channel!r}" if header.channel else "with no channel"
            raise InvalidRequest(
                f"the prompt ends inside a harmony message {which}; a message continued by the "
                f"model must be on one of the channels {', '.join(CHANNELS)}"
            )
        return cls(_BODY, "", header)

    def feed(self, text: str) -> Piece:
        self.buf += text
        out = Piece()
        while self._step(out):
            pass
        return out

    def flush(self) -> Piece:
        """The end of output. What was held back as the possible start of a marker is dropped, as Ollama drops it
        (markers are single tokens: a cut-off one is no text of the message)."""
        out = Piece()
        if self.state == _BODY:
            self._close(out)
        elif self.state == _HEADER and not self.model_opened:  # a header cut off is dropped, but plain text
            said = self.head[len(self.head) - self.head_out :] if self.head_out else ""  # where the prompt wanted one
            if said.strip() and "<|" not in said and "to=" not in said and not _held(said, _OPENERS + (MESSAGE,)):
                out.content += said
        self.state, self.head, self.head_out, self.buf = _BETWEEN, "", 0, ""
        return out

    # -- the state machine ---------------------------------------------------------------------------

    def _step(self, out: Piece) -> bool:
        """One move; False when it needs more text."""
        if self.state == _BETWEEN:
            return self._between(out)
        if self.state == _HEADER:
            return self._in_header(out)
        return self._in_body(out)

    def _between(self, out: Piece) -> bool:
        at, marker = _first(self.buf, _OPENERS)
        if marker is None:
            keep = _held(self.buf, _OPENERS)
            text, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
            if text.strip():
                out.content += text  # text outside any message: the answer's, never dropped (blank text is)
            return False
        if self.buf[:at].strip():
            out.content += self.buf[:at]
        if marker == START:
            self.buf, self.head, self.role_known = self.buf[at + len(START) :], "", False
        else:  # <|channel|> with no <|start|>assistant before it: the assistant's next message
            self.buf, self.head, self.role_known = self.buf[at:], "assistant", True
        self.head_out, self.state, self.model_opened = 0, _HEADER, True
        return True

    def _in_header(self, out: Piece) -> bool:
        self.head += self.buf
        self.head_out += len(self.buf)
        self.buf = ""
        at = self.head.find(MESSAGE)
        if at >= 0:
            self.header, self.args, self.state = parse_header(self.head[:at]), "", _BODY
            self.buf, self.head, self.head_out = self.head[at + len(MESSAGE) :], "", 0
            return True
        written = self.head[len(self.head) - self.head_out :]
        if len(written) > MAX_HEADER or (self.role_known and not _may_be_header(written)):
            out.content += written  # the model answers in plain text where a header was due
            self.header, self.args, self.state = Header(role="assistant"), "", _BODY
            self.head, self.head_out = "", 0
            return True
        return False

    def _in_body(self, out: Piece) -> bool:
        at, marker = _first(self.buf, _BODY_ENDS + _BODY_BREAKS)
        if marker is None:
            keep = _held(self.buf, _BODY_ENDS + _BODY_BREAKS)
            self._body_text(out, self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            return False
        self._body_text(out, self.buf[:at])
        self.buf = self.buf[at + len(marker) :] if marker in _BODY_ENDS else self.buf[at:]
        self._close(out)
        self.state = _BETWEEN
        return True

    def _body_text(self, out: Piece, text: str) -> None:
        if not text:
            return
        if self.header.is_call:
            self.args += text
            if len(self.args) > MAX_CALL_CHARS:  # no call's arguments: given back as text, and the rest with it
                out.content, self.args, self.header = out.content + self.args, "", Header(role="assistant")
        elif self.header.is_reasoning:
            out.thinking += text
        else:
            out.content += text

    def _close(self, out: Piece) -> None:
        """The end of a message: a tool call's arguments are parsed now."""
        if not self.header.is_call:
            return
        args, self.args = self.args, ""
        call = _call(self.header.recipient, args, self.n_calls)
        if call is None:
            out.content += args  # not a call's arguments: given back as text
        else:
            out.calls.append(call)
            self.n_calls += 1
        self.header = Header()


def _call(recipient: str, args: str, index: int) -> ToolCall | None:
    name = recipient.removeprefix("functions.")
    try:
        value = json.loads(args) if args.strip() else {}
    except (ValueError, RecursionError):
        return None
    return ToolCall(name, value, index) if name and isinstance(value, dict) else None


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """The earliest marker in text and where it is; (-1, None) when there is none."""
    best, found = -1, None
    for m in markers:
        i = text.find(m)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, m
    return best, found


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of text may be the start of a marker (held back until they are not)."""
    for n in range(min(max(len(m) for m in markers) - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0


def _may_be_header(written: str) -> bool:
    """Whether what the model wrote after the role can still be a header: `<|channel|>...`, ` to=...`, ..."""
    s = written.lstrip()
    return not s or s.startswith(("<|", "to=")) or "<|".startswith(s) or "to=".startswith(s)


def parse_output(text: str, prompt: str = START + "assistant") -> Piece:
    """Whole-output form of HarmonyParser."""
    p = HarmonyParser.for_prompt(prompt)
    first, last = p.feed(text), p.flush()
    return Piece(first.thinking + last.thinking, first.content + last.content, first.calls + last.calls)
