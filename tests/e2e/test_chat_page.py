"""The chat page in a real browser (Debian's Chromium, headless, driven by Playwright: tests/e2e/_chat_page.py)
against a real daemon started by the test with the built-in SmolLM2. Send and stream, stop, regenerate, edit,
reload and keep the history, the API-key prompt, a hostile reply shown inert, switching models, the status line
while a model loads or kernels compile, a closed tab cancelling its reply, ten tabs at once, and garbage in
localStorage or an imported file (issue 46's other features: test_chat_page_features.py)."""

from __future__ import annotations

import json
import time

import httpx
from _daemon_fakes import real_daemon
from _chat_page import MARKS, MODEL, _ensure_model, _open, _ps, _send, _set_options, _unload, _wait_for_text
from _chat_page import browser, daemon, page  # noqa: F401 - fixtures

pytestmark = MARKS


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
    hostile = (
        '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
        "[click](javascript:window.pwned=3) [ok](https://example.org/a) **bold** `x<b>`"
    )
    conv = [
        {
            "id": "h",
            "title": "hostile",
            "model": MODEL,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": hostile, "thinking": "<b>t</b>"},
            ],
        }
    ]
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


def test_the_picker_switches_the_model_of_the_next_message(page, daemon):
    _ensure_model(daemon)
    assert (
        httpx.post(daemon.url + "/api/copy", json={"source": MODEL, "destination": "other:latest"}).status_code == 200
    )
    page.reload()
    page.wait_for_selector("#model option[value='other:latest']", state="attached")
    sent = []
    page.on("request", lambda r: r.url.endswith("/api/chat") and sent.append(json.loads(r.post_data)["model"]))
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=4)
    _send(page, "Say hi.")
    page.wait_for_selector(".msg.assistant .stats:has-text('tokens')", timeout=120_000)
    page.select_option("#model", "other:latest")
    _send(page, "Say hi again.")
    page.wait_for_selector(".msg.assistant:nth-of-type(4) .stats:has-text('tokens')", timeout=120_000)
    assert sent == [MODEL, "other:latest"]
    labels = page.eval_on_selector_all(".msg.assistant .role > span:first-child", "s => s.map(x => x.textContent)")
    assert labels == [MODEL, "other:latest"]  # each reply names the model that wrote it (the reply's own "model")
    assert "other:latest" in _ps(daemon)
    page.reload()  # the conversation keeps the model it was switched to
    page.wait_for_selector(".msg.assistant")
    assert page.input_value("#model") == "other:latest"


def _statuses_until_done(p, timeout=120.0):
    seen = []
    deadline = time.monotonic() + timeout
    while not p.locator(".msg.assistant .stats:has-text('tokens')").count():
        assert time.monotonic() < deadline, seen
        text = p.inner_text("#status")
        if not seen or seen[-1] != text:
            seen.append(text)
    return seen


def test_the_status_line_says_while_the_model_loads(page, daemon):
    _ensure_model(daemon)
    _unload(daemon)
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=2)
    _send(page, "Hello")
    seen = _statuses_until_done(page)
    assert any(t.startswith(f"Loading {MODEL}…") for t in seen), seen
    assert page.inner_text("#status") == ""


def test_the_status_line_counts_kernels_compiling_for_this_cpu(page, daemon):
    """Kernels compile only on a fresh machine (Numba's cache has them here), so /api/kernels answers as a daemon
    compiling would, and the chat request is held until the page has shown it."""
    answers = iter(
        [
            {"compiling": False, "compiled": 5},
            {"compiling": True, "compiled": 6, "kernel": "matvec_q4_k"},
            {"compiling": True, "compiled": 7, "kernel": "rms_norm"},
        ]
    )
    last = [{"compiling": False, "compiled": 9}]
    page.route("**/api/kernels", lambda r: r.fulfill(json=next(answers, last[0])))
    held = []
    page.route("**/api/chat", lambda r: held.append(r))
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=2)
    _send(page, "Hello")
    seen = []
    deadline = time.monotonic() + 30
    while "4 compiled" not in (seen[-1] if seen else ""):
        assert time.monotonic() < deadline, seen
        page.wait_for_timeout(50)
        text = page.inner_text("#status")
        if not seen or seen[-1] != text:
            seen.append(text)
    assert any(
        t.startswith("Preparing kernels for this CPU (first run only): 1 compiled, now matvec_q4_k") for t in seen
    )
    assert any(t.startswith("Preparing kernels for this CPU (first run only): 2 compiled, now rms_norm") for t in seen)
    held[0].continue_()
    page.wait_for_selector(".msg.assistant .stats:has-text('tokens')", timeout=120_000)
    assert page.inner_text("#status") == ""


