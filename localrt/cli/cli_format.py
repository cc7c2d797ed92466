"""Pure formatting for the CLI: sizes, times, durations and tables the way Ollama prints them."""

from __future__ import annotations

from datetime import datetime, timezone


def human_bytes(n: int) -> str:
    """Decimal units, as `ollama list` prints them: 4.7 GB, 270 MB, 955 B."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


def _parse_time(ts: str) -> datetime:
    # Python < 3.11 cannot read nanosecond fractions or a trailing Z: trim to microseconds.
    ts = ts.replace("Z", "+00:00")
    if "." in ts:
        head, rest = ts.split(".", 1)
        n = len(rest) - len(rest.lstrip("0123456789"))
        digits, zone = rest[:n], rest[n:]
        ts = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(ts)


def _span(seconds: float) -> str:
    s = int(abs(seconds))
    for unit, size in (
        ("year", 31536000),
        ("month", 2592000),
        ("week", 604800),
        ("day", 86400),
        ("hour", 3600),
        ("minute", 60),
        ("second", 1),
    ):
        if s >= size:
            k = s // size
            if k == 1:
                return {"hour": "an hour", "minute": "a minute", "second": "a second"}.get(unit, f"1 {unit}")
            return f"{k} {unit}s"
    return "less than a second"


def ago(ts: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    delta = (now - _parse_time(ts)).total_seconds()
    if delta < 1:
        return "Less than a second ago"
    return f"{_span(delta)} ago".capitalize()


def until(ts: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    t = _parse_time(ts)
    if t.year > now.year + 100:
        return "Forever"
    delta = (t - now).total_seconds()
    if delta <= 0:
        return "Stopping..."
    return f"{_span(delta)} from now"


def go_duration(ns: int) -> str:
    """Go's time.Duration String(), e.g. 1.234s, 45.6ms, 120µs."""
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:g}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:g}ms"
    s = ns / 1e9
    if s < 60:
        return f"{s:g}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{int(m)}m{s:g}s"
    h, m = divmod(m, 60)
    return f"{int(h)}h{int(m)}m{s:g}s"


def verbose_stats(done: dict) -> str:
    def rate(count, ns):
        return f"{count / (ns / 1e9):.2f} tokens/s" if ns else "n/a"

    pc, pd = done.get("prompt_eval_count", 0), done.get("prompt_eval_duration", 0)
    ec, ed = done.get("eval_count", 0), done.get("eval_duration", 0)
    rows = [
        ("total duration:", go_duration(done.get("total_duration", 0))),
        ("load duration:", go_duration(done.get("load_duration", 0))),
        ("prompt eval count:", f"{pc} token(s)"),
        ("prompt eval duration:", go_duration(pd)),
        ("prompt eval rate:", rate(pc, pd)),
        ("eval count:", f"{ec} token(s)"),
        ("eval duration:", go_duration(ed)),
        ("eval rate:", rate(ec, ed)),
    ]
    if "draft_count" in done:  # speculative decoding (prompt lookup): drafted tokens and how many were accepted
        dc, da = done["draft_count"], done.get("draft_accepted_count", 0)
        rows.append(("draft count:", f"{dc} token(s)"))
        rows.append(("draft accepted:", f"{da} token(s) ({100 * da / dc:.1f}%)" if dc else f"{da} token(s)"))
    return "\n".join(f"{k:<22}{v}" for k, v in rows)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "    ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(headers)] + [fmt(r) for r in rows])


def processor(size: int, size_vram: int) -> str:
    if size_vram <= 0 or size <= 0:
        return "100% CPU"
    if size_vram >= size:
        return "100% GPU"
    gpu = round(100 * size_vram / size)
    return f"{100 - gpu}%/{gpu}% CPU/GPU"
