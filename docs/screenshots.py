"""The chat page's main states as PNGs under docs/, for the README: a conversation (Markdown, code, math, reasoning
folded), a reply streaming, and a failed request. Against a real daemon with the built-in SmolLM2, in Debian's
chromium driven by Playwright (as tests/e2e/test_chat_page.py).

    python3 docs/screenshots.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
sys.path.insert(0, str(DOCS.parent / "tests"))

from _daemon_fakes import real_daemon  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

MODEL = "smollm2:135m"
REPLY = """The roots of $ax^2 + bx + c = 0$ are

$$
x = \\frac{-b \\pm \\sqrt{b^2 - 4ac}}{2a}
$$

In Python:

```python
import math

def roots(a, b, c):
    d = math.sqrt(b * b - 4 * a * c)
    return (-b + d) / (2 * a), (-b - d) / (2 * a)
```

- **Two real roots** when $b^2 > 4ac$;
- one double root when $b^2 = 4ac$."""
CONVERSATION = [
    {
        "id": "docs",
        "title": "Quadratic roots",
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "How do I solve a quadratic equation? Show the formula and some Python."},
            {
                "role": "assistant",
                "content": REPLY,
                "thinking": "The user wants the quadratic formula and code.",
                "stats": "142 tokens, 31.0 tokens/s",
            },
        ],
    }
]


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Debian's chromium is needed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp, real_daemon(Path(tmp) / "models") as srv, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(srv.url + "/")
        page.wait_for_selector("#model option", state="attached")
        page.evaluate("c => localStorage.setItem('localrt.conversations', c)", json.dumps(CONVERSATION))
        page.reload()
        page.wait_for_selector(".msg.assistant math")
        page.screenshot(path=str(DOCS / "chat_page.png"))

        page.click("#new-chat")
        page.fill("#prompt", "Write a short story about a lighthouse keeper.")
        page.press("#prompt", "Enter")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(page.inner_text(".msg.assistant .body") or "") < 200:
            time.sleep(0.2)
        page.screenshot(path=str(DOCS / "chat_page_streaming.png"))
        page.click("#stop")

        page.evaluate(
            "() => { const o = document.createElement('option'); o.value = o.textContent = 'no-such-model';"
            " document.getElementById('model').append(o); }"
        )
        page.select_option("#model", "no-such-model")
        page.fill("#prompt", "Hello?")
        page.press("#prompt", "Enter")
        page.wait_for_selector("#status.error")
        page.screenshot(path=str(DOCS / "chat_page_error.png"))
        browser.close()


if __name__ == "__main__":
    main()
