"""Refused prompts leave no memory behind (issue 48, class 4): a daemon that answered once, then refused 100 prompts
of 8 MB (each past the context, refused in about a second without being tokenized whole), is within 10% of its
resident size before them. The body and its parsed copies are freed into the C heap, which the edge hands back
after each big-body request, once the cycles that hold them are collected (serve/malloc.release_after_big_body);
the tokenizer's caches skip long fragments."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from localrt.serve.daemon import free_port
from _testpaths import REPO

MODEL = "smollm2:135m"


def _rss_mb(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024


@pytest.mark.slow  # about 80 s: a hundred 8 MB bodies
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the daemon's RSS from /proc")
def test_a_hundred_refused_8mb_prompts_leave_rss_within_ten_percent(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "LOCALRT_HOST": f"127.0.0.1:{port}",
        "LOCALRT_DATA": str(tmp_path / "data"),
        "LOCALRT_MODELS": str(tmp_path / "models"),
        "LOCALRT_API_KEY": "",
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "localrt", "serve"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        first = httpx.post(
            url + "/api/generate",
            timeout=300,
            json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert first.status_code == 200, first.text
        start = _rss_mb(daemon.pid)
        body = {
            "model": MODEL,
            "prompt": "Tell me more. " * 600_000,
            "raw": True,
            "stream": False,
            "truncate": False,
        }  # 8.4 MB, refused (truncate: true would cut it as Ollama does)
        for _ in range(100):
            r = httpx.post(url + "/api/generate", json=body, timeout=300)
            assert r.status_code == 400 and "context length" in r.json()["error"]
        end = _rss_mb(daemon.pid)
        assert end <= 1.10 * start, (start, end)
    finally:
        daemon.terminate()
        daemon.wait(30)