def test_a_tab_closed_mid_reply_cancels_its_generation(browser, daemon):
    _ensure_model(daemon)
    context = browser.new_context()
    p, errors = _open(context, daemon)
    p.select_option("#model", MODEL)
    _set_options(p, temperature=0, num_predict=100000)
    _send(p, "Count from 1 to 1000, one number per line.")
    _wait_for_text(p, ".msg.assistant .body", 20, timeout=60)
    assert _ps(daemon)[MODEL]["slots_in_use"] == 1  # still generating
    context.close()
    deadline = time.monotonic() + 10
    while _ps(daemon)[MODEL]["slots_in_use"]:
        assert time.monotonic() < deadline, "the reply went on after its tab closed"
        time.sleep(0.05)
    assert not errors, errors
    started = time.monotonic()  # and the next request starts at once
    r = httpx.post(
        daemon.url + "/api/chat",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": {"num_predict": 2},
        },
        timeout=60,
    )
    assert r.status_code == 200 and time.monotonic() - started < 10


def test_ten_tabs_streaming_at_once_all_finish_and_the_page_stays_fast(browser, daemon):
    _ensure_model(daemon)
    context = browser.new_context()  # one browser profile: the tabs share localStorage
    tabs = [_open(context, daemon) for _ in range(10)]
    for i, (p, _) in enumerate(tabs):
        p.select_option("#model", MODEL)
        _set_options(p, temperature=0, num_predict=4)
        _send(p, f"Tab {i}: name a colour.")
    slowest = 0.0
    deadline = time.monotonic() + 240
    while not all(p.locator(".msg.assistant .stats:has-text('tokens')").count() for p, _ in tabs):
        assert time.monotonic() < deadline, [p.inner_text("#status") for p, _ in tabs]
        started = time.monotonic()
        assert httpx.get(daemon.url + "/ui/", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.2)
    assert slowest < 2.0, slowest
    for p, errors in tabs:
        assert not errors, errors
        assert not p.locator(".msg.error").count()
    p, errors = _open(context, daemon)  # every tab's conversation is kept: none overwrote another's
    titles = p.eval_on_selector_all("#conversations li", "ls => ls.map(l => l.textContent)")
    assert {f"Tab {i}: name a colour." for i in range(10)} <= set(titles), titles
    context.close()


def test_garbage_in_local_storage_is_ignored_and_the_page_still_works(page):
    garbage = [
        "not json {",
        "42",
        '{"messages": []}',
        '"a string"',
        '[1, null, "x", [], {"messages": 5}]',
        json.dumps([{"__proto__": {"polluted": 1}, "messages": [{"role": "user", "content": {"x": 1}}]}]),
    ]
    for g in garbage:
        page.evaluate("g => localStorage.setItem('localrt.conversations', g)", g)
        page.reload()
        page.wait_for_selector(f"#model option[value='{MODEL}']", state="attached")
        assert page.locator(".msg").count() == 0, g
    assert page.evaluate("({}).polluted") is None
    mixed = [
        {
            "id": "ok",
            "title": {"x": 1},
            "model": 7,
            "messages": [
                None,
                {"role": "user", "content": 7},
                {"role": "evil", "content": "x"},
                {"role": "user", "content": "kept"},
                {"role": "assistant", "content": "fine", "thinking": ["no"], "stats": "<b>3 tokens</b>"},
            ],
        },
        "junk",
    ]
    page.evaluate("g => localStorage.setItem('localrt.conversations', g)", json.dumps(mixed))
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.inner_text("#conversations li") == "Untitled"
    assert page.locator(".msg").count() == 2 and page.inner_text(".msg.user .body").strip() == "kept"
    assert page.inner_text(".msg.assistant .stats") == "<b>3 tokens</b>"
    page.select_option("#model", MODEL)
    _set_options(page, temperature=0, num_predict=2)
    _send(page, "Still works?")
    page.wait_for_selector(".msg.assistant:nth-of-type(4) .stats:has-text('tokens')", timeout=120_000)
    stored = json.loads(page.evaluate("localStorage.getItem('localrt.conversations')"))
    assert [len(c["messages"]) for c in stored] == [4]


def _import(p, obj=None, raw=None):
    data = raw if raw is not None else json.dumps(obj).encode()
    p.set_input_files("#import-file", files=[{"name": "c.json", "mimeType": "application/json", "buffer": data}])


