"""Reranking against llama.cpp: the tiny reranker of fixtures.encoders (bert + classification head, pooling_type 4) scored as
llama.cpp scores it (its head outputs, tests/data/bert/rerank.npz), the prompt llama-server builds for a query and
a document (its /v1/rerank replies, rerank_server.json, agree score by score), the request and reply shapes, and
the refusals. References: bench/make_bert_reference.py rerank."""

from __future__ import annotations

import json

from fixtures import encoders
import numpy as np
import pytest

from localrt.engine.loader import load_model
from localrt.errors import InvalidModel, InvalidRequest
from localrt.runtime import rerank
from localrt.runtime.rerank import (
    MAX_DOCUMENTS,
    RerankRequest,
    Specials,
    pair_ids,
    template_text,
)
from localrt.serve.rerank_compat import rerank_reply, rerank_request

CASES = {  # reference label -> (wtype, write_reranker keywords, absolute tolerance on the scores)
    "f32": (encoders.F32, {}, 2e-3),
    "f16": (encoders.F16, {}, 3e-3),
    "q8_0": (encoders.Q8_0, {}, 3e-2),
    "f32_output": (encoders.F32, {"head": "output"}, 2e-3),
    "f32_dense": (encoders.F32, {"head": "dense"}, 2e-3),
    "f32_mean": (encoders.F32, {"classifier_pooling": 1}, 2e-3),
    "f32_labels": (encoders.F32, {"labels": ["no", "yes"]}, 2e-3),
}
SERVED = json.loads((encoders.DATA / "rerank_server.json").read_text())


@pytest.fixture
def reranker(tmp_path):
    model = load_model(encoders.write_reranker(tmp_path / "r.gguf"))
    yield model
    model.close()


@pytest.mark.parametrize("label", CASES)
def test_head_scores_equal_llamacpp(tmp_path, label):
    wtype, kw, tol = CASES[label]
    ref = np.load(encoders.DATA / "rerank.npz")
    pairs = [[int(t) for t in p if t >= 0] for p in ref["pairs"]]
    model = load_model(encoders.write_reranker(tmp_path / "r.gguf", wtype, **kw), tokenizer=False)
    try:
        assert model.pooling == "rank" and model.config.n_cls_out == ref[label].shape[1]
        scores = model.rank_many(pairs)
        np.testing.assert_allclose(scores, ref[label][:, 0], atol=tol)  # llama-server's score: the first output
        for ids, want in zip(pairs, ref[label]):  # every output of the head, each sequence alone
            got = model.arch.rank(
                model.backend,
                model.config,
                model.weights,
                model.hidden(ids),
                [len(ids)],
                mean=model.rank_pooling == "mean",
            )
            np.testing.assert_allclose(got[0], want, atol=tol)
    finally:
        model.close()


@pytest.mark.parametrize("served", ["plain", "template"])
def test_prompts_and_scores_equal_llama_servers(tmp_path, served):
    """Tokenized as llama-server tokenizes them (its usage counts the same tokens) and scored as it scores them:
    plain, [CLS] query [SEP] document [SEP]; with a rerank template, the template's text."""
    template = encoders.RERANK_TEMPLATE if served == "template" else None
    model = load_model(encoders.write_reranker(tmp_path / "r.gguf", template=template))
    try:
        seqs = rerank.rerank_inputs(model.tokenizer, model.metadata, encoders.RERANK_QUERY, encoders.RERANK_DOCS, 64)
        want = SERVED[served]["jina"]
        assert sum(map(len, seqs)) == want["usage"]["prompt_tokens"]
        scores = model.rank_many(seqs)
        for r in want["results"]:
            assert abs(scores[r["index"]] - r["relevance_score"]) < 2e-3
        assert [r["index"] for r in want["results"]] == sorted(range(len(scores)), key=lambda i: -scores[i])
    finally:
        model.close()


