"""Ollama's PARAMETER names and value types (ollama_spec section 5), and typed parsing of their values.

Names are case-sensitive. Values are parsed the way Ollama parses them (Go's strconv rules), except
that NaN and infinities are refused: no sampler option is meaningful with them."""

from __future__ import annotations

import math
import re

INT, FLOAT, BOOL, STRING, STRINGS = "int", "float", "bool", "string", "string list"

TYPES: dict[str, str] = {
    "num_ctx": INT,
    "num_batch": INT,
    "num_gpu": INT,
    "main_gpu": INT,
    "use_mmap": BOOL,
    "num_thread": INT,
    "num_keep": INT,
    "seed": INT,
    "num_predict": INT,
    "top_k": INT,
    "top_p": FLOAT,
    "min_p": FLOAT,
    "typical_p": FLOAT,
    "repeat_last_n": INT,
    "temperature": FLOAT,
    "repeat_penalty": FLOAT,
    "presence_penalty": FLOAT,
    "frequency_penalty": FLOAT,
    "stop": STRINGS,
    # speculative decoding (localrt's, not Ollama's): prompt-lookup draft length; a draft model's name
    "draft_num_predict": INT,
    "draft_model": STRING,
}

# Accepted in a Modelfile with a warning and then skipped, as Ollama does. `numa` and `tfs_z` were removed
# from Ollama earlier than the others; old Modelfiles still carry them, so they are treated the same way.
DEPRECATED = frozenset(
    [
        "penalize_newline",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mlock",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "numa",
        "tfs_z",
    ]
)

_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_TRUE = frozenset(["1", "t", "T", "TRUE", "true", "True"])
_FALSE = frozenset(["0", "f", "F", "FALSE", "false", "False"])
_INT64 = (-(2**63), 2**63 - 1)


class ParamError(ValueError):
    pass


def parse_value(name: str, text: str) -> object:
    """Typed value of PARAMETER `name` from its text. Raises ParamError with a message for the user."""
    kind = TYPES.get(name)
    if kind is None:
        raise ParamError(f"unknown parameter '{name}'")
    if kind == INT:
        if not _INT_RE.fullmatch(text) or not _INT64[0] <= int(text) <= _INT64[1]:
            raise ParamError(f"invalid int value {text!r} for parameter '{name}'")
        return int(text)
    if kind == FLOAT:
        if not _FLOAT_RE.fullmatch(text) or not math.isfinite(float(text)):
            raise ParamError(f"invalid float value {text!r} for parameter '{name}'")
        return float(text)
    if kind == BOOL:
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ParamError(f"invalid bool value {text!r} for parameter '{name}'")
    return text


def check_json_value(name: str, value: object) -> None:
    """Validate a value as found in a params layer (JSON): used when formatting stored parameters."""
    kind = TYPES.get(name)
    if kind is None:
        return
    ok = {
        INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
        FLOAT: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        BOOL: lambda v: isinstance(v, bool),
        STRING: lambda v: isinstance(v, str),
        STRINGS: lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
    }[kind](value)
    if not ok:
        raise ParamError(f"parameter '{name}' should be {kind}, got {value!r}")
