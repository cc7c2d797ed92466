"""The spinner `ollama run` shows while the daemon starts and while the first token is awaited.

Drawn on stderr, and only when stderr is a terminal: a pipe or a log file never sees its escape codes. It
erases itself when stopped, so the answer starts at the beginning of a clean line."""
from __future__ import annotations

import sys
import threading

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Spinner:
    def __init__(self, message: str = "", stream=None, interval: float = 0.1):
        self.message, self.interval = message, interval
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
        i = 0
        while not self._stop.is_set():
            with self._lock:
                if not self._stop.is_set():
                    text = f"{FRAMES[i % len(FRAMES)]} {self.message}".rstrip()
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
