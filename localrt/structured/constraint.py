"""`Constraint`: per-request decoding state over a compiled format; masks come from the token index."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .dfa import DFA, determinize, step
from .errors import SchemaError
from .schema import Framed, build_nfa
from .vocab import TokenIndex, allowed_tokens, token_index

MAX_STACK = 256  # free-form JSON nesting depth
_COMPACT_MAX = 4096  # at most this many allowed tokens: sample over them alone
_MASK_CACHE = 256  # masks kept per compiled format and tokenizer
_FORMAT_CACHE = 64


class Grammar:
    """A compiled format bound to one tokenizer's index; shared by requests, masks cached by state."""

    def __init__(self, dfa: DFA, index: TokenIndex) -> None:
        self.dfa = dfa
        self.index = index
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def mask(self, state: int, stack: tuple) -> np.ndarray:
        return self.allowed(state, stack)[0]

    def allowed(self, state: int, stack: tuple) -> tuple[np.ndarray, np.ndarray | None]:
        """(mask bool (n_vocab,), allowed ids int64 ascending (n_allowed,) or None when there are more than
        _COMPACT_MAX). Cached per automaton state as packed bits (32 KB for a 262k vocabulary)."""
        key = (state, stack)
        with self._lock:
            hit = self._masks.get(key)
            if hit is not None:
                self._masks.move_to_end(key)
        if hit is not None:
            packed, ids = hit
            return np.unpackbits(packed, count=self.index.n_vocab).view(bool), ids
        ix, d = self.index, self.dfa
        m = np.zeros(ix.n_vocab, bool)  # (n_vocab,)
        allowed_tokens(
            ix.ids,
            ix.offsets,
            ix.data,
            ix.lcp,
            ix.max_len,
            d.trans,
            d.action,
            d.ret,
            state,
            np.asarray(stack, np.int32),
            MAX_STACK,
            m,
        )
        if d.accept[state] and not stack:
            m[ix.eog] = True
        n_allowed = int(np.count_nonzero(m))
        if n_allowed == 0:  # the automaton continues only through bytes no token spells
            raise SchemaError(
                "no token of this model can continue the document; the schema needs characters outside its vocabulary"
            )
        ids = np.flatnonzero(m) if n_allowed <= _COMPACT_MAX else None  # (n_allowed,)
        packed = np.packbits(m)  # (ceil(n_vocab / 8),) uint8
        with self._lock:
            self._masks[key] = (packed, ids)
            if len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return m, ids


