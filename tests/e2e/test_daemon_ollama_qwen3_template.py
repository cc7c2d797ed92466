"""Issue 44 through the daemon with Ollama's published qwen3 template (tests/fixtures/ollama_qwen3.gotmpl, the
registry blob sha256:ae370d884f10...) as the model's TEMPLATE and a scripted model that records its prompt:
/api/show lists `thinking` (and `tools`), think false renders "/no_think" and the empty think block, think true
"/think", and no think at all is think true for a thinking model, as Ollama's ChatHandler sets it."""

from __future__ import annotations

import pytest

from _daemon_fakes import Script, scripted_daemon
from _testpaths import FIXTURES

QWEN3 = (FIXTURES / "ollama_qwen3.gotmpl").read_text()
REASONED = "<think>\nThe user greets me.\n</think>\n\nHello there!"
HEAD = "<|im_start|>user\nHi"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    script = Script(answer=REASONED, piece=3)
    with scripted_daemon(tmp_path_factory.mktemp("m"), script, "qwen3-tmpl", QWEN3) as (srv, client):
        yield client, script


def test_show_lists_thinking_and_the_template_verbatim(daemon):
    client, _ = daemon
    shown = client.show("qwen3-tmpl")
    assert "thinking" in shown.capabilities and "tools" in shown.capabilities
    assert shown.template == QWEN3


@pytest.mark.parametrize(
    "think, tail",
    [
        (False, " /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        (True, " /think<|im_end|>\n<|im_start|>assistant\n"),
        # none sent: Ollama's handlers (server/routes.go) set think true for a model with the thinking capability, so
        # IsThinkSet is true and qwen3's last user message gets " /think" (runtime.reasoning.default_think)
        (None, " /think<|im_end|>\n<|im_start|>assistant\n"),
    ],
)
def test_think_reaches_the_template(daemon, think, tail):
    client, script = daemon
    script.answer = REASONED
    r = client.chat(model="qwen3-tmpl", messages=[{"role": "user", "content": "Hi"}], think=think)
    assert script.prompts[-1].endswith(HEAD + tail)
    assert r.message.content == "Hello there!"
    if think is False:
        assert not r.message.thinking
    else:
        assert r.message.thinking == "The user greets me."
