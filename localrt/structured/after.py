"""A constraint that holds only after the model's reasoning (issue 44): free text until the reasoning's closing tag
(`</think>`) has been written, then the request's constraint (a `format`, a forced tool call, or the lazy call
constraint of `tool_choice: auto`) for the rest, so a schema applies to the answer and never to the reasoning.

Where the prompt did not open the reasoning itself, output that starts (after blank text) with anything but the
opening tag has no reasoning: the constraint holds from there. The bytes that follow the closing tag in the token
that completed it, or the answer's first bytes, are stepped through the constraint (blank text dropped, as the
answer's own parser drops it); when they do not continue it, the answer stays unconstrained.
"""

from __future__ import annotations

import weakref

import numpy as np


class AfterReasoning:
    """Constraint's interface (apply, allowed_ids, allowed_mask, advance, done, finished) for ConstrainedSampler."""

    def __init__(self, inner, closing_tag: bytes, opening_tag: bytes = b"", opened: bool = True) -> None:
        if not closing_tag or not (opened or opening_tag):
            raise ValueError("the closing tag, and the opening tag unless the prompt opened the reasoning, are needed")
        self.inner = inner  # a Constraint or LazyConstraint; None once the answer could not follow it
        self.index = inner.grammar.index
        self.tag, self.opening = closing_tag, opening_tag
        self.looking = not opened  # no output but blank text yet: the reasoning may still open, or not come
        self.open = False  # the reasoning is over (or never came): the inner constraint holds
        self.window = bytearray()  # output so far, bounded to the tag's length once inside the reasoning

    def _free(self) -> bool:
        return not self.open or self.inner is None

    def allowed_mask(self) -> np.ndarray:
        """(n_vocab,) bool. Before any output but blank text: the opening tag's start or the answer's (the model
        reasons first or answers at once, in the constraint's shape either way); inside the reasoning: anything."""
        if self.looking and not self.window and self.inner is not None:
            return self.inner.allowed_mask() | _opening_mask(self.index, self.opening)
        return np.ones(self.index.n_vocab, bool) if self._free() else self.inner.allowed_mask()

    def allowed_ids(self) -> np.ndarray | None:
        return None if self._free() else self.inner.allowed_ids()

    def apply(self, logits: np.ndarray) -> np.ndarray:
        if self._free() and not (self.looking and not self.window):
            return logits
        mask = self.allowed_mask()
        return np.where(mask, logits[: len(mask)], np.float32(-np.inf)).astype(np.float32, copy=False)

    def advance(self, token: int) -> None:
        if self.open:
            if self.inner is not None:
                self.inner.advance(token)
            return
        if token in self.index.eog:
            return
        start = max(0, len(self.window) - len(self.tag) + 1)  # where a closing tag this token completes may begin
        self.window += self.index.pieces[token]
        if self.looking:
            text = bytes(self.window).lstrip()
            if not text:
                self.window.clear()
                return
            if self.opening.startswith(text):
                return  # the opening tag so far
            if not text.startswith(self.opening):
                self._start(text)  # no reasoning: this is the answer
                return
            self.looking = False
            start = len(self.window) - len(text) + len(self.opening)  # the closing tag comes after the opening
        at = self.window.find(self.tag, start)
        if at < 0:
            del self.window[: max(0, len(self.window) - len(self.tag))]  # keep what could start the tag
            return
        self._start(bytes(self.window[at + len(self.tag) :]).lstrip())

    def _start(self, answer: bytes) -> None:
        """The answer begins; `answer` is what of it the model has written already."""
        self.open, self.looking = True, False
        self.window.clear()
        feed = getattr(self.inner, "feed", None)
        if answer and (feed is None or not feed(answer)):
            self.inner = None  # the answer began in a shape the constraint does not have

    def done(self) -> bool:
        return self._free() or self.inner.done()

    def finished(self) -> bool:
        return False if self._free() else self.inner.finished()


_OPENING_MASKS: dict[tuple[int, bytes], tuple[weakref.ref, np.ndarray]] = {}


def _opening_mask(index, opening: bytes) -> np.ndarray:
    """(n_vocab,) bool: tokens that may begin output which opens the reasoning (blank text, then the opening tag or
    its start); computed once per vocabulary (while it lives) and tag."""
    key = (id(index), opening)
    found = _OPENING_MASKS.get(key)
    if found is not None and found[0]() is index:
        return found[1]
    mask = np.zeros(index.n_vocab, bool)
    for i, piece in enumerate(index.pieces):
        text = piece.lstrip()
        if piece and (opening.startswith(text) or text.startswith(opening)):
            mask[i] = True
    _OPENING_MASKS[key] = (weakref.ref(index), mask)
    return mask
