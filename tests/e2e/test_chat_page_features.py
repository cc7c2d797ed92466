"""The chat page's other features in a real browser (issue 46): the copy button of a code block, rename, delete,
export as Markdown, a text file dropped on the composer, Shift+Enter, the system prompt and num_ctx in the request,
and what a busy daemon (503) or a failed request shows."""

from __future__ import annotations

import json
import time

import pytest
from _chat_page import MARKS, MODEL, _send, _set_options
from _chat_page import browser, daemon, page  # noqa: F401 - fixtures

pytestmark = MARKS


# -- issue 46's remaining page features: copy, rename, delete, Markdown export, a dropped file, Shift+Enter, the
# settings in the request, and the messages a busy daemon or a failed request shows. Most start from a stored
# conversation, or answer /api/chat in the browser (page.route), so they need no generation.


def _store(p, *convs):
    p.evaluate("c => localStorage.setItem('localrt.conversations', c)", json.dumps(list(convs)))
    p.reload()
    p.wait_for_selector(f"#model option[value='{MODEL}']", state="attached")


def _conv(cid, title, *turns):
    roles = ["user", "assistant"] * len(turns)
    return {
        "id": cid,
        "title": title,
        "model": MODEL,
        "messages": [{"role": r, "content": t} for r, t in zip(roles, turns)],
    }


def _titles(p):
    return p.eval_on_selector_all("#conversations li", "ls => ls.map(l => l.textContent)")


def _canned_reply(text, requests=None):
    """A route handler answering /api/chat as the daemon streams: the text, then the done event (2 tokens)."""

    def handle(route):
        if requests is not None:
            requests.append(json.loads(route.request.post_data))
        events = [
            {"model": MODEL, "message": {"role": "assistant", "content": text}, "done": False},
            {
                "model": MODEL,
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "eval_count": 2,
                "eval_duration": 10_000_000,
            },
        ]
        route.fulfill(
            status=200, content_type="application/x-ndjson", body="".join(json.dumps(e) + "\n" for e in events)
        )

    return handle


