"""The one error type of the template package (Go text/template and Jinja alike)."""

from __future__ import annotations

from ..errors import LocalrtError


class TemplateError(LocalrtError):
    """A template that does not parse, fails while it runs, or breaks a resource limit.

    `line`/`col` (1-based) point into the template source when the failure has a place; `kind` says which
    template language ("go" or "jinja")."""

    def __init__(self, msg: str, *, line: int | None = None, col: int | None = None, kind: str = "go"):
        where = "" if line is None else (f"{line}:{col}: " if col is not None else f"line {line}: ")
        super().__init__(f"{kind} template: {where}{msg}")
        self.msg = msg
        self.line = line
        self.col = col
        self.kind = kind


def line_col(src: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of a character offset in `src`."""
    line = src.count("\n", 0, offset) + 1
    col = offset - (src.rfind("\n", 0, offset) + 1) + 1
    return line, col
