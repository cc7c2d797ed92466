"""The spinner `ollama run` shows while the daemon starts and while the first token is awaited.

Drawn on stderr, and only when stderr is a terminal: a pipe or a log file never sees its escape codes. It
erases itself when stopped, so the answer starts at the beginning of a clean line."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Callable

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
DETAIL_EVERY = 10  # frames between two calls of `detail` (about a second)


class Spinner:
    """`detail`, when given, is asked now and then (on the spinner's thread) for a line that says what is being
    waited for; its line replaces `message` while it has one."""

    def __init__(
        self, message: str = "", stream=None, interval: float = 0.1, detail: Callable[[], str | None] | None = None
    ):
        self.message, self.interval, self.detail = message, interval, detail
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "Spinner":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        isatty = getattr(self.stream, "isatty", None)
        if self._thread is None and isatty is not None and isatty():
            self._thread = threading.Thread(target=self._spin, name="localrt-spinner", daemon=True)
            self._thread.start()

    def _spin(self) -> None:
        i, message = 0, self.message
        while not self._stop.is_set():
            if self.detail is not None and i % DETAIL_EVERY == 0:
                try:
                    message = self.detail() or self.message
                except Exception:  # noqa: BLE001 - the spinner never breaks what it waits on
                    message = self.message
            with self._lock:
                if not self._stop.is_set():
                    text = f"{FRAMES[i % len(FRAMES)]} {message}".rstrip()[: shutil.get_terminal_size().columns - 1]
                    self.stream.write(f"\r{text}\x1b[K")
                    self.stream.flush()
            i += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop and erase; safe to call more than once, and from the thread that prints the answer."""
        with self._lock:
            if self._thread is None or self._stop.is_set():
                self._stop.set()
                return
            self._stop.set()
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._thread.join(timeout=1)


def kernel_detail(client) -> Callable[[], str | None]:
    """A Spinner `detail` for a first answer: while the daemon compiles kernels for this CPU (a one-time step that
    took about two minutes on a fresh machine), the kernels it has compiled since the wait began, the one it is
    compiling now, and how long it has taken (the daemon's GET /api/kernels). None until it compiles one."""
    from .client import Client

    began, base, poller = time.monotonic(), [], []

    def detail() -> str | None:
        if not poller:  # made on the spinner's first ask: none where there is no terminal to spin on
            poller.append(Client(client.base_url, timeout=1.0))  # its own connection: the answer streams on the other
        now = poller[0].kernels()
        if now is None:
            return None
        if not base:
            base.append(now["compiled"])
        done = now["compiled"] - base[0]
        if not now["compiling"] and not done:
            return None
        current = f", now {now['kernel']}" if now["compiling"] and now.get("kernel") else ""
        return (
            f"preparing kernels for this CPU (first run only): {done} compiled{current}, "
            f"{time.monotonic() - began:.0f} s"
        )

    return detail
