"""Reranking, as llama-server's `/v1/rerank`: a reranker model (a file whose pooling type is 4, rank) scores each
document against the query, one sequence per document, and the reply lists the documents by score.

The sequence is llama-server's `format_prompt_rerank`: the file's rerank template (`tokenizer.chat_template.rerank`,
with `{query}` and `{document}` replaced, tokenized without added specials but parsing special tokens), else the
query's and the document's ids (each tokenized without specials, special-token text as text) joined by the
vocabulary's flags: [BOS] query [EOS] [SEP] document [EOS], each special only where its add_* flag is set and EOS
falling back to SEP when the vocabulary has none. A bert converted from Hugging Face (add_bos, add_eos, no add_sep,
EOS = [SEP]) gives [CLS] query [SEP] document [SEP].

The work runs like an embedding request: through the scheduler (queue, keep_alive, fairness across clients) on the
model's worker, stopped between forwards when the client goes away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import InvalidModel, InvalidRequest, ModelLoadError

# Documents one request may rerank. Each is a forward of up to the context: 1,000 documents of 512 tokens keep a
# small reranker busy for minutes on a CPU, and a bigger list is a client's batching to do (llama-server has no
# bound; Cohere's API allows 1,000 documents).
MAX_DOCUMENTS = 1000
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


@dataclass
class RerankRequest:
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None  # None: every document
    return_documents: bool = False  # each result carries its document's text
    tei: bool = False  # Hugging Face TEI's shape: "texts" in, a bare list of {index, score[, text]} out
    keep_alive: float | str | None = None
    options: dict = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Specials:
    """What llama-server's rerank prompt reads from the vocabulary: the special ids and the add_* flags."""

    bos: int | None
    eos: int | None
    sep: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool

    @classmethod
    def of(cls, tok) -> Specials:
        return cls(tok.bos_id, tok.eos_id, tok.sep_id, tok.add_bos, tok.add_eos, tok.add_sep)


def pair_ids(query: list[int], document: list[int], sp: Specials) -> list[int]:
    """[BOS] query [EOS] [SEP] document [EOS], each special only where its flag is set; EOS is SEP when the
    vocabulary has no EOS (a bert's). A special the flags ask for and the vocabulary lacks is refused by name
    (llama.cpp would put the invalid id -1 in the sequence)."""
    eos = sp.eos if sp.eos is not None else sp.sep

    def need(tid: int | None, what: str) -> int:
        if tid is None:
            raise InvalidModel(
                f"the model's rerank prompt needs a {what} token (tokenizer.ggml.add_{what}_token) "
                "but its vocabulary has none"
            )
        return tid

    out: list[int] = [need(sp.bos, "bos")] if sp.add_bos else []
    out += query
    if sp.add_eos:
        out.append(need(eos, "eos"))
    if sp.add_sep:
        out.append(need(sp.sep, "sep"))
    out += document
    if sp.add_eos:
        out.append(need(eos, "eos"))
    return out


def template_text(template: str, query: str, document: str) -> str:
    """The rerank template with {query} replaced, then {document} (in what the first replacement left), as
    llama-server replaces them."""
    return template.replace("{query}", query).replace("{document}", document)


def rerank_inputs(
    tok, metadata: Mapping, query: str, documents: list[str], limit: int, cancelled: threading.Event | None = None
) -> list[list[int]]:
    """The token ids of each (query, document) sequence; one longer than `limit` is refused naming the document
    (llama-server refuses it too: it never truncates). Each text is tokenized only as far as the limit reaches."""
    template = metadata.get(RERANK_TEMPLATE_KEY)
    if template is not None and not isinstance(template, str):
        raise InvalidModel(f"{RERANK_TEMPLATE_KEY} must be a string")
    q: list[int] = []
    if template is None:
        q = tok.encode(query, add_special=False, parse_special=False, limit=limit)
        if len(q) > limit:
            raise InvalidRequest(f"the query is more than the context length of {limit} tokens")
        sp = Specials.of(tok)
    out = []
    for i, doc in enumerate(documents):
        if cancelled is not None and cancelled.is_set():
            break
        if template is None:
            ids = pair_ids(q, tok.encode(doc, add_special=False, parse_special=False, limit=limit), sp)
        else:
            ids = tok.encode(template_text(template, query, doc), add_special=False, parse_special=True, limit=limit)
        if len(ids) > limit:
            raise InvalidRequest(
                f"documents[{i}]: the query and document are more than the context length of "
                f"{limit} tokens together (shorten the document, or raise num_ctx up to the model's)"
            )
        if not ids:
            raise InvalidRequest(f"documents[{i}]: the query and document give no tokens to score")
        out.append(ids)
    return out


def check_reranker(model, name: str) -> None:
    """A model whose file's pooling type is not rank (4) is refused, as llama-server refuses to rerank with it."""
    meta = getattr(model, "metadata", None) or {}
    arch = str(meta.get("general.architecture", ""))
    if getattr(model, "pooling", None) != "rank" and meta.get(f"{arch}.pooling_type") != 4:
        raise InvalidRequest(f"model {name} is not a reranker (its file's {arch}.pooling_type is not 4, rank)")
    if not hasattr(model, "rank_many"):
        raise InvalidRequest(f"model {name} is a {arch} reranker, which this runtime cannot run yet")


def run(service, req: RerankRequest, cancel=None) -> dict:
    """The scores of req.documents in order, through the service's scheduler as an embedding request runs:
    {"scores": [float], "prompt_tokens": n, "total_duration": ns, "load_duration": ns}. `cancel` (a jobs.Cancel)
    stops the work between forwards or withdraws the queued request; the call then raises Cancelled."""
    rec = service.record(req.model)
    name = rec.name.display
    opts = service.options(rec, req.options)
    t0 = time.perf_counter_ns()

    def work(loaded, _req, cancelled: threading.Event) -> Iterator[dict]:
        model = loaded.model
        check_reranker(model, req.model)  # the name as the request gave it
        limit = min(opts.num_ctx, model.num_ctx)  # the request's context, whatever the model was loaded with
        if model.tokenizer is None:
            raise ModelLoadError(f"model {req.model} has no usable tokenizer")
        seqs = rerank_inputs(model.tokenizer, model.metadata, req.query, req.documents, limit, cancelled)
        if cancelled.is_set():
            return
        scores = model.rank_many(seqs, cancelled)
        if len(scores) < len(seqs):  # cancelled between forwards
            return
        yield {"scores": scores, "count": sum(map(len, seqs)), "load": loaded.take_load_ns()}

    result = service._one_result(name, opts, req.keep_alive, work, rec, cancel)  # stopped between forwards
    return {
        "scores": result["scores"],
        "prompt_tokens": result["count"],
        "total_duration": time.perf_counter_ns() - t0,
        "load_duration": result["load"],
    }
