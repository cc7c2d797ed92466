"""Stop strings over streamed text: never show any part of a stop string, hold back only what might become one."""

from __future__ import annotations

from typing import Iterable


class StopMatcher:
    """Feed decoded text piece by piece; get back what may be shown now and whether a stop string was hit.

    Text that ends with a proper prefix of some stop string is held back until the next piece decides it.
    On a hit, the text before the earliest occurrence of any stop string is returned and everything from
    the stop string on is dropped; the matcher then stays stopped."""

    def __init__(self, stops: Iterable[str] = ()):
        self.stops: tuple[str, ...] = tuple(stops)
        for s in self.stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        self.hit: str | None = None  # the stop string that ended the text, once one has
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text to emit now, whether a stop string was hit)."""
        if self.hit is not None:
            return "", True
        buf = self._held + text
        if not self.stops:
            return buf, False
        start, stop = self._earliest(buf)
        if stop is not None:
            self.hit, self._held = stop, ""
            return buf[:start], True
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of generation: the held-back text, which turned out not to start a stop string."""
        held, self._held = self._held, ""
        return "" if self.hit is not None else held

    def _earliest(self, buf: str) -> tuple[int, str | None]:
        best, which = len(buf), None
        for s in self.stops:
            i = buf.find(s, 0, best + len(s))  # only an occurrence starting before the best so far matters
            if i != -1 and i < best:
                best, which = i, s
        return best, which

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stops:
            window = min(len(s) - 1, len(buf))
            start = len(buf) - window
            # Candidate starts are where s's first character appears; the earliest match is the longest.
            i = buf.find(s[0], start)
            while i != -1:
                if len(buf) - i <= longest:
                    break
                if s.startswith(buf[i:]):
                    longest = len(buf) - i
                    break
                i = buf.find(s[0], i + 1)
        return longest
