"""`n` > 1 on /v1: n independent choices as n native requests, their items merged into one iterator.

Choice i is the request with its options' `seed` + i when a seed was given (so the choices differ, and each one is
reproducible alone: choice i equals a single request with seed + i); without a seed every choice draws its own
random seed. The scheduler and batch driver run the n sequences as they run any requests of one model: beside
each other, up to the model's KV slots. Each item gets `_choice` (openai_replies.CHOICE_KEY).

`best_of` (legacy completions, not streamed) runs best_of such choices and keeps the n whose tokens have the highest
mean log-probability (BestOf).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable, Iterator

from .openai_replies import CHOICE_KEY, usage_of

_END = object()


def choice_requests(req: Any, n: int) -> list[Any]:
    """n copies of a Generate/ChatRequest; with a seed in its options, copy i has seed + i."""
    seed = req.options.get("seed") if isinstance(req.options, dict) else None
    out = []
    for i in range(n):
        opts = dict(req.options)
        if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
            opts["seed"] = seed + i  # past the seed's range it is a 400 naming the option, from the options check
        out.append(dataclasses.replace(req, options=opts))
    return out


def run_choices(submit: Callable[[Any], Any], req: Any, n: int) -> Any:
    """The native events of the request (n == 1: as they are), or of its n choices merged."""
    return run_prompts(submit, [req], n)


def run_prompts(submit: Callable[[Any], Any], reqs: list[Any], n: int) -> Any:
    """The native events of each request's n choices, merged and numbered request by request (request p's choice j
    is choice p * n + j, as OpenAI numbers a list of prompts); one request with one choice: its events as they are."""
    if len(reqs) == 1 and n == 1:
        return submit(reqs[0])
    streams: list[Any] = []
    try:
        for req in reqs:
            for r in choice_requests(req, n):
                streams.append(submit(r))
    except BaseException:
        for s in streams:
            _cancel(s)
        raise
    return Merged(streams)


def _cancel(stream: Any) -> None:
    cancel = getattr(stream, "cancel", None)
    if cancel is not None:
        cancel()


class Merged:
    """Items of several blocking iterators as they arrive, each tagged with its iterator's index; one thread per
    iterator pulls it. The first error ends the whole: the others are cancelled and it is raised. `cancel()` is
    thread-safe (the HTTP layer calls it when the client goes away)."""

    def __init__(self, streams: list[Any]) -> None:
        self._streams = streams
        self._q: queue.SimpleQueue = queue.SimpleQueue()  # (index, item | _END | exception)
        self._open = len(streams)
        self._failed = False
        for i, s in enumerate(streams):
            threading.Thread(target=self._pull, args=(i, s), name=f"localrt-choice-{i}", daemon=True).start()

    def _pull(self, i: int, stream: Any) -> None:
        try:
            for item in stream:
                self._q.put((i, {**item, CHOICE_KEY: i} if isinstance(item, dict) else item))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._q.put((i, exc))
            return
        self._q.put((i, _END))

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        while self._open and not self._failed:
            _, item = self._q.get()
            if item is _END:
                self._open -= 1
                continue
            if isinstance(item, BaseException):
                self._failed = True
                self.cancel()
                raise item
            return item
        raise StopIteration

    def cancel(self) -> None:
        for s in self._streams:
            _cancel(s)


def mean_logprob(items: list[dict]) -> float:
    """The mean log-probability of a candidate's tokens (its items' logprob entries); -inf for one with none."""
    lps = [float(e.get("logprob", 0.0)) for item in items for e in item.get("logprobs") or ()]
    return sum(lps) / len(lps) if lps else float("-inf")


class BestOf:
    """A non-streamed reply format (openai_replies.CompletionStream) over best_of candidates: the n with the highest
    mean token logprob become choices 0..n-1, best first (ties: the lower candidate index); usage counts the tokens
    of every candidate, as OpenAI counts them."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n = inner, n

    def whole(self, items: list[dict]) -> dict:
        by: dict[int, list[dict]] = {}
        for item in items:
            by.setdefault(int(item.get(CHOICE_KEY, 0)), []).append(item)
        ranked = sorted(by, key=lambda i: (-mean_logprob(by[i]), i))[: self.n]
        out = self.inner.whole([{**item, CHOICE_KEY: rank} for rank, i in enumerate(ranked) for item in by[i]])
        out["usage"] = usage_of({i: mine[-1] for i, mine in by.items() if mine})
        return out
