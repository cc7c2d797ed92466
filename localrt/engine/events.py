"""Events that `generate` yields. CLI printing, NDJSON, SSE and non-streaming replies all derive from them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under the model's own distribution (log-softmax of its raw logits)."""

    id: int
    text: str  # the token's piece, invalid UTF-8 as U+FFFD; `bytes` holds the exact bytes
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class Logprob:
    """A generated token's log-probability and the most likely tokens at its position (most likely first)."""

    token: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Token:
    """One sampled token. `text` is what may be shown now: complete UTF-8 only, never part of a stop string.

    `logprobs` (only when asked for): the entries of the generated tokens whose text begins in what has been shown
    so far and was not in an earlier event, so that they travel with their text (a token held back by a possible
    stop string comes with the event that shows it; the tokens of a stop string never come)."""

    token: int
    text: str
    done: bool = False
    logprobs: tuple[Logprob, ...] = ()


@dataclass(frozen=True)
class Done:
    """The last event of a generation. Durations are integer nanoseconds, as Ollama reports them."""

    done_reason: str  # "stop" | "length" | "load" | "unload"
    prompt_eval_count: int = 0  # the whole prompt, as Ollama counts it, cached prefix included
    prompt_cached_count: int = 0  # of those, the tokens reused from the cache (not evaluated again)
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    load_duration: int = 0
    total_duration: int = 0
    text: str = ""  # text held back until the end (e.g. a partial stop-string match that did not complete)
    context: list[int] = field(default_factory=list)  # prompt + generated ids, for /api/generate's `context`
    # Prompt-lookup speculation (localrt.engine.speculative): tokens drafted and, of those, accepted (emitted as
    # drafted); None when the request switched it off (draft_num_predict 0).
    draft_count: int | None = None
    draft_accepted_count: int | None = None
    done: bool = True
    logprobs: tuple[Logprob, ...] = ()  # entries that travel with `text` (see Token)
