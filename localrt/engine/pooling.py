"""How an embedding is pooled from a model's per-token hidden states, as the file says (`{arch}.pooling_type`,
llama.cpp's enum): 0 none, 1 mean, 2 cls (the first token), 3 last (the last token: qwen3-embedding), 4 rank (a
reranker's classification head: not an embedding). A file without the key is mean-pooled, as this runtime has
always embedded decoder models (llama.cpp would give per-token vectors, which no embedding endpoint returns)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InvalidRequest, ModelLoadError

KINDS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def pooling_type(metadata: Mapping, arch: str) -> str:
    """The file's pooling type by name; "mean" when it has none. A value outside the enum is a load error naming
    the key."""
    key = f"{arch}.pooling_type"
    raw = metadata.get(key)
    if raw is None:
        return "mean"
    if isinstance(raw, bool) or not isinstance(raw, (int, np.integer)) or int(raw) not in KINDS:
        raise ModelLoadError(f"{key} is {str(raw)[:40]}, not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    return KINDS[int(raw)]


def pool(hidden: np.ndarray, kind: str) -> np.ndarray:
    """hidden (n_tok, n_embd) float32 -> (n_embd,) float32 by `kind`."""
    if kind == "rank":
        raise InvalidRequest(
            "this model is a reranker (pooling type rank): it scores pairs with /v1/rerank, it does not embed"
        )
    if kind == "cls":
        return hidden[0].astype(np.float32, copy=True)
    if kind == "last":
        return hidden[-1].astype(np.float32, copy=True)
    # mean, and none: a vector per token is not what an embedding endpoint returns, so their mean is
    return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)


def classifier_pooling(metadata: Mapping, arch: str) -> str:
    """What a reranker's classification head reads (`{arch}.classifier.pooling_type`, as llama.cpp): "mean" of the
    tokens for 1 (mean), else "cls", the first token ([CLS]); llama.cpp treats every other value as cls."""
    key = f"{arch}.classifier.pooling_type"
    raw = metadata.get(key)
    if raw is None:
        return "cls"
    if isinstance(raw, bool) or not isinstance(raw, (int, np.integer)) or int(raw) not in KINDS:
        raise ModelLoadError(f"{key} is {str(raw)[:40]}, not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    return "mean" if int(raw) == 1 else "cls"
