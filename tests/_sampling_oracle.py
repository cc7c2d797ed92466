"""The exact distribution of sampled token sequences, and how far seeded runs are from it (chi-square, TV).

Shared by the speculative-sampling tests: a sampler chain of top-2 then softmax at a temperature, whose
exact joint distribution over a few tokens follows from the model's own teacher-forced logits."""

from __future__ import annotations

import numpy as np


def top2_probs(model, ids: list[int], temperature: float) -> dict[int, float]:
    """The next token's distribution after top-2 and softmax at the temperature: {token id: probability}."""
    logits = model.logits(ids)[-1].astype(np.float64)
    top = np.argsort(-logits, kind="stable")[:2]
    p = np.exp((logits[top] - logits[top].max()) / temperature)
    return dict(zip(top.tolist(), p / p.sum()))


def exact_joint(model, prompt: list[int], depth: int, temperature: float) -> dict[tuple, float]:
    """{(t1, .., t_depth): probability} of the next depth sampled tokens after prompt."""
    out: dict[tuple, float] = {(): 1.0}
    for _ in range(depth):
        out = {
            seq + (t,): p * q
            for seq, p in out.items()
            for t, q in top2_probs(model, prompt + list(seq), temperature).items()
        }
    return out


def compare(keys: list[tuple], exact: dict[tuple, float]) -> tuple[float, float, dict[tuple, int]]:
    """(chi-square, total variation, counts) of the observed token tuples against the exact distribution; every
    observed tuple must be one the distribution allows."""
    n = len(keys)
    counts: dict[tuple, int] = {}
    for key in keys:
        assert key in exact, key
        counts[key] = counts.get(key, 0) + 1
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    return chi2, tv, counts
