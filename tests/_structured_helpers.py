"""Helpers for the structured-output tests: a byte-level walk of a compiled automaton (no tokenizer) and a
constrained generation loop over the model's forward + KV cache (no engine hook needed)."""

from __future__ import annotations

import random

import numpy as np

from localrt.structured.constraint import MAX_STACK
from localrt.structured.dfa import DFA, step


def accepts(d: DFA, data: bytes) -> bool:
    """Whether the automaton accepts the whole byte string."""
    state, stack = d.start, []
    for b in data:
        state = step(d, state, stack, b, MAX_STACK)
        if state < 0:
            return False
    return bool(d.accept[state]) and not stack


def random_document(d: DFA, rng: random.Random, soft_limit: int = 200) -> bytes:
    """A random document the automaton accepts; past soft_limit it ends by a shortest completion."""
    state, stack, out = d.start, [], bytearray()
    while True:
        done = bool(d.accept[state]) and not stack
        options = [b for b in range(256) if step(d, state, list(stack), b, MAX_STACK) >= 0]
        if done and (not options or rng.random() < 0.3):
            return bytes(out)
        if len(out) > 4 * soft_limit:
            return bytes(out) + _shortest_completion(d, state, stack)
        if len(out) > soft_limit:  # steer toward the end: close strings, then containers, then separators
            for preferred in (b'"', b"}]", b","):
                closing = [b for b in options if b in preferred]
                if closing:
                    options = closing
                    break
        assert options, f"dead end after {bytes(out)!r}"
        b = rng.choice(options)
        state = step(d, state, stack, b, MAX_STACK)
        out.append(b)


def _shortest_completion(d: DFA, state: int, stack: list, limit: int = 500_000) -> bytes:
    """Breadth-first search over (state, stack) for the fewest bytes that complete the document."""
    start = (state, tuple(stack))
    parent: dict = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            s, st = node
            if d.accept[s] and not st:
                path = bytearray()
                while parent[node] is not None:
                    node, b = parent[node]
                    path.append(b)
                return bytes(reversed(path))
            for b in range(256):
                stack2 = list(st)
                s2 = step(d, s, stack2, b, MAX_STACK)
                child = (s2, tuple(stack2))
                if s2 >= 0 and child not in parent:
                    parent[child] = (node, b)
                    nxt.append(child)
        assert len(parent) < limit, "no completion found"
        frontier = nxt
    raise AssertionError("the automaton cannot complete this document")


def constrained_generate(model, prompt: list[int], sampler, max_tokens: int) -> tuple[list[int], bool]:
    """Sample up to max_tokens with a ConstrainedSampler; (generated ids without EOG, whether EOG was chosen)."""
    eog = model.tokenizer.eog_ids
    logits = _prefill(model, prompt)
    history, out = list(prompt), []
    for _ in range(max_tokens):
        tok = int(sampler.sample(logits, history))
        if tok in eog:
            return out, True
        history.append(tok)
        out.append(tok)
        logits = model.forward(model.batch([tok], len(history) - 1, 0), model.cache, output_rows=None)[0]
    return out, False


_last_prefill: dict[int, tuple[list[int], np.ndarray]] = {}  # id(model) -> (prompt, logits of its last token)


def _prefill(model, prompt: list[int]) -> np.ndarray:
    """Logits after the prompt, reusing the cached prompt keys when the same prompt ran last (prefill is
    the slow part of these tests)."""
    seen = _last_prefill.get(id(model))
    if seen is not None and seen[0] == prompt and model.cache.can_trim(0, len(prompt)):
        model.cache.trim(0, len(prompt))
        return seen[1]
    model.cache.clear(0)
    logits = model.forward(model.batch(prompt, 0, 0), model.cache, output_rows=np.array([len(prompt) - 1]))[0]
    _last_prefill[id(model)] = (list(prompt), logits.copy())
    return logits
