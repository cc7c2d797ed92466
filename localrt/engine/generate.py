"""`generate`: prompt ids in, events out (Token ... then Done), prefill in chunks, then decode."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import numpy as np

from ..api.options import Options, resolve
from ..errors import Cancelled, ContextLengthExceeded, InvalidRequest
from .events import Done, Token
from .sampler import make_sampler
from .stop import StopMatcher


def generate(model, ids, options: dict | Options | None = None, *, slot: int = 0, load_duration_ns: int = 0,
             cancelled: threading.Event | None = None, constraint=None) -> Iterator[Token | Done]:
    """Yield a Token per sampled token and a final Done.

    Stops on the model's end-of-generation tokens (done_reason "stop"), on a stop string (never partly
    emitted; "stop"), at num_predict or when prompt + output reach num_ctx ("length"). A prompt longer
    than num_ctx raises ContextLengthExceeded before anything is yielded. `cancelled` is checked between
    prefill chunks (raising Cancelled) and before each decode step (ending without Done). `constraint`
    (localrt.structured) limits each step to tokens that keep the output valid for a `format`.
    """
    t_start = time.perf_counter_ns()
    opts = options if isinstance(options, Options) else resolve(options)
    prompt = [int(i) for i in ids]
    n_ctx = model.num_ctx
    if isinstance(options, Options) or (options is not None and "num_ctx" in options):
        n_ctx = min(n_ctx, opts.num_ctx)  # a request may ask for less context than was loaded
    if not prompt:
        raise InvalidRequest("the prompt has no tokens")
    if len(prompt) > n_ctx:
        raise ContextLengthExceeded(len(prompt), n_ctx)
    model._check_ids(prompt)  # token ids in range
    sampler = make_sampler(opts)
    if constraint is not None:
        from ..structured import ConstrainedSampler

        sampler = ConstrainedSampler(sampler, constraint)
    stop = StopMatcher(opts.stop)
    tok = model.tokenizer
    decoder = tok.stream_decoder() if tok is not None else None
    eog = tok.eog_ids if tok is not None else frozenset()

    logits, n_cached = _prefill(model, prompt, slot, min(opts.num_batch, model.num_batch), cancelled)
    t_prefill = time.perf_counter_ns()

    history = list(prompt)
    n_gen = 0
    limit = opts.num_predict if opts.num_predict >= 0 else None
    reason = "length"
    hit = False

    def more() -> bool:  # room in the context and in num_predict for another token
        return len(history) < n_ctx and (limit is None or n_gen < limit)

    while more():
        if cancelled is not None and cancelled.is_set():
            return  # the consumer is gone: no Done to send
        token = int(sampler.sample(logits, history))
        history.append(token)
        n_gen += 1
        if token in eog:
            reason = "stop"
            break
        emit, hit = stop.feed(decoder.add(token) if decoder is not None else "")
        yield Token(token=token, text=emit)
        if hit:
            reason = "stop"
            break
        if more():  # only then is this token's forward pass needed
            logits = _decode(model, token, len(history) - 1, slot)
    t_end = time.perf_counter_ns()
    held = ""
    if not hit:
        # Text a stop string might still have completed, and bytes of an unfinished character.
        held = stop.feed(decoder.flush() if decoder is not None else "")[0] + stop.flush()
    model._slot_tokens[slot] = history[: int(model.cache.lengths[slot])]
    yield Done(
        done_reason=reason,
        prompt_eval_count=len(prompt),
        prompt_cached_count=n_cached,
        prompt_eval_duration=t_prefill - t_start,
        eval_count=n_gen,
        eval_duration=t_end - t_prefill,
        load_duration=load_duration_ns,
        total_duration=t_end - t_start + load_duration_ns,
        text=held,
        context=history,
    )


def _prefill(model, prompt: list[int], slot: int, num_batch: int,
             cancelled: threading.Event | None = None) -> tuple[np.ndarray, int]:
    """Evaluate the prompt, reusing the longest cached prefix of this slot; the logits of its last token and
    how many tokens came from the cache."""
    cache = model.cache
    cached = model._slot_tokens.get(slot, [])
    keep = 0
    limit = min(len(cached), len(prompt) - 1, int(cache.lengths[slot]))  # evaluate at least one token
    while keep < limit and cached[keep] == prompt[keep]:
        keep += 1
    if cache.can_trim(slot, keep):
        cache.trim(slot, keep)
    else:
        keep = 0
        cache.clear(slot)
    model._slot_tokens[slot] = []  # invalid until this generation finishes
    logits = None
    for start in range(keep, len(prompt), num_batch):
        if cancelled is not None and cancelled.is_set():
            raise Cancelled()  # between chunks: the cache stays consistent, _slot_tokens says nothing is cached
        chunk = prompt[start : start + num_batch]
        batch = model.batch(chunk, start, slot)
        logits = model.forward(batch, cache, output_rows=np.array([len(chunk) - 1]))[0]
    return logits, keep


def _decode(model, token: int, pos: int, slot: int) -> np.ndarray:
    return model.forward(model.batch([token], pos, slot), model.cache, output_rows=None)[0]
