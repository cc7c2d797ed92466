"""Split GGUF sets (`<prefix>-00001-of-0000N.gguf`, `split.*` keys) opened as one model."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .constants import GGUFValueType, InvalidGGUF
from .reader import GGUFFile, open_file
from .writer import write

# gguf-split names part k (1-based) of n as "%s-%05d-of-%05d.gguf"; split.no inside is 0-based.
_PART_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_path(prefix: str | os.PathLike, no: int, count: int) -> Path:
    """Path of part `no` (1-based) of a `count`-part set."""
    return Path(f"{prefix}-{no:05d}-of-{count:05d}.gguf")


def open_model(path: str | os.PathLike, *, lazy_strings: bool = False) -> GGUFFile:
    """Opens a GGUF file; the first part of a split set opens every part as one model.

    lazy_strings: metadata string arrays are `StringArray`s over the mapping (see `open_file`)."""
    first = open_file(path, lazy_strings=lazy_strings)
    try:
        count = _split_count(first)
        return first if count == 1 else _open_rest(first, count)
    except BaseException:
        first.close()
        raise


def _split_count(first: GGUFFile) -> int:
    meta = first.metadata
    if "split.count" not in meta:
        return 1
    count, no = meta["split.count"], meta.get("split.no")
    if count < 1:
        raise InvalidGGUF(f"{first.path}: split.count is {count}")
    if no is None or "split.tensors.count" not in meta:
        raise InvalidGGUF(f"{first.path}: split.count without split.no / split.tensors.count")
    if no != 0:
        raise InvalidGGUF(
            f"{first.path}: this is part {no + 1} of a {count}-part split GGUF; "
            f"open the first part ({_first_name(first.path, count)})"
        )
    return count


def _first_name(path: Path, count: int) -> str:
    m = _PART_NAME.match(path.name)
    return part_path(m["prefix"], 1, count).name if m else f"...-00001-of-{count:05d}.gguf"


def _part_paths(first: GGUFFile, count: int) -> list[Path]:
    m = _PART_NAME.match(first.path.name)
    if not m or int(m["no"]) != 1 or int(m["count"]) != count:
        raise InvalidGGUF(
            f"{first.path}: split.count is {count} but the name is not "
            f"'<prefix>-00001-of-{count:05d}.gguf', so the other parts cannot be found"
        )
    paths = [first.path.with_name(part_path(m["prefix"], no, count).name) for no in range(2, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise InvalidGGUF(
            f"{first.path}: split GGUF is missing {len(missing)} of its {count} parts: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    return paths


def _open_rest(first: GGUFFile, count: int) -> GGUFFile:
    parts = [first]
    try:
        for no, path in enumerate(_part_paths(first, count), start=1):
            parts.append(open_file(path))
            _check_part(first, parts[-1], no, count)
        return _merge(parts)
    except BaseException:
        for part in parts[1:]:
            part.close()
        raise


def _check_part(first: GGUFFile, part: GGUFFile, no: int, count: int) -> None:
    meta = part.metadata
    want = {"split.no": no, "split.count": count, "split.tensors.count": first.metadata["split.tensors.count"]}
    for key, value in want.items():
        if meta.get(key) != value:
            raise InvalidGGUF(
                f"{part.path}: {key} is {meta.get(key)}, expected {value} for part {no + 1} "
                f"of {count} of {first.path.name} (a part of another model or split?)"
            )


def _merge(parts: list[GGUFFile]) -> GGUFFile:
    first = parts[0]
    tensors = {}
    for part in parts:
        for name, info in part.tensors.items():
            if name in tensors:
                raise InvalidGGUF(f"{part.path}: tensor {name!r} is also in an earlier part of the split set")
            tensors[name] = info
    expected = first.metadata["split.tensors.count"]
    if len(tensors) != expected:
        raise InvalidGGUF(f"{first.path}: split set holds {len(tensors)} tensors, split.tensors.count says {expected}")
    maps = [mm for part in parts for mm in part._maps]
    return GGUFFile(
        first.path,
        first.version,
        first.alignment,
        first.data_offset,
        first.metadata,
        first.metadata_types,
        tensors,
        maps,
        tuple(p.path for p in parts),
    )


def write_split(
    prefix: str | os.PathLike,
    metadata: dict,
    tensors: list[tuple],
    n_parts: int,
    *,
    metadata_types: dict | None = None,
    alignment: int | None = None,
) -> list[Path]:
    """Writes `tensors` over `n_parts` files as gguf-split does: all metadata in the first part only."""
    if not 1 <= n_parts <= max(len(tensors), 1):
        raise ValueError(f"cannot split {len(tensors)} tensors into {n_parts} non-empty parts")
    per_part = -(-len(tensors) // n_parts)
    paths = []
    for i in range(n_parts):
        split_keys = {"split.no": i, "split.count": n_parts, "split.tensors.count": len(tensors)}
        split_types = {
            "split.no": GGUFValueType.UINT16,
            "split.count": GGUFValueType.UINT16,
            "split.tensors.count": GGUFValueType.INT32,
        }
        meta = {**metadata, **split_keys} if i == 0 else split_keys
        types = {**(metadata_types or {}), **split_types}
        path = part_path(prefix, i + 1, n_parts)
        write(path, meta, tensors[i * per_part : (i + 1) * per_part], metadata_types=types, alignment=alignment)
        paths.append(path)
    return paths
