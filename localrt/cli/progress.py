"""Rich progress bars for the streamed status lines of pull, push and create."""
from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


def render_progress(events: Iterable[dict], console: Console | None = None) -> dict | None:
    """Show one bar per digest with a total, and plain lines for other statuses. Returns the last event."""
    console = console or Console(stderr=True)
    last = None
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bars:
        tasks: dict[str, int] = {}
        for ev in events:
            last = ev
            status = ev.get("status", "")
            digest, total = ev.get("digest"), ev.get("total")
            if digest and total:
                if digest not in tasks:
                    tasks[digest] = bars.add_task(status[:40], total=total)
                bars.update(tasks[digest], completed=ev.get("completed", 0), total=total)
            elif status:
                bars.console.print(status)
    return last
