"""A draft model through a real daemon (issue 15) on tiny random-weight models.

A model created with `PARAMETER draft_model` (the create API's parameters) is loaded with its draft beside it
and answers greedy requests with the same text as without speculation, the final reply carrying the draft
counts; the request option names a draft model too. A draft whose tokenizer differs (its EOS id) and one that
is not in the store are 400s naming the draft model, and the daemon keeps serving afterwards.
"""

from __future__ import annotations

import httpx
import pytest

from _daemon_fakes import create_from_file, make_config
from fixtures.decoders import small, write_model
from _hostile_gguf import rewrite
from localrt.runtime.service import Service
from localrt.serve.daemon import BackgroundServer


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    write_model(root / "target.gguf", small(seed=3))
    write_model(root / "draft.gguf", small(seed=11, n_layer=1, n_ff=64))
    rewrite(root / "draft.gguf", root / "odd.gguf", meta={"tokenizer.ggml.eos_token_id": 5})
    conf = make_config(tmp_path_factory.mktemp("models"))
    service = Service(conf)
    try:
        with BackgroundServer(service, conf) as srv:
            for name in ("target", "draft", "odd"):
                create_from_file(srv.url, name, root / f"{name}.gguf")
            r = httpx.post(
                srv.url + "/api/create",
                json={"model": "paired", "from": "target", "stream": False, "parameters": {"draft_model": "draft"}},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            yield srv
    finally:
        service.close()


def _generate(srv, name: str, **options) -> httpx.Response:
    body = {
        "model": name,
        "prompt": "the the the",
        "raw": True,
        "stream": False,
        "options": {"num_predict": 16, "num_ctx": 64, "temperature": 0, **options},
    }
    return httpx.post(srv.url + "/api/generate", json=body, timeout=120)


def test_a_modelfile_draft_model_drafts_and_keeps_the_text(daemon):
    plain = _generate(daemon, "target", draft_num_predict=0)
    assert plain.status_code == 200, plain.text
    paired = _generate(daemon, "paired")
    assert paired.status_code == 200, paired.text
    got, want = paired.json(), plain.json()
    # Greedy: the text is the model's; whether it drafted is the planner's call (on models this tiny a draft
    # forward costs as much as the model's, so it mostly does not).
    assert got["response"] == want["response"] and got["eval_count"] == want["eval_count"]
    assert 0 <= got["draft_accepted_count"] <= got["draft_count"]
    shown = httpx.post(daemon.url + "/api/show", json={"model": "paired"}).json()
    assert "draft_model" in shown["parameters"] and "draft" in shown["parameters"]
    by_option = _generate(daemon, "target", draft_model="draft")
    assert by_option.status_code == 200 and by_option.json()["response"] == want["response"]
    # Seeded sampling drafts at a length that follows acceptance only: drafts happen, and the text reproduces.
    seeded = [_generate(daemon, "paired", temperature=2.0, top_k=4, seed=5).json() for _ in range(2)]
    assert seeded[0]["draft_count"] > 0 and seeded[0]["response"] == seeded[1]["response"]


def test_a_mismatched_or_missing_draft_is_a_400(daemon):
    r = _generate(daemon, "target", draft_model="odd")
    assert r.status_code == 400, r.text
    assert "draft_model 'odd' does not share the tokenizer" in r.json()["error"] and "EOS id" in r.json()["error"]
    r = _generate(daemon, "target", draft_model="nowhere")
    assert r.status_code == 400, r.text
    assert "draft_model 'nowhere' not found" in r.json()["error"]
    assert _generate(daemon, "target").status_code == 200  # still serving