def test_the_plain_prompt_is_cls_query_sep_document_sep(reranker):
    seqs = rerank.rerank_inputs(reranker.tokenizer, reranker.metadata, "w3 w7c2", ["w5", "w4 [SEP]"], 64)

    def w(i):  # "\u2581wN" is id 5 + N
        return 5 + i

    def c(i):  # "cN" is id 65 + N
        return 65 + i

    assert seqs[0] == [2, w(3), w(7), c(2), 3, w(5), 3]
    assert seqs[1][:7] == [2, w(3), w(7), c(2), 3, w(4), 1]  # "[SEP]" in a document is text: [UNK]s, no special


SP = {"bos": 2, "eos": 3, "sep": 4}


@pytest.mark.parametrize(
    "flags, want",
    [
        ({"add_bos": True, "add_eos": True, "add_sep": False}, [2, 10, 11, 3, 20, 3]),  # bert from HF: eos = [SEP]
        ({"add_bos": True, "add_eos": False, "add_sep": True}, [2, 10, 11, 4, 20]),  # llama.cpp's WPM defaults
        (
            {"add_bos": True, "add_eos": True, "add_sep": True},
            [2, 10, 11, 3, 4, 20, 3],
        ),  # roberta: <s> q </s></s> d </s>
        ({"add_bos": False, "add_eos": False, "add_sep": False}, [10, 11, 20]),
        ({"add_bos": False, "add_eos": True, "add_sep": False, "eos": None}, [10, 11, 4, 20, 4]),  # no eos: sep instead
    ],
)
def test_pair_ids_follow_the_vocabularys_flags(flags, want):
    sp = Specials(**{**SP, **flags})
    assert pair_ids([10, 11], [20], sp) == want


def test_a_special_the_flags_ask_for_and_the_vocabulary_lacks_is_refused_by_name():
    with pytest.raises(InvalidModel, match="bos"):
        pair_ids([10], [20], Specials(None, 3, 4, True, False, False))
    with pytest.raises(InvalidModel, match="eos"):
        pair_ids([10], [20], Specials(2, None, None, True, True, False))


def test_template_text_replaces_query_then_document():
    assert template_text("<q>{query}</q><d>{document}</d>", "a", "b") == "<q>a</q><d>b</d>"
    assert template_text("{query}|{document}", "{document}", "x") == "x|x"  # llama-server's order of replacement


def test_a_document_longer_than_the_context_is_refused_naming_it(reranker):
    long_doc = " ".join(["w1"] * 70)
    with pytest.raises(InvalidRequest, match=r"documents\[1\].*context length of 64"):
        rerank.rerank_inputs(reranker.tokenizer, reranker.metadata, "w2", ["w3", long_doc], 64)
    with pytest.raises(InvalidRequest, match="query"):
        rerank.rerank_inputs(reranker.tokenizer, reranker.metadata, long_doc, ["w3"], 64)


def test_batched_scores_equal_each_alone(tmp_path):
    model = load_model(encoders.write_reranker(tmp_path / "r.gguf"), tokenizer=False, num_batch=16)
    try:
        pairs = encoders.RERANK_PAIRS + [[2] + list(range(5, 40)) + [3, 9, 3]]
        together = model.rank_many(pairs)
        assert together == pytest.approx([model.rank_many([p])[0] for p in pairs], abs=1e-5)
    finally:
        model.close()


