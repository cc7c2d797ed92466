"""The key/value section of a GGUF header."""

from __future__ import annotations

from ._cursor import Cursor
from .constants import (
    INTEGER_TYPES,
    MAX_ARRAY_DEPTH,
    MAX_ARRAY_LEN,
    MAX_KV,
    SCALAR_DTYPES,
    GGUFValueType,
    InvalidGGUF,
)

# Keys whose type llama.cpp fixes; a file that declares another type is malformed.
EXPECTED_TYPES: dict[str, object] = {
    "general.alignment": GGUFValueType.UINT32,
    "general.architecture": GGUFValueType.STRING,
    "tokenizer.ggml.model": GGUFValueType.STRING,
    "tokenizer.ggml.tokens": (GGUFValueType.ARRAY, GGUFValueType.STRING),
    "tokenizer.ggml.scores": (GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    "tokenizer.ggml.token_type": (GGUFValueType.ARRAY, GGUFValueType.INT32),
    "tokenizer.ggml.merges": (GGUFValueType.ARRAY, GGUFValueType.STRING),
    "tokenizer.chat_template": GGUFValueType.STRING,
}
# Keys that must hold an integer of any width (gguf-split writes u16/i32).
INTEGER_KEYS = frozenset({"split.no", "split.count", "split.tensors.count"})
# "<architecture>.<suffix>" keys that must be integer scalars (their ranges are the engine's to check).
INTEGER_ARCH_SUFFIXES = ("block_count", "context_length", "embedding_length", "vocab_size")

# Smallest encoding of one array element of each type, to bound counts before reading.
_MIN_ITEM_BYTES = {
    **{t: dt.itemsize for t, dt in SCALAR_DTYPES.items()},
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 12,
}


def read_metadata(cur: Cursor) -> tuple[dict[str, object], dict[str, object]]:
    """Reads kv_count and the pairs; returns (values, type specs) in file order."""
    n_kv = cur.count("metadata kv count", MAX_KV, 8 + 4 + 1)
    values: dict[str, object] = {}
    types: dict[str, object] = {}
    for i in range(n_kv):
        at = cur.pos
        key = cur.string(f"key of metadata pair #{i}")
        if key in values:
            raise InvalidGGUF(f"duplicate metadata key {key!r} at offset {at}")
        vtype = _value_type(cur, f"value type of {key!r}")
        values[key], types[key] = _read_value(cur, vtype, repr(key), 0)
        _check_expected(key, types[key], at)
    _check_arch_keys(values, types)
    _check_tokenizer_lengths(values)
    return values, types


def _value_type(cur: Cursor, what: str) -> GGUFValueType:
    at = cur.pos
    raw = cur.u32(what)
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise InvalidGGUF(f"unknown {what} {raw} at offset {at}") from None


def _read_value(cur: Cursor, vtype: GGUFValueType, what: str, depth: int) -> tuple[object, object]:
    if vtype == GGUFValueType.STRING:
        return cur.string(what), vtype
    if vtype != GGUFValueType.ARRAY:
        return cur.scalar(vtype, what), vtype
    if depth >= MAX_ARRAY_DEPTH:
        raise InvalidGGUF(f"{what} at offset {cur.pos}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
    etype = _value_type(cur, f"element type of {what}")
    n = cur.count(f"length of {what}", MAX_ARRAY_LEN, _MIN_ITEM_BYTES[etype])
    if etype == GGUFValueType.STRING:
        return cur.strings(n, what), (vtype, etype)
    if etype != GGUFValueType.ARRAY:
        return cur.numeric_array(etype, n, what), (vtype, etype)
    cur.charge_items(n, what)
    items = [_read_nested(cur, f"{what}[{i}]", depth + 1) for i in range(n)]
    return [v for v, _ in items], (vtype, etype, tuple(t for _, t in items))


def _read_nested(cur: Cursor, what: str, depth: int) -> tuple[object, object]:
    # An element of an array of arrays carries no type of its own: it is an array body.
    return _read_value(cur, GGUFValueType.ARRAY, what, depth)


def _check_expected(key: str, spec: object, at: int) -> None:
    want = EXPECTED_TYPES.get(key)
    if want is not None and spec != want:
        prefix = "bad alignment: " if key == "general.alignment" else ""
        raise InvalidGGUF(
            f"{prefix}metadata key {key!r} at offset {at} has type {_spec_name(spec)}, expected {_spec_name(want)}"
        )
    if key in INTEGER_KEYS and spec not in INTEGER_TYPES:
        raise InvalidGGUF(f"metadata key {key!r} at offset {at} has type {_spec_name(spec)}, expected an integer")


def _check_arch_keys(values: dict[str, object], types: dict[str, object]) -> None:
    arch = values.get("general.architecture")
    for suffix in INTEGER_ARCH_SUFFIXES if arch else ():
        key = f"{arch}.{suffix}"
        if key in types and types[key] not in INTEGER_TYPES:
            raise InvalidGGUF(f"metadata key {key!r} has type {_spec_name(types[key])}, expected an integer")


def _check_tokenizer_lengths(values: dict[str, object]) -> None:
    # Loaders index scores / token types by token id, so a shorter array is an out-of-bounds read.
    tokens = values.get("tokenizer.ggml.tokens")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in values and (tokens is None or len(values[key]) != len(tokens)):
            n_tokens = "no" if tokens is None else len(tokens)
            raise InvalidGGUF(f"metadata key {key!r} has {len(values[key])} entries for {n_tokens} tokens")


def _spec_name(spec: object) -> str:
    if isinstance(spec, tuple):
        return f"ARRAY[{_spec_name(spec[1])}]"
    return GGUFValueType(spec).name
