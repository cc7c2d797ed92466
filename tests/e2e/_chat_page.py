"""The chat page's browser tests' shared parts: Debian's Chromium driven by Playwright (never a downloaded browser),
a real daemon with the built-in SmolLM2 per module, a fresh page per test, and the moves a user makes."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest
from _daemon_fakes import real_daemon

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra has it)")
# slow (CI runs it): a browser against a daemon, about 10 s with the daemon's start
MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"),
]

MODEL = "smollm2:135m"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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


def _ensure_model(daemon, name=MODEL):
    """The built-in is created and loaded on its first request: load it (an empty generate) so it can be copied."""
    r = httpx.post(daemon.url + "/api/generate", json={"model": name}, timeout=120)
    assert r.status_code == 200, r.text


def _ps(daemon):
    return {m["name"]: m for m in httpx.get(daemon.url + "/api/ps").json()["models"]}


def _unload(daemon, name=MODEL):
    httpx.post(daemon.url + "/api/generate", json={"model": name, "keep_alive": 0}, timeout=60)
    deadline = time.monotonic() + 30
    while name in _ps(daemon):
        assert time.monotonic() < deadline, f"{name} stayed loaded"
        time.sleep(0.05)


def _open(context, daemon):
    p = context.new_page()
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(daemon.url + "/ui/")
    p.wait_for_selector(f"#model option[value='{MODEL}']", state="attached")
    return p, errors
