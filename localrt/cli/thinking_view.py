"""How `localrt run` shows a thinking model's reasoning, as `ollama run` does: "Thinking..." and the reasoning set
apart (dim on a terminal), "...done thinking." when the answer starts; nothing of it under --hidethinking."""

from __future__ import annotations

DIM, RESET = "\x1b[2m", "\x1b[0m"


class ThinkingView:
    """write(thinking, answer) for each streamed piece; `out` writes the answer (WordWrap or plain), `raw` is the
    stream itself (for the escape codes, only on a terminal)."""

    def __init__(self, out, raw, *, hide: bool = False, tty: bool = False) -> None:
        self.out, self.raw, self.hide, self.tty = out, raw, hide, tty
        self.thinking = False  # inside the shown reasoning

    def write(self, thinking: str, answer: str) -> None:
        if thinking and not self.hide:
            if not self.thinking:
                self.thinking = True
                self._plain("Thinking...\n")
            self._plain(thinking)
        if answer and self.thinking:
            self.thinking = False
            self._plain("\n...done thinking.\n\n")
        if answer:
            self.out.write(answer)

    def end(self) -> None:
        if self.thinking:  # the reply ended inside the reasoning
            self.thinking = False
            self._plain("\n...done thinking.\n")

    def _plain(self, text: str) -> None:
        self.raw.write(f"{DIM}{text}{RESET}" if self.tty else text)
        self.raw.flush()
