"""A constraint that starts when the model opens something by itself: free text until a trigger (a tool-call tag
such as `<tool_call>`) has been written, then a compiled format from the trigger on, until that format's document
is complete; then free text again, watching for the next trigger (llama.cpp's lazy grammars do the same).

The bytes of the token that completed the trigger, from the trigger's first byte, are stepped through the format
at once; when they do not continue it (the model opened the call in a shape the format does not have), this
occurrence stays unconstrained. With `at_start`, only a trigger that is the first non-blank output counts (a call
format with no tag of its own, whose call is the whole reply).
"""

from __future__ import annotations

import numpy as np

from .constraint import Constraint, Grammar


class LazyConstraint:
    """Constraint's interface (apply, allowed_ids, allowed_mask, advance, done, finished) for ConstrainedSampler."""

    def __init__(self, grammar: Grammar, trigger: bytes, at_start: bool = False) -> None:
        if not trigger:
            raise ValueError("a trigger is required")
        self.grammar = grammar
        self.trigger = trigger
        self.at_start = at_start
        self.inner: Constraint | None = None  # the open document, while one is open
        self.window = bytearray()  # output since the last document (bounded: only a trigger's length is kept)
        self.seen_text = False  # at_start: non-blank output that was not the trigger

    def allowed_mask(self) -> np.ndarray:
        if self.inner is None:
            return np.ones(self.grammar.index.n_vocab, bool)  # (n_vocab,)
        return self.inner.allowed_mask()

    def allowed_ids(self) -> np.ndarray | None:
        return None if self.inner is None else self.inner.allowed_ids()

    def apply(self, logits: np.ndarray) -> np.ndarray:
        return logits if self.inner is None else self.inner.apply(logits)

    def advance(self, token: int) -> None:
        if self.inner is not None:
            self.inner.advance(token)
            if self.inner.done():  # the call is written out: free text again
                self.inner = None
                self.window.clear()
            return
        ix = self.grammar.index
        if token in ix.eog:
            return
        before = len(self.window)
        self.window += ix.pieces[token]
        if self.at_start and self.seen_text:
            return
        at = self.window.find(self.trigger, max(0, before - len(self.trigger) + 1))
        if at < 0:
            if self.at_start and (
                bytes(self.window).strip() and not self.trigger.startswith(bytes(self.window).strip())
            ):
                self.seen_text = True
            del self.window[: max(0, len(self.window) - len(self.trigger))]  # keep what could start a trigger
            return
        if self.at_start and bytes(self.window[:at]).strip():
            self.seen_text = True
            return
        inner = Constraint(self.grammar)
        if inner.feed(bytes(self.window[at:])):
            self.inner = inner
        self.window.clear()

    def done(self) -> bool:
        return self.inner is None or self.inner.done()

    def finished(self) -> bool:
        return False if self.inner is None else self.inner.finished()
