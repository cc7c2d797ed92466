"""`generate`: prompt ids in, events out (Token ... then Done), prefill in chunks, then decode.

One sequence is a `Batcher` of one (localrt.engine.batch): the same sampling, stop-string and Done logic
runs whether a request is alone or batched with others."""

from __future__ import annotations

import threading
from typing import Iterator

from ..api.options import Options
from ..errors import Cancelled
from .batch import Batcher
from .events import Done, Token


def generate(
    model,
    ids,
    options: dict | Options | None = None,
    *,
    slot: int = 0,
    load_duration_ns: int = 0,
    cancelled: threading.Event | None = None,
    constraint=None,
    logprobs: int | None = None,
    logit_bias=None,
    draft=None,
    cache_scope: str = "",
) -> Iterator[Token | Done]:
    """Yield a Token per sampled token and a final Done.

    Stops on the model's end-of-generation tokens (done_reason "stop"), on a stop string (never partly
    emitted; "stop"), at num_predict or when prompt + output reach num_ctx ("length"). A prompt longer
    than num_ctx raises ContextLengthExceeded before anything is yielded. `cancelled` is checked between
    prefill chunks (raising Cancelled) and before each decode step (ending without Done). `constraint`
    (localrt.structured) limits each step to tokens that keep the output valid for a `format`. `logprobs` (None:
    off) and `logit_bias` as `Batcher.add` takes them; `draft`: a draft_model.ModelDrafter beside the model, for
    requests whose draft_model option names it; `cache_scope`: as `Batcher.add` takes it.
    """
    batcher = Batcher(model, reuse_min=1, drafter=draft)  # the caller chose the slot: reuse whatever prefix it holds
    seq = batcher.add(
        ids,
        options,
        slot=slot,
        cancelled=cancelled,
        constraint=constraint,
        load_duration_ns=load_duration_ns,
        logprobs=logprobs,
        logit_bias=logit_bias,
        cache_scope=cache_scope,
    )
    try:
        while not seq.finished:
            for _, events in batcher.step():
                yield from events
        if not seq.prefilled and seq.state == "cancelled":
            raise Cancelled()  # between chunks: the cache holds the evaluated part of the prompt
    finally:
        batcher.close()  # a consumer that stops early leaves the slot's cache consistent