class Constraint:
    """Which tokens may come next. Use: `logits = c.apply(logits)`; sample; `c.advance(token)`;
    `c.done()` says whether end-of-generation is allowed now (the text so far is a complete document)."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.state = grammar.dfa.start
        self.stack: list[int] = []
        self.text = bytearray()

    def allowed_mask(self) -> np.ndarray:
        """bool (n_vocab,): True where the token keeps the output a valid prefix (EOG iff complete)."""
        return self.grammar.mask(self.state, tuple(self.stack))

    def allowed_ids(self) -> np.ndarray | None:
        """int64 (n_allowed,) ascending: the ids allowed_mask marks; None when there are many."""
        return self.grammar.allowed(self.state, tuple(self.stack))[1]

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """logits float32 (n_vocab,) with disallowed tokens at -inf (a new array)."""
        mask = self.allowed_mask()
        return np.where(mask, logits[: len(mask)], np.float32(-np.inf)).astype(np.float32, copy=False)

    def advance(self, token: int) -> None:
        ix = self.grammar.index
        if token in ix.eog:
            if not self.done():
                raise SchemaError("end of generation before the document is complete")
            return
        piece = ix.pieces[token]
        if not piece:
            raise SchemaError(f"token {token} has no text and cannot extend a constrained document")
        d = self.grammar.dfa
        state, stack = self.state, list(self.stack)
        for b in piece:
            state = step(d, state, stack, b, MAX_STACK)
            if state < 0:
                raise SchemaError(
                    f"token {token} ({piece!r}) does not continue the document {bytes(self.text)[-40:]!r}"
                )
        self.state, self.stack = state, stack
        self.text += piece

    def feed(self, data: bytes) -> bool:
        """Step over bytes the model has already written (not a token of its own); False, and no change, when
        they do not continue the document."""
        d = self.grammar.dfa
        state, stack = self.state, list(self.stack)
        for b in data:
            state = step(d, state, stack, b, MAX_STACK)
            if state < 0:
                return False
        self.state, self.stack = state, stack
        self.text += data
        return True

    def done(self) -> bool:
        return bool(self.grammar.dfa.accept[self.state]) and not self.stack

    def finished(self) -> bool:
        """Complete and nothing but end-of-generation may follow."""
        if not self.done():
            return False
        m = self.allowed_mask()
        return int(m.sum()) == int(m[self.grammar.index.eog].sum())


class ConstrainedSampler:
    """Wraps a `localrt.engine.sampler` Sampler: masks the logits before each draw and advances the constraint
    with the drawn token, so an engine only swaps its sampler (EOG is drawn once the document is done)."""

    def __init__(self, sampler, constraint: Constraint) -> None:
        self.sampler = sampler
        self.constraint = constraint

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        ids = self.constraint.allowed_ids()
        if ids is not None:
            # Sample among the allowed tokens only: same draw as over the -inf-masked vocabulary (order and
            # penalties kept: ids ascend, history mapped into the small index space), but the sampler's
            # filters then run on a few entries instead of a vocabulary of mostly -inf ties.
            hist = np.asarray(history, np.int64)  # (n_hist,)
            pos = np.searchsorted(ids, hist)  # (n_hist,)
            known = pos < len(ids)
            known[known] = ids[pos[known]] == hist[known]
            token = int(ids[int(self.sampler.sample(logits[ids], pos[known]))])
        else:
            token = int(self.sampler.sample(self.constraint.apply(logits), history))
        self.constraint.advance(token)
        return token

    def distribution(self, logits: np.ndarray, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """What `sample` would draw from (ids, probabilities), without advancing the constraint."""
        ids = self.constraint.allowed_ids()
        if ids is None:
            return self.sampler.distribution(self.constraint.apply(logits), history)
        hist = np.asarray(history, np.int64)  # (n_hist,)
        pos = np.searchsorted(ids, hist)  # (n_hist,)
        known = pos < len(ids)
        known[known] = ids[pos[known]] == hist[known]
        sub, probs = self.sampler.distribution(logits[ids], pos[known])
        return ids[sub], probs

    def commit(self, token: int) -> None:
        """A token chosen outside `sample` (speculative sampling, among this distribution's ids) was emitted."""
        self.constraint.advance(token)

    @property
    def rng(self):
        return self.sampler.rng


_formats: OrderedDict = OrderedDict()
_formats_lock = threading.Lock()


def compile_dfa(fmt: Any) -> DFA:
    """The automaton of a format ("json" or a schema dict), cached by its canonical JSON."""
    key = repr(fmt) if isinstance(fmt, Framed) else json.dumps(fmt, sort_keys=True)
    with _formats_lock:
        dfa = _formats.get(key)
        if dfa is not None:
            _formats.move_to_end(key)
            return dfa
    dfa = determinize(build_nfa(fmt))
    with _formats_lock:
        _formats[key] = dfa
        if len(_formats) > _FORMAT_CACHE:
            _formats.popitem(last=False)
    return dfa


def check_format(fmt: Any) -> None:
    """Validate and compile an Ollama `format` value without a tokenizer (the 400 before any byte)."""
    if fmt is not None and fmt != "":
        compile_dfa(fmt)


_grammars: "OrderedDict[tuple, Grammar]" = OrderedDict()


def compile_format(fmt: Any, tokenizer) -> Constraint | None:
    """A fresh Constraint for an Ollama `format` value, or None when it asks for no constraint ("" / None).

    Raises SchemaError (an InvalidRequest: HTTP 400) for anything that is neither "json" nor a supported
    schema, before any token is generated."""
    if fmt is None or fmt == "":
        return None
    dfa = compile_dfa(fmt)
    index = token_index(tokenizer)
    key = (id(dfa), id(index))
    with _formats_lock:
        grammar = _grammars.get(key)
        if grammar is None or grammar.dfa is not dfa or grammar.index is not index:
            grammar = _grammars[key] = Grammar(dfa, index)
            if len(_grammars) > _FORMAT_CACHE:
                _grammars.popitem(last=False)
        else:
            _grammars.move_to_end(key)
    return Constraint(grammar)