def test_import_takes_back_an_export_and_refuses_or_defuses_a_hostile_file(page):
    conv = [
        {
            "id": "e",
            "title": "exported",
            "model": MODEL,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "stats": "2 tokens"},
            ],
        }
    ]
    page.evaluate("c => localStorage.setItem('localrt.conversations', c)", json.dumps(conv))
    page.reload()
    page.wait_for_selector(".msg.assistant")
    with page.expect_download() as dl:
        page.click("#export-json")
    exported = open(dl.value.path(), "rb").read()
    _import(page, raw=exported)
    page.wait_for_selector("#status:has-text('Imported 1 conversation')")
    assert page.locator("#conversations li").count() == 2
    assert (
        page.inner_text("#conversations li.active") == "exported" and page.inner_text(".msg.assistant .body") == "hello"
    )

    def refused(obj=None, raw=None):
        _import(page, obj, raw)
        page.wait_for_selector("#status.error:has-text('Not imported')")
        text = page.inner_text("#status")
        page.evaluate("document.getElementById('status').className = ''")
        assert page.locator("#conversations li").count() == 2, text
        return text

    assert "not JSON" in refused(raw=b"{ nope")
    assert "no messages list" in refused({"title": "x", "messages": "hi"})
    assert "not a string" in refused({"title": ["x"], "messages": []})
    assert "no text content" in refused({"title": "x", "messages": [{"role": "user", "content": 5}]})
    assert "no valid role" in refused({"title": "x", "messages": [{"role": "<script>", "content": "x"}]})
    assert "longer than" in refused({"title": "t" * 10_000, "messages": []})
    assert "longer than" in refused({"title": "x", "messages": [{"role": "user", "content": "a" * 2_500_000}]})
    assert "not an object" in refused(raw=b"[1, 2]")
    assert "no conversations" in refused(raw=b"[]")

    hostile = (
        '{"__proto__": {"polluted": "yes"}, "constructor": {"prototype": {"polluted": "yes"}}, '
        '"id": "e", "title": "<img src=x onerror=\\"window.pwned=1\\">", "model": "<b>m</b>", "messages": ['
        '{"role": "user", "content": "<script>window.pwned=2</script>", "__proto__": {"polluted": "yes"}},'
        '{"role": "assistant", "content": "[x](javascript:window.pwned=3)", "stats": "<i>s</i>"}]}'
    )
    _import(page, raw=hostile.encode())
    page.wait_for_selector("#status:has-text('Imported 1 conversation')")
    assert page.locator("#conversations li").count() == 3
    assert page.inner_text("#conversations li.active") == '<img src=x onerror="window.pwned=1">'
    assert page.locator("img, script:not([src]), #messages a, #messages b, #messages i").count() == 0
    assert page.inner_text(".msg.user .body").strip() == "<script>window.pwned=2</script>"
    assert page.evaluate("[({}).polluted, Object.prototype.polluted, window.pwned]") == [None, None, None]
    ids = [c["id"] for c in json.loads(page.evaluate("localStorage.getItem('localrt.conversations')"))]
    assert len(set(ids)) == 3  # an imported id that is taken gets a new one


def test_tex_math_is_shown_as_mathml_and_stays_inert(page):
    reply = (
        "Euler: $e^{i\\pi} + 1 = 0$ and \\(x_1^2\\). It costs $5 and $10, `$a$` is code.\n\n"
        "$$\n\\frac{a+b}{\\sqrt[3]{c}} = \\sum_{k=0}^{n} \\alpha_k \\left( x \\right) \\unknown\n$$\n\n"
        'Hostile: $\\text{<img src=x onerror="window.pwned=1">}$ and $\\mathrm{<b>x</b>}$; deep: $'
        + "{" * 200
        + "x"
        + "}" * 200
        + "$"
    )
    conv = [
        {
            "id": "m",
            "title": "math",
            "model": MODEL,
            "messages": [{"role": "user", "content": "math?"}, {"role": "assistant", "content": reply}],
        }
    ]
    page.evaluate("c => localStorage.setItem('localrt.conversations', c)", json.dumps(conv))
    page.reload()
    page.wait_for_selector(".msg.assistant math")
    body = page.locator(".msg.assistant .body")
    maths = body.locator("math")
    assert maths.count() == 5  # e^{i pi}, x_1^2, the displayed formula and the two hostile ones; not the deep one
    first = maths.nth(0)
    assert first.locator("msup").count() == 1 and first.locator("msup > mi").first.text_content() == "e"
    assert first.locator("msup > mrow > mi").nth(1).text_content() == "π"
    assert maths.nth(1).locator("msubsup").count() == 1
    display = body.locator("div.math math[display=block]")
    assert display.count() == 1
    assert display.locator("mfrac").count() == 1 and display.locator("mroot").count() == 1
    assert display.locator("munderover").count() == 1 and display.locator("munderover > mo").first.text_content() == "∑"
    assert display.locator("mo[stretchy=true]").count() == 2
    assert "\\unknown" in display.locator("mtext").last.text_content()  # outside the subset: shown as written
    assert "It costs $5 and $10" in body.inner_text() and body.locator("code").inner_text() == "$a$"
    assert body.locator("img, b, script").count() == 0 and page.evaluate("window.pwned") is None
    assert '<img src=x onerror="window.pwned=1">' in maths.nth(3).locator("mtext").text_content().replace("\xa0", " ")
    assert "{" * 200 in body.inner_text()  # too deep: left as written
    box = display.bounding_box()
    assert box and box["height"] > 30  # laid out as a displayed fraction, not a line of text
