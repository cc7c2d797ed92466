"""Token sampling: a chain of small pure filters built once from Options, then one seeded draw.

Chain order is llama.cpp's (`shared/reference/gguf_spec.md` 11.2, mirostat off):
[logit_bias, /v1 only: `BiasedSampler`] -> penalties -> top_k -> typical_p -> top_p -> min_p -> temperature -> dist. Disabled stages are left out
of the chain when it is built. Temperature comes after the filters, so top_p and min_p see the
untempered distribution.

temperature <= 0 is greedy decoding: the argmax of the model's own logits, as Ollama v0.13's sampler
does it (`sample/samplers.go`); no penalty or filter changes a greedy pick, so `temperature: 0` gives the
same tokens as llama.cpp's greedy reference whatever the other options say. Only a logit_bias (applied to the
logits before the sampler sees them) and a format's mask do.

The draw reproduces llama.cpp's `dist` stage with libstdc++: `std::mt19937(seed)` and
`uniform_real_distribution<double>` built from two 32-bit outputs; probabilities are f32 exponentials
summed in double, and the pick is the first candidate whose running sum reaches u * sum. With the same
seed and logits the tokens equal llama.cpp's (tests/engine/test_sampler.py drives its sampler chain as the oracle).
One known difference: top_p over a whole unsorted vocabulary (top_k 0) sums probabilities in double where
llama.cpp sums in float, so near the cut the two may keep a few tokens more or less.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..api.options import Options, resolve
from ..errors import InvalidRequest

_PARTIAL_MIN = 4096  # below this many candidates a plain argpartition is as fast as anything
_SAMPLE_TARGET = 2048  # elements in the strided sample that guesses the top-k threshold
_TOP_P_HEADS = (256, 4096, 32768)  # candidates sorted first when top_p runs on an unsorted vocabulary
_DRAW_BLOCK = 512  # block length of the two-level running sum in `draw`


@dataclass(frozen=True)
class Candidates:
    """The tokens still in play. `ids` int64 (n,), `logits` float32 (n,); `sorted`: logits descending."""

    ids: np.ndarray
    logits: np.ndarray
    sorted: bool = False


class Rng(Protocol):
    def uniform(self) -> float: ...


class Mt19937:
    """`std::mt19937` + libstdc++'s `uniform_real_distribution<double>(0, 1)`.

    Seeds below 2**32 seed it exactly as `std::mt19937(seed)` does; larger seeds (Ollama's seed is an
    int64) go through mt19937's `init_by_array` with the seed's two 32-bit words, never truncated."""

    def __init__(self, seed: int):
        if not 0 <= seed < 1 << 64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        if seed < 1 << 32:
            self._state = np.random.RandomState(seed)
        else:
            self._state = np.random.RandomState(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32))

    def uniform(self) -> float:
        x0, x1 = self._state.randint(0, 1 << 32, size=2, dtype=np.uint32)
        u = (float(x0) + float(x1) * 4294967296.0) / 18446744073709551616.0
        # generate_canonical may round up to 1.0; libstdc++ then returns the largest double below 1.
        return u if u < 1.0 else math.nextafter(1.0, 0.0)


# ---------------------------------------------------------------------------------------------------
# filters: Candidates -> Candidates, pure


def top_k(c: Candidates, k: int) -> Candidates:
    """Keep the k largest logits, sorted descending (ties: lower id first)."""
    if k <= 0:
        return c
    keep = _top_indices(c.logits, min(k, len(c.logits)))
    return _sorted(c.ids[keep], c.logits[keep])


def typical_p(c: Candidates, p: float) -> Candidates:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy, up to mass p."""
    if p >= 1.0:
        return c
    c = _sort(c)
    probs = _softmax(c.logits)
    with np.errstate(divide="ignore"):
        surprise = -np.log(probs)  # (n,); +inf for p == 0
    entropy = float(np.sum(probs[probs > 0] * surprise[probs > 0]))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    cum = np.cumsum(probs[order], dtype=np.float64)
    last = int(np.searchsorted(cum, p, side="right")) + 1  # first i with cum > p, kept
    keep = order[: min(last, len(order))]
    return Candidates(c.ids[keep], c.logits[keep], sorted=False)


