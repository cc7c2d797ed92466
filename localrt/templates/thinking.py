"""Reasoning split from the answer in model output, streaming-aware (issue 44): qwen3 and the DeepSeek-R1 distills
write their reasoning between `<think>` and `</think>` before the answer, and a template may open the block itself
(the prompt then ends with `<think>`).

The split follows Ollama's rules: only a block that opens the output (after blank text) is reasoning, a later
`<think>` is answer text; blank text right after either tag is dropped, as is blank text at the end of the
reasoning; text that may still become a tag is held back until it cannot. A block that never closes is reasoning
up to the end of output.
"""

from __future__ import annotations

from typing import Any

OPEN, CLOSE = "<think>", "</think>"

# states
_LOOKING = "looking"  # only blank text so far: the opening tag may still come
_STARTED = "started"  # the opening tag is in: blank text is dropped
_THINKING = "thinking"  # inside the block, until the closing tag
_CLOSED = "closed"  # the closing tag is in: blank text is dropped
_ANSWER = "answer"  # everything from here on is answer text


class ThinkingParser:
    """feed(text) -> (reasoning, answer) to send now; flush() at the end of output for what was held back."""

    def __init__(self, open_tag: str = OPEN, close_tag: str = CLOSE, *, opened: bool = False) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.state = _STARTED if opened else _LOOKING
        self.buf = ""

    @property
    def in_reasoning(self) -> bool:
        return self.state in (_STARTED, _THINKING)

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._step(reasoning, answer):
            pass
        return "".join(reasoning), "".join(answer)

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state in (_STARTED, _THINKING):
            return rest.rstrip(), ""  # a block that never closes: its text is reasoning
        if self.state == _CLOSED:
            return "", ""
        return "", rest

    def _step(self, reasoning: list[str], answer: list[str]) -> bool:
        """One move of the state machine; False when it needs more text (or has passed everything on)."""
        if self.state == _LOOKING:
            stripped = self.buf.lstrip()
            if stripped.startswith(self.open_tag):
                self.buf, self.state = stripped[len(self.open_tag) :], _STARTED
                return True
            if self.open_tag.startswith(stripped):  # blank so far, or the start of the tag: wait
                return False
            self.state = _ANSWER
            return True
        if self.state in (_STARTED, _CLOSED):
            stripped = self.buf.lstrip()
            if not stripped:
                self.buf = ""
                return False
            self.buf, self.state = stripped, (_THINKING if self.state == _STARTED else _ANSWER)
            return True
        if self.state == _THINKING:
            at = self.buf.find(self.close_tag)
            if at >= 0:
                reasoning.append(self.buf[:at].rstrip())
                self.buf, self.state = self.buf[at + len(self.close_tag) :], _CLOSED
                return True
            keep = _held(self.buf, self.close_tag)
            reasoning.append(self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            return False
        answer.append(self.buf)
        self.buf = ""
        return False


def _held(text: str, tag: str) -> int:
    """How many characters at the end of text to hold back: a partial tag, and the blank text before it (blank
    text right before the closing tag is dropped)."""
    keep = 0
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            keep = n
            break
    body = text[: len(text) - keep]
    return keep + (len(body) - len(body.rstrip()))


def thinking_tags(template: Any) -> tuple[str, str] | None:
    """The tags a chat template puts around reasoning, or None when its model does not think: a Go template that
    renders a message's `.Thinking` inside `{{ range .Messages }}` (the text around it gives the tags, as Ollama
    infers them), a Jinja template that writes `<think>` and `</think>` (qwen3, the DeepSeek-R1 distills)."""
    if getattr(template, "kind", None) == "go":
        from .capabilities import thinking_tags as go_tags

        return go_tags(template.template)
    source = getattr(template, "source", "") or ""
    return (OPEN, CLOSE) if OPEN in source and CLOSE in source else None


def opens_reasoning(prompt: str, tags: tuple[str, str]) -> bool:
    """Whether the rendered prompt already opened the reasoning block (the model's output starts inside it)."""
    return prompt.rstrip().endswith(tags[0])
