"""Embeddings: /api/embed, /v1/embeddings and the legacy /api/embeddings, scheduled as a generation is (queue,
keep_alive, fairness across clients). An encoder embeds its inputs in shared forwards; a decoder embeds each on its
own, holding the model alone (its BatchDriver's slot 0)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import numpy as np

from ..api.types import EmbedRequest
from ..errors import ContextLengthExceeded, InvalidRequest
from .loaded import Loaded, unloads
from .sampling_extras import COUNT_UPTO


def run(service, req: EmbedRequest, cancel=None) -> dict:
    """/api/embed and its /v1 and legacy shapes; `cancel` stops it between inputs (Service._one_result)."""
    rec = service.record(req.model, create_builtin=not unloads(req.keep_alive, req.inputs))
    name = rec.name.display
    opts = service.options(rec, req.options)
    t0 = time.perf_counter_ns()
    if not req.inputs:
        list(service._load_or_unload(name, opts, req.keep_alive, lambda why: {}))
        return {"model": req.model, "embedding": []} if req.legacy else {"model": req.model, "embeddings": []}

    def work(loaded: Loaded, _req, cancelled: threading.Event) -> Iterator[dict]:
        model = loaded.model
        limit = min(opts.num_ctx, model.num_ctx)  # the request's context, whatever the model was loaded with
        vectors, count, batched = [], 0, []
        for text in req.inputs:
            if cancelled.is_set():
                return
            # /v1 ids: embed checks the vocabulary; a text is tokenized only as far as the context reaches
            ids = model.tokenize(text, limit=COUNT_UPTO * limit) if isinstance(text, str) else list(text)
            if len(ids) > limit:
                if not req.truncate:  # /v1 (as OpenAI) and /api/embed with "truncate": false
                    raise ContextLengthExceeded(len(ids), limit, counted_all=len(ids) <= COUNT_UPTO * limit)
                ids = ids[:limit]
            count += len(ids)
            if hasattr(model, "embed_many"):  # an encoder: the inputs share forwards, after this loop
                batched.append(ids)
            elif loaded.driver is None:
                vectors.append(np.asarray(model.embed(ids), dtype=np.float64))
            else:
                with loaded.driver.exclusive():  # embed uses slot 0: never beside running sequences
                    vectors.append(np.asarray(model.embed(ids), dtype=np.float64))
        if batched:
            vectors = [np.asarray(v, dtype=np.float64) for v in model.embed_many(batched)]
        yield {"vectors": vectors, "count": count, "load": loaded.take_load_ns()}

    result = service._one_result(name, opts, req.keep_alive, work, rec, cancel)
    if req.legacy:
        return {"embedding": [float(x) for x in result["vectors"][0]]}
    embeddings = [_normalize(v, req.dimensions) for v in result["vectors"]]
    return {
        "model": req.model,
        "embeddings": embeddings,
        "total_duration": time.perf_counter_ns() - t0,
        "load_duration": result["load"],
        "prompt_eval_count": result["count"],
    }


def _normalize(v: np.ndarray, dims: int | None) -> list[float]:
    if dims is not None:
        if dims > len(v):
            raise InvalidRequest(f"dimensions must be at most {len(v)}, got {dims}")
        v = v[:dims]
    norm = float(np.linalg.norm(v))
    return [float(x) for x in (v / norm if norm > 0 else v)]
