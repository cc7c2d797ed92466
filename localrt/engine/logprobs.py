"""Log-probabilities of generated tokens (`logprobs` / `top_logprobs`), and their alignment with the shown text.

What is reported is Ollama's choice (`runner/common/logprob.go`, `CalculateLogprobs`, called with the logits the
sampler was given): the log-softmax of the model's raw logits at the position, before penalties, temperature,
top-k/p, logit_bias or a format's mask. So the numbers describe the model, whatever the sampler then did, and a
greedy token is always the first of `top_logprobs`. llama.cpp's server does the same unless asked for
`post_sampling_probs`.

Computed only for a sequence that asked (one pass over the vocabulary for the log-sum-exp, plus a top-k when
`top_logprobs` > 0); the sampled token never depends on it.
"""

from __future__ import annotations

import math

import numpy as np

from .events import Logprob, TokenLogprob
from .sampler import Candidates, top_k

TOP_LOGPROBS_MAX = 20  # OpenAI's and Ollama's bound


def log_softmax_of(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log softmax(logits)[ids] float64 (len(ids),) from float32 logits (n_vocab,); exp in float32, summed in double."""
    m = float(np.max(logits))
    lse = m + math.log(float(np.sum(np.exp(logits - np.float32(m)), dtype=np.float64)))
    return logits[ids].astype(np.float64) - lse


class LogprobTracker:
    """One sequence's entries: computed per sampled token, released with the text they spell.

    A token's entry is released once the shown text reaches past where the token's text begins (`begin`, in
    characters of the decoded output); entries still queued when a stop string ends the generation belong to the
    stop string and are dropped, as Ollama truncates its pending logprobs with the stop string."""

    def __init__(self, tokenizer, top_n: int) -> None:
        if not 0 <= top_n <= TOP_LOGPROBS_MAX:
            raise ValueError(f"top_logprobs must be in 0..{TOP_LOGPROBS_MAX}, got {top_n}")
        self.tokenizer = tokenizer
        self.top_n = top_n
        self._queue: list[tuple[int, Logprob]] = []  # (begin, entry), in generation order
        self._decoded = 0  # characters of decoded output so far
        self._shown = 0  # characters shown so far (emitted by the stop matcher)
        self._ids: np.ndarray | None = None  # int64 (n_vocab,) for top_k, made on first use

    def add(self, logits: np.ndarray, token: int, piece: str) -> None:
        """Queue the entry of `token`, sampled from `logits` float32 (n_vocab,); `piece`: its decoded text."""
        if self.top_n:
            if self._ids is None or len(self._ids) != len(logits):
                self._ids = np.arange(len(logits), dtype=np.int64)
            top = top_k(Candidates(self._ids, logits), self.top_n).ids  # (top_n,) logit descending, ties lower id
            ids = np.concatenate(([token], top))
        else:
            ids = np.array([token], dtype=np.int64)
        lp = log_softmax_of(logits, ids)  # (1 + top_n,)
        entry = Logprob(self._entry(token, lp[0]), tuple(self._entry(int(t), v) for t, v in zip(ids[1:], lp[1:])))
        self._queue.append((self._decoded, entry))
        self._decoded += len(piece)

    def release(self, shown: str) -> tuple[Logprob, ...]:
        """After `shown` more characters went out: the entries whose text now begins in what was shown."""
        self._shown += len(shown)
        n = 0
        while n < len(self._queue) and self._queue[n][0] < self._shown:
            n += 1
        out = tuple(e for _, e in self._queue[:n])
        del self._queue[:n]
        return out

    def finish(self, shown: str, hit: bool) -> tuple[Logprob, ...]:
        """The last entries: those `shown` reveals; every queued one when no stop string ended the output."""
        out = self.release(shown)
        if not hit:
            out += tuple(e for _, e in self._queue)
        self._queue.clear()
        return out

    def _entry(self, token: int, logprob: float) -> TokenLogprob:
        raw = self.tokenizer.token_to_piece(token, special=True) if self.tokenizer is not None else b""
        return TokenLogprob(int(token), raw.decode("utf-8", "replace"), raw, float(logprob))
