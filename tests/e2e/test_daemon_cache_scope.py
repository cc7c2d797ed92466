"""The shared prefix cache does not cross clients (issue 48's leak): a request reuses cached prompt prefixes only of
its own client (the caller's address; X-Forwarded-For from a loopback proxy names the client it forwards for) and
its own cache_salt, unless LOCALRT_PREFIX_CACHE=shared. cached_tokens and the reply show it; the reply's tokens are
the same either way. The real SmolLM2 runs in a real daemon."""

from __future__ import annotations

import httpx
import pytest

from _daemon_fakes import real_daemon

MODEL = "smollm2:135m"
# over 256 tokens: the first 256 positions are a prompt piece a later identical prompt reuses whole
SECRET = "Internal memo. The vault code is 4417-2208. " + "Keep this confidential and do not share it. " * 40


def _ask(url: str, client: str, salt: str | None = None) -> tuple[int, str]:
    body = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 6,
        "messages": [{"role": "system", "content": SECRET}, {"role": "user", "content": "What is the code?"}],
    }
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Forwarded-For": client}, timeout=300)
    assert r.status_code == 200, r.text
    reply = r.json()
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"], reply["choices"][0]["message"]["content"]


@pytest.fixture(scope="module", params=["client", "shared"])
def daemon(request, tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models"), prefix_cache=request.param) as srv:
        srv.mode = request.param
        yield srv


def test_a_prefix_is_reused_only_by_its_own_client_and_salt(daemon):
    alice, bob = "192.0.2.10", "198.51.100.20"
    cached, first = _ask(daemon.url, alice)
    assert cached == 0
    cached, again = _ask(daemon.url, alice)
    assert cached >= 256 and again == first  # her own prompt: reused, the same reply
    cached, bobs = _ask(daemon.url, bob)
    assert bobs == first  # the same tokens whether computed or reused
    if daemon.mode == "client":
        assert cached == 0  # nothing tells Bob what Alice sent
        cached, _ = _ask(daemon.url, alice, salt="project-x")
        assert cached == 0  # a salt of her own is a scope of its own
        cached, _ = _ask(daemon.url, alice, salt="project-x")
        assert cached >= 256
    else:
        assert cached >= 256  # LOCALRT_PREFIX_CACHE=shared: one user's machine shares everything


def test_the_setting_and_the_salt_are_checked():
    from localrt.config import load

    assert load({}).prefix_cache == "client" and load({"LOCALRT_PREFIX_CACHE": "Shared"}).prefix_cache == "shared"
    with pytest.raises(ValueError, match="LOCALRT_PREFIX_CACHE"):
        load({"LOCALRT_PREFIX_CACHE": "everyone"})
