"""/v1/rerank (and llama-server's other names for it) against a real daemon started here: the tiny reranker of
fixtures.encoders created from its GGUF through /api/blobs and /api/create, its replies compared with llama-server's on the
same file (tests/data/bert/rerank_server.json), top_n, return_documents, TEI's shape, keep_alive, and the 400s."""

from __future__ import annotations

import hashlib
import json
import logging

from fixtures import encoders
import httpx
import numpy as np
import pytest
from _daemon_fakes import create_from_file, real_daemon

import gguf_io

RERANKER, EMBEDDER = "tiny-rerank", "tiny-embed"
SERVED = json.loads((encoders.DATA / "rerank_server.json").read_text())["plain"]
BODY = {"model": RERANKER, "query": encoders.RERANK_QUERY, "documents": encoders.RERANK_DOCS}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    files = tmp_path_factory.mktemp("files")
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        create_from_file(srv.url, RERANKER, encoders.write_reranker(files / "rerank.gguf"))
        create_from_file(srv.url, EMBEDDER, encoders.write(files / "embed.gguf"))
        yield srv


def _post(daemon, body: dict, route: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(daemon.url + route, json=body, timeout=120)


def test_results_equal_llama_servers(daemon):
    r = _post(daemon, BODY)
    assert r.status_code == 200, r.text
    got, want = r.json(), SERVED["jina"]
    assert got["model"] == RERANKER and got["object"] == "list"
    assert got["usage"] == want["usage"]  # the same tokens: [CLS] query [SEP] document [SEP] per document
    assert [x["index"] for x in got["results"]] == [x["index"] for x in want["results"]]
    for g, w in zip(got["results"], want["results"]):
        assert set(g) == {"index", "relevance_score"} and abs(g["relevance_score"] - w["relevance_score"]) < 2e-3


def test_top_n_and_return_documents(daemon):
    r = _post(daemon, {**BODY, "top_n": 3, "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == [x["index"] for x in SERVED["jina"]["results"][:3]]
    assert all(x["document"] == {"text": encoders.RERANK_DOCS[x["index"]]} for x in results)
    assert _post(daemon, {**BODY, "top_n": 0}).json()["results"] == []


@pytest.mark.parametrize("route", ["/rerank", "/v1/reranking", "/reranking"])
def test_llama_servers_other_routes_and_the_tei_shape(daemon, route):
    r = _post(
        daemon,
        {"model": RERANKER, "query": encoders.RERANK_QUERY, "texts": encoders.RERANK_DOCS, "return_text": True},
        route,
    )
    assert r.status_code == 200, r.text
    got, want = r.json(), SERVED["tei"]
    assert [(x["index"], x["text"]) for x in got] == [(x["index"], x["text"]) for x in want]
    assert all(abs(g["score"] - w["score"]) < 2e-3 for g, w in zip(got, want))


def test_keep_alive_zero_unloads_after_the_request(daemon):
    assert _post(daemon, {**BODY, "keep_alive": 0}).status_code == 200
    names = {m["name"] for m in httpx.get(daemon.url + "/api/ps", timeout=30).json()["models"]}
    assert not any(n.startswith(RERANKER) for n in names)


def test_unknown_fields_are_warned_by_name(daemon, caplog):
    with caplog.at_level(logging.WARNING, logger="localrt.server"):
        assert _post(daemon, {**BODY, "rank_fields": ["text"]}).status_code == 200
    assert any("rank_fields" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": None}, "model is required"),
        ({"query": None}, "query is required"),
        ({"documents": []}, "non-empty array of strings"),
        ({"documents": ["w1", 7]}, r"documents[1] must be a string"),
        ({"top_n": -1}, "top_n must be 0 or more"),
        ({"top_n": "3"}, "top_n must be an integer"),
        ({"documents": ["w1"] * 10_000}, "at most 1000"),
        ({"model": EMBEDDER}, f"model {EMBEDDER} is not a reranker"),
        (
            {"documents": ["w1", " ".join(["w2"] * 70)]},
            "documents[1]: the query and document are more than the context",
        ),
    ],
)
def test_bad_requests_are_400s_naming_the_problem(daemon, change, message):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    r = _post(daemon, body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_an_unknown_model_is_a_404(daemon):
    assert _post(daemon, {**BODY, "model": "no-such-reranker"}).status_code == 404


def test_creating_a_rank_file_without_its_head_is_a_400_naming_the_tensors(daemon, tmp_path):
    with gguf_io.open(encoders.write_reranker(tmp_path / "r.gguf")) as f:
        md = {k: v for k, v in f.metadata.items() if not k.startswith("GGUF.")}
        tensors = [(n, t.ggml_type, t.shape, np.array(t.data)) for n, t in f.tensors.items() if not n.startswith("cls")]
    gguf_io.write(tmp_path / "headless.gguf", md, tensors)
    data = (tmp_path / "headless.gguf").read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.post(f"{daemon.url}/api/blobs/{digest}", content=data, timeout=30).status_code in (200, 201)
    r = httpx.post(
        daemon.url + "/api/create", json={"model": "headless", "files": {"m.gguf": digest}, "stream": False}, timeout=60
    )
    assert r.status_code == 400 and "cls.output.weight" in r.json()["error"], r.text
