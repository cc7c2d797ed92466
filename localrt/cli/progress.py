"""Progress on stderr for pull, push, create, export and import: status lines and bars in the order they come, as
`ollama pull` draws them. A bar is drawn where its first event arrives and stays there, finished, when the next
status line ("verifying sha256 digest", "success") is printed below it.

Every bar counts bytes: the daemon reports quantization as bytes of weights done (as Ollama does), uploads,
downloads and copies as bytes moved."""

from __future__ import annotations

from typing import Callable, Iterable

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class ProgressView:
    """Feed it the daemon's progress objects (`status`, and `digest`/`total`/`completed` while something moves)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._bars: Progress | None = None  # live while events with a total come in
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "ProgressView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def event(self, ev: dict) -> None:
        status, total = ev.get("status") or "", ev.get("total")
        if total:
            key = ev.get("digest") or status  # a copy without a digest ("copying file x.gguf") is one bar too
            bars = self._open()
            if key not in self._tasks:
                self._tasks[key] = bars.add_task(status[:40], total=total)
            bars.update(self._tasks[key], completed=ev.get("completed") or 0, total=total)
        elif status:
            self.close()  # the bars so far stay above this line, finished
            self.console.print(status, markup=False, highlight=False, soft_wrap=True)  # a digest is never split

    def _open(self) -> Progress:
        if self._bars is None:
            self._bars = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._bars.start()
        return self._bars

    def close(self) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars, self._tasks = None, {}


def blob_progress(view: ProgressView, verb: str) -> Callable[[str, int, int], None]:
    """A `progress(digest, done, total)` callback (export, import) that draws one bar per blob on `view`."""
    return lambda digest, done, total: view.event(
        {"status": f"{verb} {digest[7:19]}", "digest": digest, "total": total, "completed": done}
    )


def render_progress(events: Iterable[dict], console: Console | None = None) -> dict | None:
    """Show `events` as they stream in. Returns the last one."""
    last = None
    with ProgressView(console) as view:
        for ev in events:
            last = ev
            view.event(ev)
    return last
