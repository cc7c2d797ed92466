"""A thinking model's reasoning beside its answer (issue 44), for the service's generate and chat.

Which models think: those whose template puts tags around a message's reasoning (templates.thinking_tags). As in
Ollama, such a model thinks when the request sends no `think`, and its reasoning goes to its own field
(`thinking`, `message.thinking`), never into the answer; `think: false` renders the template without reasoning
(qwen3's `enable_thinking`, an empty block) and drops any reasoning the model still writes; a level ("low",
"medium", "high") thinks. Asking a model without tags to think is a 400.

A harmony (gpt-oss) model's output is split by channel instead (templates.harmony): `analysis` is the reasoning,
`final` the answer, a `commentary` message to a function a tool call. As in Ollama, such a model always reasons:
`think: false` does not switch it off and its reasoning is still reported.

A request's constraint (`format`, a forced or an opened tool call) holds only after the reasoning
(structured.AfterReasoning), and tool calls are parsed out of the answer only.
"""

from __future__ import annotations

from ..engine.events import Done
from ..errors import InvalidRequest
from ..structured.after import AfterReasoning
from ..templates.harmony import FINAL_OPENS, HARMONY, HarmonyParser, is_harmony
from ..templates.thinking import ThinkingParser, opens_reasoning, thinking_tags
from .sampling_extras import metrics


def tags_for(template, req, model_name: str):
    """The template's reasoning tags, or HARMONY for a harmony template; a 400 naming how the request asked when it
    asks a model without either to think."""
    if is_harmony(template):
        return HARMONY
    tags = thinking_tags(template)
    if tags is None and req.think not in (None, False):
        field = req.think_field if req.think_field != "think" else f"think {req.think!r}"
        raise InvalidRequest(f"{field}: {model_name} does not support thinking")
    return tags


def default_think(think, tags):
    """The request's think value, or true where it sent none and the model can think: Ollama sets it so (its
    templates then see .IsThinkSet and .Think, e.g. qwen3's " /think"), and the reasoning goes to its own field."""
    return True if think is None and tags is not None else think


class Split:
    """One request's output as (reasoning, answer) pieces; the reasoning is dropped under think false (but for a
    harmony model's); a harmony model's tool calls are taken with take_calls()."""

    def __init__(self, tags, prompt: str, think) -> None:
        self.harmony = HarmonyParser.for_prompt(prompt) if tags is HARMONY else None
        self.parser = ThinkingParser(*tags, opened=opens_reasoning(prompt, tags)) if tags and not self.harmony else None
        self.show = think is not False or self.harmony is not None
        self.calls: list = []

    def feed(self, text: str) -> tuple[str, str]:
        if self.harmony is not None:
            return self._harmony(self.harmony.feed(text))
        if self.parser is None:
            return "", text
        reasoning, answer = self.parser.feed(text)
        return (reasoning if self.show else ""), answer

    def flush(self) -> tuple[str, str]:
        if self.harmony is not None:
            return self._harmony(self.harmony.flush())
        if self.parser is None:
            return "", ""
        reasoning, answer = self.parser.flush()
        return (reasoning if self.show else ""), answer

    def take_calls(self) -> list:
        """The tool calls a harmony model completed since the last take."""
        calls, self.calls = self.calls, []
        return calls

    def _harmony(self, piece) -> tuple[str, str]:
        self.calls.extend(piece.calls)
        return piece.thinking, piece.content


def after_reasoning(constraint, tags, prompt: str, think):
    """The request's constraint, held off until the reasoning is over where the model may reason first (a harmony
    model: until it opens its final-channel message)."""
    if constraint is None or tags is None or not hasattr(constraint, "grammar"):
        return constraint
    if tags is HARMONY:
        return AfterReasoning(constraint, FINAL_OPENS.encode(), opened=True)
    if think is False and not opens_reasoning(prompt, tags):  # the template could switch it off
        return constraint
    return AfterReasoning(constraint, tags[1].encode(), tags[0].encode(), opened=opens_reasoning(prompt, tags))


class ChatItems:
    """The native /api/chat items of a run's events, one event at a time: reasoning, answer text and the tool calls
    parsed out of the answer (or a harmony model's calls); `reply(content, calls, thinking, **extra)` shapes one,
    `load_ns()` the load time the last one reports."""

    def __init__(self, split: Split, parser, pending, reply, load_ns) -> None:
        self.split, self.parser, self.pending, self.reply, self.load_ns = split, parser, pending, reply, load_ns

    def __call__(self, ev) -> list[dict]:
        split, parser = self.split, self.parser
        self.pending.add(ev.logprobs)
        thinking, text = split.feed(ev.text)
        done = isinstance(ev, Done)
        if done:
            more, rest = split.flush()
            thinking, text = thinking + more, text + rest
        got = parser.feed(text) if parser else None
        content, calls = (got.content, got.calls) if got else (text, [])
        if done and parser:
            rest_call = parser.flush()
            content, calls = content + rest_call.content, calls + rest_call.calls
        calls = calls + split.take_calls()
        if done:
            return [self.reply(content, calls, thinking, **self.pending.take(), **metrics(ev, self.load_ns()))]
        if content or calls or thinking:
            return [self.reply(content, calls, thinking, done=False, **self.pending.take())]
        return []


class GenerateItems:
    """The native /api/generate items of a run's events, one event at a time: `response`, and `thinking` where the
    model reasons."""

    def __init__(self, split: Split, pending, base, raw: bool, load_ns) -> None:
        self.split, self.pending, self.base, self.raw, self.load_ns = split, pending, base, raw, load_ns

    def __call__(self, ev) -> list[dict]:
        split = self.split
        self.pending.add(ev.logprobs)
        thinking, text = split.feed(ev.text)
        said = {"thinking": thinking} if thinking else {}
        if isinstance(ev, Done):
            more, rest = split.flush()
            said = {"thinking": thinking + more} if thinking + more else {}
            out = {**self.base(), "response": text + rest, **said, **self.pending.take(), **metrics(ev, self.load_ns())}
            if not self.raw:
                out["context"] = list(ev.context)
            return [out]
        if text or thinking or (split.parser is None and split.harmony is None):
            return [{**self.base(), "response": text, **said, "done": False, **self.pending.take()}]
        return []