def top_p(c: Candidates, p: float) -> Candidates:
    """Nucleus: keep the smallest prefix (by logit, descending) whose probability mass reaches p."""
    if p >= 1.0:
        return c
    if not c.sorted and len(c.logits) > 1024:
        # Most of the mass sits in a few hundred tokens: sort those first, the whole vocabulary only if needed.
        m = float(np.max(c.logits))
        total = float(np.sum(np.exp(c.logits - m), dtype=np.float64))
        for size in _TOP_P_HEADS:
            head = top_k(c, size)
            cum = np.cumsum(np.exp(head.logits - m), dtype=np.float64) / total
            if cum[-1] >= p:
                return _keep_prefix(head, int(np.searchsorted(cum, p, side="left")) + 1)
    c = _sort(c)
    cum = np.cumsum(_softmax(c.logits), dtype=np.float64)
    return _keep_prefix(c, int(np.searchsorted(cum, p, side="left")) + 1)


def min_p(c: Candidates, p: float) -> Candidates:
    """Keep tokens with probability at least p times the top token's (logit >= max + ln p)."""
    if p <= 0.0:
        return c
    threshold = np.float32(float(np.max(c.logits)) + math.log(p))
    if c.sorted:
        below = np.flatnonzero(c.logits[1:] < threshold)  # the first token always stays
        return _keep_prefix(c, int(below[0]) + 1 if len(below) else len(c.logits))
    keep = np.flatnonzero(c.logits >= threshold)
    return Candidates(c.ids[keep], c.logits[keep], sorted=False)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divide logits by t > 0 (greedy t <= 0 never reaches the chain)."""
    if t == 1.0:
        return c
    return Candidates(c.ids, c.logits / np.float32(t), c.sorted)


def penalize(
    logits: np.ndarray, window: Sequence[int] | np.ndarray, repeat: float, frequency: float, presence: float
) -> np.ndarray:
    """llama.cpp's penalties over the tokens in `window`: a logit > 0 is divided by `repeat`, one <= 0
    multiplied; then `count * frequency + presence` is subtracted. Once per distinct token. Returns a copy."""
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)  # (m,), (m,)
    if len(ids) == 0:
        return logits
    if ids[0] < 0 or ids[-1] >= len(logits):
        raise ValueError(
            f"history has token id {int(ids[0] if ids[0] < 0 else ids[-1])} outside the vocabulary "
            f"of {len(logits)} tokens"
        )
    out = logits.copy()  # (n_vocab,) float32: the caller's logits stay untouched
    v = out[ids]
    v = np.where(v <= 0, v * np.float32(repeat), v / np.float32(repeat))
    out[ids] = v - (counts * frequency + presence).astype(np.float32)
    return out


def logit_bias(logits: np.ndarray, ids: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """OpenAI's logit_bias: `bias` float32 (m,) added to the logits of `ids` int64 (m,) (distinct, in range).
    Returns a copy; -100 all but bans a token, +100 all but forces it."""
    out = logits.copy()  # (n_vocab,) float32: the caller's logits stay untouched
    out[ids] += bias
    return out


def draw(c: Candidates, u: float) -> int:
    """Pick the first candidate whose running probability sum reaches u * sum (candidate order)."""
    p = np.exp(c.logits - np.max(c.logits))  # (n,) float32
    return int(c.ids[_first_reaching(p, u)])


# ---------------------------------------------------------------------------------------------------


class Sampler:
    """Built once per request by `make_sampler`; `sample` is called once per generated token."""

    def __init__(self, options: Options, rng: Rng):
        self.options = options
        self.rng = rng
        self.greedy = options.temperature <= 0
        o = options
        self._last_n = o.num_ctx if o.repeat_last_n == -1 else o.repeat_last_n
        self._penalties = self._last_n > 0 and (
            o.repeat_penalty != 1.0 or o.frequency_penalty != 0.0 or o.presence_penalty != 0.0
        )
        stages: list[Callable[[Candidates], Candidates]] = []
        if o.top_k > 0:
            stages.append(lambda c: top_k(c, o.top_k))
        if o.typical_p < 1.0:
            stages.append(lambda c: typical_p(c, o.typical_p))
        if o.top_p < 1.0:
            stages.append(lambda c: top_p(c, o.top_p))
        if o.min_p > 0.0:
            stages.append(lambda c: min_p(c, o.min_p))
        if o.temperature != 1.0:
            stages.append(lambda c: temperature(c, o.temperature))
        self._stages = stages
        self._all_ids: np.ndarray | None = None  # int64 (n_vocab,), made on first use

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from `logits` float32 (n_vocab,). `history`: the ids seen so far (prompt and
        generated, oldest first); the penalties look at its last repeat_last_n entries."""
        if logits.ndim != 1 or len(logits) == 0:
            raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
        if logits.dtype != np.float32:
            logits = logits.astype(np.float32)
        top = float(np.max(logits))  # NaN anywhere makes the max NaN
        if not math.isfinite(top):
            raise ValueError(f"logits are not usable for sampling (max is {top})")
        if self.greedy:
            return int(np.argmax(logits))
        return draw(self._chain(logits, history), self.rng.uniform())

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from: (ids int64 (m,), probabilities float64 (m,) summing to 1).
        Greedy: the argmax with probability 1. For speculative sampling with a draft model (draft_model.py)."""
        if logits.dtype != np.float32:
            logits = logits.astype(np.float32)
        if self.greedy:
            return np.array([int(np.argmax(logits))], np.int64), np.ones(1)
        c = self._chain(logits, history)
        p = np.exp(c.logits - np.max(c.logits)).astype(np.float64)  # (m,)
        return c.ids, p / p.sum()

    def commit(self, token: int) -> None:
        """A token chosen outside `sample` (speculative sampling) was emitted: nothing to advance here."""

    def _chain(self, logits: np.ndarray, history: Sequence[int]) -> Candidates:
        if self._penalties and len(history):
            logits = penalize(
                logits,
                history[-self._last_n :],
                self.options.repeat_penalty,
                self.options.frequency_penalty,
                self.options.presence_penalty,
            )
        c = Candidates(self._ids(len(logits)), logits)
        for stage in self._stages:
            c = stage(c)
        return c

    def _ids(self, n: int) -> np.ndarray:
        if self._all_ids is None or len(self._all_ids) != n:
            self._all_ids = np.arange(n, dtype=np.int64)
        return self._all_ids


LOGIT_BIAS_MAX = 100.0  # OpenAI's range is -100..100


class BiasedSampler:
    """Adds a logit_bias to the whole vocabulary's logits, then samples with `inner` (a Sampler, or a
    ConstrainedSampler: the bias comes first, as llama.cpp's logit-bias stage is the first of its chain, so
    a greedy pick sees it too and a format's mask still has the last word)."""

    def __init__(self, inner, bias: Mapping[int, float], n_vocab: int) -> None:
        keys = sorted(bias)  # distinct ints: the edge parsed the JSON object's string keys
        ids = np.array(keys, dtype=np.int64)  # (m,)
        if len(ids) and (ids[0] < 0 or ids[-1] >= n_vocab):
            bad = int(ids[0] if ids[0] < 0 else ids[-1])
            raise InvalidRequest(f"logit_bias: token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
        values = np.array([float(bias[k]) for k in keys], dtype=np.float32)  # (m,)
        if not np.all(np.abs(values) <= LOGIT_BIAS_MAX):  # NaN fails too
            raise InvalidRequest(f"logit_bias values must be between -{LOGIT_BIAS_MAX:g} and {LOGIT_BIAS_MAX:g}")
        self.inner, self.ids, self.values = inner, ids, values

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        return self.inner.sample(logit_bias(np.asarray(logits, np.float32), self.ids, self.values), history)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.distribution(logit_bias(np.asarray(logits, np.float32), self.ids, self.values), history)

    def commit(self, token: int) -> None:
        self.inner.commit(token)

    @property
    def rng(self) -> Rng:
        return self.inner.rng


def make_sampler(options: Options | Mapping[str, Any], rng: Rng | None = None) -> Sampler:
    """A Sampler for these options. Without `rng`, one is seeded from options.seed (-1: a random seed)."""
    if not isinstance(options, Options):
        options = resolve(options)
    if rng is None:
        seed = secrets.randbits(32) if options.seed == -1 else options.seed
        rng = Mt19937(seed)
    return Sampler(options, rng)


# ---------------------------------------------------------------------------------------------------
# helpers


def _softmax(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - np.max(logits))  # (n,) float32
    return p / np.sum(p, dtype=np.float64)


def _sorted(ids: np.ndarray, logits: np.ndarray) -> Candidates:
    order = np.lexsort((ids, -logits))  # logit descending, then id ascending: one canonical order
    return Candidates(ids[order], logits[order], sorted=True)


def _sort(c: Candidates) -> Candidates:
    return c if c.sorted else _sorted(c.ids, c.logits)


def _keep_prefix(c: Candidates, n: int) -> Candidates:
    n = max(1, min(n, len(c.ids)))
    return Candidates(c.ids[:n], c.logits[:n], c.sorted)


def _first_reaching(p: np.ndarray, u: float) -> int:
    """First index whose running sum of p (n,) reaches u * sum(p), summed in double.

    A float64 cumsum over a 262k float32 vocabulary costs about 4 ms (one cast per element); block sums
    find the block that holds the answer, and only that block is accumulated one by one."""
    n = len(p)
    if n <= _DRAW_BLOCK * 8:
        cum = np.cumsum(p, dtype=np.float64)  # (n,)
        return min(int(np.searchsorted(cum, u * cum[-1], side="left")), n - 1)
    n_full = n - n % _DRAW_BLOCK
    block_sums = p[:n_full].reshape(-1, _DRAW_BLOCK).sum(axis=1, dtype=np.float64)  # (n_full / B,)
    if n_full < n:
        block_sums = np.append(block_sums, np.sum(p[n_full:], dtype=np.float64))
    block_cum = np.cumsum(block_sums)  # (n_blocks,)
    target = u * block_cum[-1]
    b = min(int(np.searchsorted(block_cum, target, side="left")), len(block_cum) - 1)
    before = block_cum[b - 1] if b > 0 else 0.0
    cum = before + np.cumsum(p[b * _DRAW_BLOCK : (b + 1) * _DRAW_BLOCK], dtype=np.float64)  # (<= B,)
    return min(b * _DRAW_BLOCK + int(np.searchsorted(cum, target, side="left")), n - 1)


def _top_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of x (n,), unordered; among equal values at the cut, the lowest ids.

    A full argpartition of a 262k vocabulary costs about 2 ms; a strided sample guesses a threshold that
    about 4k entries pass, and only those are partitioned. A guess that lets fewer than k through falls
    back to the whole vocabulary, so the answer never depends on the guess."""
    n = len(x)
    if k >= n:
        return np.arange(n)
    pool = None  # int64 (m,) ascending indices that surely hold the top k
    if n >= _PARTIAL_MIN and k * 16 <= n:
        stride = n // _SAMPLE_TARGET
        sample = x[::stride]  # (~2048,) view
        rank = min(len(sample), (4 * k) // stride + 8)  # sample entries above the guessed threshold
        threshold = np.partition(sample, len(sample) - rank)[len(sample) - rank]
        passed = np.flatnonzero(x >= threshold)
        if k <= len(passed) <= 64 * k + 4096:
            pool = passed
    values = x if pool is None else x[pool]  # (m,)
    cut = np.partition(values, len(values) - k)[len(values) - k]  # the k-th largest value
    above = np.flatnonzero(values > cut)
    at_cut = np.flatnonzero(values == cut)[: k - len(above)]
    chosen = np.concatenate((above, at_cut))
    return chosen if pool is None else pool[chosen]