def test_the_copy_button_puts_the_code_block_on_the_clipboard(page, daemon):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daemon.url)
    code = 'def f(x):\n    return "<b>" + x  # not HTML'
    _store(page, _conv("c", "code", "a function?", f"Here:\n\n```python\n{code}\n```\n\nand `inline`."))
    button = page.locator(".msg.assistant pre button.copy")
    assert button.count() == 1 and button.inner_text() == "Copy"
    button.click()
    page.wait_for_selector(".msg.assistant pre button.copy:has-text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == code  # the code alone: not the button's label
    page.wait_for_selector(".msg.assistant pre button.copy:text-is('Copy')")  # the label comes back


def test_rename_changes_the_title_and_keeps_it_after_a_reload(page):
    _store(page, _conv("a", "first", "hi", "hello"), _conv("b", "second", "yo", "hey"))
    asked = []

    def answer(dialog):
        asked.append(dialog.default_value)
        dialog.accept("Trip <b>plans</b>")

    page.on("dialog", answer)
    page.click("#rename")
    assert asked == ["first"]  # the prompt offers the current title
    assert _titles(page) == ["Trip <b>plans</b>", "second"]  # shown as text
    assert page.inner_text("#conversations li.active") == "Trip <b>plans</b>"
    page.remove_listener("dialog", answer)
    page.once("dialog", lambda d: d.dismiss())  # cancelling leaves the title as it is
    page.click("#rename")
    assert _titles(page) == ["Trip <b>plans</b>", "second"]
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert _titles(page) == ["Trip <b>plans</b>", "second"] and page.inner_text(".msg.assistant .body") == "hello"


def test_delete_asks_first_then_removes_the_conversation_for_good(page):
    _store(page, _conv("a", "first", "hi", "hello"), _conv("b", "second", "yo", "hey"))
    page.click("#conversations li:text-is('second')")
    page.wait_for_selector(".msg.assistant .body:has-text('hey')")
    asked = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("#delete")
    assert asked == ['Delete "second"?'] and _titles(page) == ["first", "second"]  # "Cancel" keeps it
    page.once("dialog", lambda d: d.accept())
    page.click("#delete")
    assert _titles(page) == ["first"]
    assert page.inner_text("#conversations li.active") == "first" and page.inner_text(".msg.assistant .body") == "hello"
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert _titles(page) == ["first"]
    page.once("dialog", lambda d: d.accept())
    page.click("#delete")  # the last one: an empty list and page
    assert _titles(page) == [] and page.locator(".msg").count() == 0
    assert json.loads(page.evaluate("localStorage.getItem('localrt.conversations')")) == []


def test_export_markdown_downloads_the_conversation_as_markdown(page):
    _store(
        page,
        _conv(
            "m",
            "Lighthouse notes",
            "Who keeps the light?",
            "The **keeper**.\n\n```\nlamp()\n```",
            "And <at night>?",
            "Always.",
        ),
    )
    with page.expect_download() as dl:
        page.click("#export-md")
    assert dl.value.suggested_filename == "Lighthouse notes.md"
    text = open(dl.value.path(), encoding="utf-8").read()
    assert text == (
        "# Lighthouse notes\n\nModel: smollm2:135m\n\n"
        "## user\n\nWho keeps the light?\n\n## assistant\n\nThe **keeper**.\n\n```\nlamp()\n```\n\n"
        "## user\n\nAnd <at night>?\n\n## assistant\n\nAlways.\n"
    )


def _drop(p, name, content, mime="text/plain"):
    """Drops a file on the composer as a browser does: a drop event whose DataTransfer holds the file."""
    dt = p.evaluate_handle(
        "([name, bytes, mime]) => { const dt = new DataTransfer();"
        " dt.items.add(new File([new Uint8Array(bytes)], name, {type: mime})); return dt; }",
        [name, list(content), mime],
    )
    p.dispatch_event("#prompt", "dragover", {"dataTransfer": dt})
    p.dispatch_event("#prompt", "drop", {"dataTransfer": dt})


def test_a_text_file_dropped_on_the_composer_is_added_to_the_message(page):
    sent = []
    page.route("**/api/chat", _canned_reply("Read it.", sent))
    page.fill("#prompt", "Summarise this:")
    _drop(page, "notes.txt", "Line one\nLine two é\n".encode())
    deadline = time.monotonic() + 10
    while "Line two" not in page.input_value("#prompt"):
        assert time.monotonic() < deadline, page.input_value("#prompt")
        page.wait_for_timeout(50)
    assert page.input_value("#prompt") == "Summarise this:\n\nnotes.txt:\n\nLine one\nLine two é\n"
    assert not page.locator("#prompt.dragging").count()
    page.click("#send")
    page.wait_for_selector(".msg.assistant .stats:has-text('2 tokens')")
    assert "notes.txt:\n\nLine one\nLine two é" in page.inner_text(".msg.user .body")
    assert sent[0]["messages"][-1]["content"] == "Summarise this:\n\nnotes.txt:\n\nLine one\nLine two é"
    _drop(page, "image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")  # a binary file is refused, said so
    page.wait_for_selector("#status.error:has-text('image.png is not a text file')")
    assert page.input_value("#prompt") == ""


def test_shift_enter_inserts_a_newline_and_enter_sends(page):
    sent = []
    page.route("**/api/chat", _canned_reply("Two lines seen.", sent))
    page.click("#prompt")
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    assert page.input_value("#prompt") == "first line\nsecond line"
    assert page.locator(".msg").count() == 0 and not sent  # nothing sent yet
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant .stats:has-text('2 tokens')")
    assert page.input_value("#prompt") == ""
    assert page.inner_text(".msg.user .body").strip() == "first line\nsecond line"  # one message of two lines
    assert len(sent) == 1 and sent[0]["messages"] == [{"role": "user", "content": "first line\nsecond line"}]


def test_the_system_prompt_and_num_ctx_reach_the_daemon(page, daemon):
    sent = []

    def forward(route):
        sent.append(json.loads(route.request.post_data))
        route.continue_()  # the real daemon answers it

    page.route("**/api/chat", forward)
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=3, num_ctx=1024)
    page.fill("#system", "You are a terse assistant.")
    _send(page, "Hello")
    page.wait_for_selector(".msg.assistant .stats:has-text('3 tokens')", timeout=120_000)
    assert not page.locator(".msg.error").count() and page.inner_text("#status") == ""
    body = sent[0]
    assert body["model"] == MODEL and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hello"},
    ]
    assert body["options"] == {"temperature": 0, "num_ctx": 1024, "num_predict": 3}
    page.fill("#system", "")  # emptied: no system message, the model's own; an empty field sends no option
    page.fill("#num_ctx", "")
    page.click("#regenerate")
    page.wait_for_selector(".msg.assistant .stats:has-text('3 tokens')", timeout=120_000)
    assert len(sent) == 2 and sent[1]["messages"] == [{"role": "user", "content": "Hello"}]
    assert sent[1]["options"] == {"temperature": 0, "num_predict": 3}


@pytest.mark.parametrize(
    "answer, shown",
    [
        (
            {"status": 503, "json": {"error": "server busy, please try again. maximum pending requests exceeded"}},
            "The daemon is busy or shutting down: server busy, please try again. maximum pending requests exceeded",
        ),
        ({"status": 500, "json": {"error": "the model failed to load"}}, "the model failed to load"),
        ({"status": 502, "body": "Bad Gateway", "content_type": "text/plain"}, "Bad Gateway"),
        (None, "Failed to fetch"),  # the connection itself failed
        (
            {
                "status": 200,
                "content_type": "application/x-ndjson",
                "body": json.dumps(
                    {"model": MODEL, "message": {"role": "assistant", "content": "Half a"}, "done": False}
                )
                + "\n"
                + json.dumps({"error": "generation failed: out of memory"})
                + "\n",
            },
            "generation failed: out of memory",
        ),
    ],
    ids=["busy-503", "failed-500", "plain-502", "network", "error-mid-stream"],
)
def test_a_busy_daemon_or_a_failed_request_is_said_plainly(page, answer, shown):
    page.route("**/api/chat", lambda r: r.abort("connectionrefused") if answer is None else r.fulfill(**answer))
    page.select_option("#model", MODEL)
    _send(page, "Hello?")
    page.wait_for_selector("#status.error")
    assert page.inner_text("#status") == "Request failed: " + shown
    assert page.inner_text(".msg.assistant.error .stats") == "Error: " + shown  # on the reply itself too
    assert page.is_visible("#send") and not page.is_visible("#stop")  # and the page can send again
    assert page.inner_text(".msg.user .body").strip() == "Hello?"
    page.unroute("**/api/chat")
    page.route("**/api/chat", _canned_reply("Back."))
    page.click("#regenerate")
    page.wait_for_selector(".msg.assistant .stats:has-text('2 tokens')")
    assert page.inner_text("#status") == "" and not page.locator(".msg.error").count()
    assert page.inner_text(".msg.assistant .body") == "Back."
