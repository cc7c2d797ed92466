"""A constraint that holds only after the model's reasoning (issue 44): free text until the reasoning's closing tag
(`</think>`) has been written, then the request's constraint (a `format`, a forced tool call, or the lazy call
constraint of `tool_choice: auto`) for the rest, so a schema applies to the answer and never to the reasoning.

The bytes that follow the tag in the token that completed it are stepped through the constraint (blank text
dropped, as the answer's own parser drops it); when they do not continue it, the answer stays unconstrained.
"""
from __future__ import annotations

import numpy as np


class AfterReasoning:
    """Constraint's interface (apply, allowed_ids, allowed_mask, advance, done, finished) for ConstrainedSampler."""

    def __init__(self, inner, closing_tag: bytes) -> None:
        if not closing_tag:
            raise ValueError("a closing tag is required")
        self.inner = inner  # a Constraint or LazyConstraint; None once the answer could not follow it
        self.index = inner.grammar.index
        self.tag = closing_tag
        self.open = False  # the reasoning is over: the inner constraint holds
        self.window = bytearray()  # output since the start, bounded to the tag's length

    def _free(self) -> bool:
        return not self.open or self.inner is None

    def allowed_mask(self) -> np.ndarray:
        return np.ones(self.index.n_vocab, bool) if self._free() else self.inner.allowed_mask()  # (n_vocab,)

    def allowed_ids(self) -> np.ndarray | None:
        return None if self._free() else self.inner.allowed_ids()

    def apply(self, logits: np.ndarray) -> np.ndarray:
        return logits if self._free() else self.inner.apply(logits)

    def advance(self, token: int) -> None:
        if self.open:
            if self.inner is not None:
                self.inner.advance(token)
            return
        if token in self.index.eog:
            return
        before = len(self.window)
        self.window += self.index.pieces[token]
        at = self.window.find(self.tag, max(0, before - len(self.tag) + 1))
        if at < 0:
            del self.window[: max(0, len(self.window) - len(self.tag))]  # keep what could start the tag
            return
        self.open = True
        rest = bytes(self.window[at + len(self.tag):]).lstrip()
        self.window.clear()
        feed = getattr(self.inner, "feed", None)
        if rest and (feed is None or not feed(rest)):
            self.inner = None  # the answer began in a shape the constraint does not have

    def done(self) -> bool:
        return self._free() or self.inner.done()

    def finished(self) -> bool:
        return False if self._free() else self.inner.finished()