def test_a_rank_file_without_a_head_is_refused_by_name(tmp_path):
    path = tmp_path / "headless.gguf"
    encoders.write_reranker(path)
    with pytest.raises(InvalidModel, match="cls.output.weight"):
        load_model(
            _drop(path, tmp_path / "bad.gguf", ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"))
        )


def test_an_embedding_model_does_not_rank_and_a_reranker_does_not_embed(tmp_path, reranker):
    embedder = load_model(encoders.write(tmp_path / "e.gguf"), tokenizer=False)
    try:
        with pytest.raises(InvalidRequest, match="not a reranker"):
            embedder.rank_many([[2, 3]])
        with pytest.raises(InvalidRequest, match="not a reranker"):
            rerank.check_reranker(embedder, "tiny-embed")
    finally:
        embedder.close()
    with pytest.raises(InvalidRequest, match="reranker"):
        reranker.embed([2, 3])
    rerank.check_reranker(reranker, "tiny-rerank")


def _drop(src, dst, names):
    import gguf_io

    with gguf_io.open(src) as f:
        md = {k: v for k, v in f.metadata.items() if not k.startswith("GGUF.")}
        tensors = [(n, t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items() if n not in names]
    gguf_io.write(dst, md, tensors)
    return dst


# ---- the request and the reply ------------------------------------------------------------------------------

BODY = {"model": "m", "query": "q", "documents": ["a", "b", "c"]}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": None}, "model is required"),
        ({"query": None}, "query is required"),
        ({"query": 5}, "query must be a string"),
        ({"documents": []}, "non-empty array of strings"),
        ({"documents": None}, "non-empty array of strings"),
        ({"documents": "a"}, "non-empty array of strings"),
        ({"documents": ["a", 2]}, r"documents\[1\] must be a string"),
        ({"documents": ["a", {"text": "b"}]}, r"documents\[1\] must be a string, got an object"),
        ({"documents": ["d"] * (MAX_DOCUMENTS + 1)}, f"at most {MAX_DOCUMENTS}"),
        ({"top_n": -1}, "top_n must be 0 or more"),
        ({"top_n": "2"}, "top_n must be an integer"),
        ({"top_n": 1.5}, "top_n must be an integer"),
        ({"top_n": True}, "top_n must be an integer"),
        ({"return_documents": "yes"}, "return_documents must be a boolean"),
        ({"texts": ["a"]}, "not both"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_message(change, message):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    with pytest.raises(InvalidRequest, match=message):
        rerank_request(body)


def test_the_request_reads_every_known_field_and_lists_the_unknown():
    req = rerank_request(
        {
            **BODY,
            "top_n": 2.0,
            "return_documents": True,
            "keep_alive": "1m",
            "options": {"num_ctx": 32},
            "rank_fields": ["x"],
        }
    )
    assert (req.top_n, req.return_documents, req.tei, req.keep_alive) == (2, True, False, "1m")
    assert req.options == {"num_ctx": 32} and req.ignored == ["rank_fields"]
    tei = rerank_request({"model": "m", "query": "q", "texts": ["a"], "return_text": True})
    assert tei.tei and tei.documents == ["a"] and tei.return_documents


def _req(**kw) -> RerankRequest:
    return RerankRequest(model="m", query="q", documents=["a", "b", "c", "d"], **kw)


NATIVE = {"scores": [0.5, 2.0, -1.0, 0.5], "prompt_tokens": 17}


def test_the_reply_lists_results_by_score_as_llama_server():
    out = rerank_reply(_req(), NATIVE)
    assert out["model"] == "m" and out["object"] == "list"
    assert out["usage"] == {"prompt_tokens": 17, "total_tokens": 17}
    assert out["results"] == [
        {"index": 1, "relevance_score": 2.0},
        {"index": 0, "relevance_score": 0.5},
        {"index": 3, "relevance_score": 0.5},
        {"index": 2, "relevance_score": -1.0},
    ]


@pytest.mark.parametrize("top_n, n", [(None, 4), (0, 0), (2, 2), (4, 4), (99, 4)])
def test_top_n_keeps_the_best(top_n, n):
    results = rerank_reply(_req(top_n=top_n), NATIVE)["results"]
    assert [r["index"] for r in results] == [1, 0, 3, 2][:n]


def test_return_documents_and_the_tei_shape():
    assert rerank_reply(_req(return_documents=True, top_n=1), NATIVE)["results"] == [
        {"index": 1, "relevance_score": 2.0, "document": {"text": "b"}}
    ]
    assert rerank_reply(_req(tei=True, top_n=2), NATIVE) == [{"index": 1, "score": 2.0}, {"index": 0, "score": 0.5}]
    assert rerank_reply(_req(tei=True, return_documents=True, top_n=1), NATIVE) == [
        {"index": 1, "score": 2.0, "text": "b"}
    ]
