"""Typed errors of schema compilation; all are `InvalidRequest`, so the server answers 400."""

from __future__ import annotations

from ..errors import InvalidRequest


class SchemaError(InvalidRequest):
    """`format` is not "json" nor a JSON schema this compiler accepts."""


class UnsupportedSchema(SchemaError):
    """A schema keyword (or combination) that constrained decoding does not implement; never ignored."""

    def __init__(self, keyword: str, where: str = "", why: str = ""):
        at = f" at {where}" if where else ""
        super().__init__(f"unsupported JSON schema keyword {keyword!r}{at}" + (f": {why}" if why else ""))
        self.keyword = keyword


class SchemaTooComplex(SchemaError):
    """The schema would need more automaton states, nesting or time than the fixed bounds allow."""


class PatternError(SchemaError):
    """A `pattern` that is malformed or uses regex features outside the supported subset."""

    def __init__(self, pattern: str, why: str):
        shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
        super().__init__(f"unsupported or invalid pattern {shown!r}: {why}")
        self.pattern = pattern
