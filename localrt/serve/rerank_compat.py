"""llama-server's rerank API (`/v1/rerank`, `/rerank`, `/v1/reranking`, `/reranking`): the request body, checked, and
the reply, in the Jina / Cohere shape, or Hugging Face TEI's when the documents come as `texts` (llama-server's rule).

Jina/Cohere: {"model", "query", "documents": [str], "top_n", "return_documents"} ->
{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"}, "results": [{"index", "relevance_score"
[, "document": {"text"}]}]}, the results by score, highest first, at most top_n of them. TEI: {"query", "texts",
"return_text"} -> [{"index", "score"[, "text"]}]. Scores are the model's raw outputs, as llama-server's.
"""

from __future__ import annotations

from typing import Any

from ..api.types import Fields
from ..errors import InvalidRequest
from ..runtime.rerank import MAX_DOCUMENTS, RerankRequest


def rerank_request(body: dict) -> RerankRequest:
    f = Fields(body)
    model = f.str("model", required=True, msg="model is required")
    if not model:
        raise InvalidRequest("model is required")
    query = f.any("query")
    if query is None:
        raise InvalidRequest("query is required")
    if not isinstance(query, str):
        raise InvalidRequest("query must be a string")
    if "documents" in body and "texts" in body:
        raise InvalidRequest("give the documents as documents or as texts (TEI), not both")
    tei = "texts" in body
    key = "texts" if tei else "documents"
    docs = f.any(key)
    if not isinstance(docs, list) or not docs:
        raise InvalidRequest(f"{key} must be a non-empty array of strings")
    if len(docs) > MAX_DOCUMENTS:
        raise InvalidRequest(f"{key} has {len(docs)} entries; at most {MAX_DOCUMENTS} are reranked in one request")
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise InvalidRequest(f"{key}[{i}] must be a string, got {_kind(d)}")
    top_n = f.any("top_n")
    if top_n is not None:
        if isinstance(top_n, bool) or not (isinstance(top_n, int) or isinstance(top_n, float) and top_n.is_integer()):
            raise InvalidRequest("top_n must be an integer")
        if top_n < 0:
            raise InvalidRequest(f"top_n must be 0 or more, got {int(top_n)}")
        top_n = int(top_n)
    back = f.bool("return_text" if tei else "return_documents", False)
    req = RerankRequest(
        model=model,
        query=query,
        documents=list(docs),
        top_n=top_n,
        return_documents=bool(back),
        tei=tei,
        keep_alive=f.any("keep_alive"),
        options=f.obj("options") or {},
    )
    req.ignored = f.finish()
    return req


def _kind(v: Any) -> str:
    return {dict: "an object", list: "an array", bool: "a boolean", type(None): "null"}.get(type(v), "a number")


def rerank_reply(req: RerankRequest, native: dict) -> Any:
    """The results by score, highest first (ties in the documents' order), the first top_n of them."""
    scores = native["scores"]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # a stable sort: equal scores keep their order
    top = order if req.top_n is None else order[: req.top_n]
    if req.tei:
        return [
            {"index": i, "score": scores[i], **({"text": req.documents[i]} if req.return_documents else {})}
            for i in top
        ]
    results = [
        {
            "index": i,
            "relevance_score": scores[i],
            **({"document": {"text": req.documents[i]}} if req.return_documents else {}),
        }
        for i in top
    ]
    n = int(native["prompt_tokens"])
    return {"model": req.model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}
