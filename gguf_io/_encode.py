"""Metadata value encoding for the writer: type inference and checked packing."""

from __future__ import annotations

import struct

import numpy as np

from .constants import SCALAR_DTYPES, GGUFValueType

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_DTYPE_TO_VTYPE = {dt.newbyteorder("<"): t for t, dt in SCALAR_DTYPES.items()}


def infer_spec(value: object, key: str) -> object:
    """The value type a Python value is written as when the caller gives none."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32 if 0 <= value < 2**32 else GGUFValueType.INT64
    if isinstance(value, np.generic):
        return _dtype_vtype(value.dtype, key)
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, np.ndarray):
        return (GGUFValueType.ARRAY, _dtype_vtype(value.dtype, key))
    if isinstance(value, (list, tuple)):
        return _infer_list(list(value), key)
    raise ValueError(f"metadata {key!r}: cannot write a value of type {type(value).__name__}")


def _dtype_vtype(dtype: np.dtype, key: str) -> GGUFValueType:
    vtype = _DTYPE_TO_VTYPE.get(np.dtype(dtype).newbyteorder("<"))
    if vtype is None:
        raise ValueError(f"metadata {key!r}: NumPy dtype {dtype} has no GGUF value type")
    return vtype


def _infer_list(items: list, key: str) -> object:
    if not items:
        raise ValueError(f"metadata {key!r}: empty list; give its type in metadata_types")
    if all(isinstance(v, str) for v in items):
        return (GGUFValueType.ARRAY, GGUFValueType.STRING)
    if all(isinstance(v, (list, tuple, np.ndarray)) for v in items):
        return (GGUFValueType.ARRAY, GGUFValueType.ARRAY, tuple(infer_spec(v, key) for v in items))
    if all(isinstance(v, bool) for v in items):
        return (GGUFValueType.ARRAY, GGUFValueType.BOOL)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        fits = all(-(2**31) <= v < 2**31 for v in items)
        return (GGUFValueType.ARRAY, GGUFValueType.INT32 if fits else GGUFValueType.INT64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        return (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
    raise ValueError(f"metadata {key!r}: list mixes element types; give its type in metadata_types")


def encode_kv(key: str, value: object, spec: object) -> bytes:
    """key string + value type + value, as laid out in the KV section."""
    head = _string(key, key)
    if isinstance(spec, tuple):
        return head + _U32.pack(GGUFValueType.ARRAY) + _array_body(value, spec, key)
    return head + _U32.pack(spec) + _scalar(value, GGUFValueType(spec), key)


def _string(text: object, key: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"metadata {key!r}: expected str, got {type(text).__name__}")
    raw = text.encode("utf-8")
    return _U64.pack(len(raw)) + raw


def _scalar(value: object, vtype: GGUFValueType, key: str) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _string(value, key)
    if vtype == GGUFValueType.ARRAY:
        raise ValueError(f"metadata {key!r}: ARRAY needs a (ARRAY, element type) spec")
    return _numeric(np.asarray([value]), vtype, key)


def _array_body(value: object, spec: tuple, key: str) -> bytes:
    etype = GGUFValueType(spec[1])
    items = list(value) if etype in (GGUFValueType.STRING, GGUFValueType.ARRAY) else value
    count = _U32.pack(etype) + _U64.pack(len(items))
    if etype == GGUFValueType.STRING:
        return count + b"".join(_string(s, key) for s in items)
    if etype == GGUFValueType.ARRAY:
        inner = spec[2] if len(spec) > 2 else tuple(infer_spec(v, key) for v in items)
        if len(inner) != len(items):
            raise ValueError(f"metadata {key!r}: {len(inner)} element specs for {len(items)} arrays")
        return count + b"".join(_array_body(v, s, key) for v, s in zip(items, inner))
    return count + _numeric(np.asarray(value), etype, key)


def _numeric(arr: np.ndarray, vtype: GGUFValueType, key: str) -> bytes:
    dtype = SCALAR_DTYPES[vtype]
    if arr.ndim != 1:
        raise ValueError(f"metadata {key!r}: arrays must be 1-D, got shape {arr.shape}")
    _check_range(arr, vtype, dtype, key)
    return arr.astype(dtype.newbyteorder("<")).tobytes()


def _check_range(arr: np.ndarray, vtype: GGUFValueType, dtype: np.dtype, key: str) -> None:
    if arr.size == 0:
        return
    if arr.dtype.kind in "OUS":
        raise ValueError(f"metadata {key!r}: cannot write {arr.dtype} values as {vtype.name}")
    if vtype == GGUFValueType.BOOL:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"metadata {key!r}: BOOL values must be 0/1 or bool")
    elif dtype.kind in "iu":
        if arr.dtype.kind not in "iub" or not _in_int_range(arr, dtype):
            raise ValueError(f"metadata {key!r}: values do not fit {vtype.name}")
    elif arr.dtype.kind not in "iubf":
        raise ValueError(f"metadata {key!r}: cannot write {arr.dtype} values as {vtype.name}")
    elif np.isfinite(arr).all() and not _finite_after_cast(arr, dtype):
        raise ValueError(f"metadata {key!r}: values overflow {vtype.name}")


def _in_int_range(arr: np.ndarray, dtype: np.dtype) -> bool:
    info = np.iinfo(dtype)
    # Python ints compare exactly, also for uint64 / int64 extremes.
    return info.min <= int(arr.min()) and int(arr.max()) <= info.max


def _finite_after_cast(arr: np.ndarray, dtype: np.dtype) -> bool:
    with np.errstate(over="ignore"):  # the overflow is what we test for
        return bool(np.isfinite(arr.astype(dtype)).all())
