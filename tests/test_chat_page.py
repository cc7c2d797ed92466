"""The chat page in a real browser: Debian's Chromium, headless, driven by Playwright (never a downloaded browser),
against a real daemon started by the test with the built-in SmolLM2. Send and stream, stop, regenerate, edit,
reload and keep the history, the API-key prompt, and a hostile reply shown inert."""
from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest
from _daemon_fakes import real_daemon

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra has it)")
# slow (CI runs it): a browser against a daemon, about 10 s with the daemon's start
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")]

MODEL = "smollm2:135m"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with real_daemon(tmp_path_factory.mktemp("models")) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, daemon):
    context = browser.new_context()
    p = context.new_page()
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(daemon.url + "/")  # a browser at / lands on the page
    p.wait_for_selector("#model option", state="attached")
    yield p
    context.close()
    assert not errors, errors


def _set_options(p, **opts):
    p.click("#settings-toggle")
    for k, v in opts.items():
        p.fill(f"#{k}", str(v))


def _wait_for_text(p, selector, n, timeout=120.0):
    """Until the element's text is longer than n characters (Playwright's wait_for_function evaluates a string in
    the page, which the page's CSP rightly refuses)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.locator(selector).count() and len(p.inner_text(selector)) > n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{selector} stayed shorter than {n} characters")


def _send(p, text):
    p.fill("#prompt", text)
    p.press("#prompt", "Enter")


def test_root_answers_clients_as_before_and_sends_browsers_to_the_page(daemon):
    assert httpx.get(daemon.url + "/").text == "Ollama is running"
    r = httpx.get(daemon.url + "/", headers={"accept": "text/html"})
    assert r.status_code == 302 and r.headers["location"] == "/ui/"
    page = httpx.get(daemon.url + "/ui/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "<script" in page.text
    assert "unsafe-inline" not in csp and "http" not in page.text.split("<body>")[0].replace("http-equiv", "")
    assert httpx.get(daemon.url + "/ui/../api/tags").status_code in (200, 404)  # no file outside ui/ is served
    assert httpx.get(daemon.url + "/ui/secret.py").status_code == 404


def test_send_streams_a_reply_and_history_survives_a_reload(page):
    assert MODEL in page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=12)
    _send(page, "What is the capital of France?")
    page.wait_for_selector(".msg.assistant .stats:has-text('tokens')", timeout=120_000)
    reply = page.inner_text(".msg.assistant .body")
    assert reply.strip()
    assert page.inner_text("#conversations li.active").startswith("What is the capital")
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.inner_text(".msg.assistant .body") == reply
    assert page.inner_text(".msg.user .body").strip() == "What is the capital of France?"


def test_stop_ends_a_long_reply_and_regenerate_replaces_it(page):
    page.select_option("#model", MODEL)
    _set_options(page, num_predict=400, temperature=0)
    _send(page, "Write a long story about a lighthouse keeper.")
    _wait_for_text(page, ".msg.assistant .body", 20)
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .stats:has-text('(stopped)')")
    assert page.is_visible("#send") and not page.is_visible("#stop")
    page.fill("#num_predict", "6")
    page.click("#regenerate")
    page.wait_for_selector(".msg.assistant .stats:has-text('6 tokens')", timeout=120_000)
    assert page.locator(".msg.assistant").count() == 1
    page.click(".msg.user button.edit")  # edit-and-resend: the turn comes back to the composer
    assert page.input_value("#prompt").startswith("Write a long story")
    assert page.locator(".msg").count() == 0


def test_a_hostile_reply_is_shown_as_text(page, daemon):
    hostile = ('<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
               '[click](javascript:window.pwned=3) [ok](https://example.org/a) **bold** `x<b>`')
    conv = [{"id": "h", "title": "hostile", "model": MODEL, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": hostile, "thinking": "<b>t</b>"}]}]
    page.evaluate("c => localStorage.setItem('localrt.conversations', c)", json.dumps(conv))
    page.reload()
    page.wait_for_selector(".msg.assistant")
    body = page.locator(".msg.assistant .body")
    assert body.locator("img, script, b").count() == 0
    assert "<img src=x" in body.inner_text()
    assert page.evaluate("window.pwned") is None
    links = body.locator("a")
    assert links.count() == 1 and links.first.get_attribute("href") == "https://example.org/a"
    assert body.locator("strong").inner_text() == "bold" and body.locator("code").inner_text() == "x<b>"
    assert page.locator(".msg.assistant details.thinking").count() == 1  # reasoning folded


def test_the_page_asks_for_the_api_key_once_per_tab(browser, tmp_path):
    with real_daemon(tmp_path / "models", api_key="s3cret") as srv:
        context = browser.new_context()
        p = context.new_page()
        asked = []

        def answer(dialog):
            asked.append(dialog.message)
            dialog.accept("s3cret")

        p.on("dialog", answer)
        p.goto(srv.url + "/ui/")
        p.wait_for_selector(f"#model option[value='{MODEL}']", state="attached")
        assert len(asked) == 1 and "LOCALRT_API_KEY" in asked[0]
        p.reload()
        p.wait_for_selector(f"#model option[value='{MODEL}']", state="attached")
        assert len(asked) == 1  # kept for the tab
        context.close()
