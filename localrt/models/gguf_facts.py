"""What `create` and `show` read from a GGUF file's header: architecture, parameter count, file type, and
whether the engine's validator accepts it as a model (the same check the loader makes)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gguf_io

from ..errors import InvalidModel, InvalidRequest


class CreateError(InvalidRequest):
    """A Modelfile or create request that cannot be turned into a model."""


# llama.cpp's `general.file_type` ids (enum llama_ftype) -> the names Ollama shows.
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4",
}


_NOT_MODELS = ("clip", "mllama_vision")  # vision projectors


def human_number(n: int) -> str:
    """Parameter count as Ollama prints it: 8B, 8.0B, 134.52M, 137M, 22K, 512."""
    for scale, suffix, decimals in ((10**9, "B", 1), (10**6, "M", 2)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{suffix}" if x == int(x) else f"{x:.{decimals}f}{suffix}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


# ----- GGUF facts ---------------------------------------------------------------------------------------


def _tensor_elements(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _file_type_name(meta: dict, tensors: dict) -> str:
    ft = meta.get("general.file_type")
    if isinstance(ft, int) and ft in FILE_TYPES:
        return FILE_TYPES[ft]
    # No (known) file type: name the type most weights (tensors of 2+ dims) are stored in.
    kinds = Counter(t.ggml_type for t in tensors.values() if len(t.shape) >= 2)
    if not kinds:
        return "unknown"
    try:
        return gguf_io.GGMLType(kinds.most_common(1)[0][0]).name
    except ValueError:
        return "unknown"


def gguf_facts(path: Path, scan: bool = False) -> dict:
    """Validate a GGUF with gguf_io (InvalidGGUF for a malformed file) and return what create needs.

    For a model file (not an adapter, a split part or a vision projector) `invalid` is the InvalidModel the
    loader would raise for it (localrt.engine.validate: hyperparameters against the tensors), or None;
    `_check_model_gguf` raises it, so a file that cannot run is refused when it is created. With `scan` (create's
    check of the stored blob) every weight is also read for NaN / inf (localrt.engine.finite: ~12 ms for SmolLM2,
    ~18 ms for Gemma 3 from the page cache), which loading does not repeat."""
    with gguf_io.open(path) as f:
        meta, tensors = f.metadata, f.tensors
        count = meta.get("general.parameter_count")
        if not isinstance(count, int) or count <= 0:
            count = sum(_tensor_elements(t.shape) for t in tensors.values())
        facts = {
            "architecture": str(meta.get("general.architecture") or ""),
            "type": str(meta.get("general.type") or "model"),
            "split_count": int(meta.get("split.count") or 0),
            "parameter_count": count,
            "file_type": _file_type_name(meta, tensors),
            "adapter_type": str(meta.get("adapter.type") or ""),
        }
        facts["invalid"] = _model_problem(facts, meta, tensors, scan)
        return facts


def _model_problem(facts: dict, meta: dict, tensors: dict, scan: bool = False) -> InvalidModel | None:
    """What the loader's validation says about a model file (header and small vectors only: ~1 ms), and with `scan`
    whether its weights are all finite."""
    if facts["type"] == "adapter" or facts["split_count"] > 1 or facts["architecture"] in _NOT_MODELS:
        return None
    from ..engine.finite import check_finite
    from ..engine.model import (
        config_from_metadata,  # the engine's imports (Numba) only once a model file is seen
    )

    from ..engine.compat import ollama_layout, text_tensors

    try:
        config_from_metadata(*ollama_layout(meta, text_tensors(tensors)))
        if scan:
            check_finite(tensors)
    except InvalidModel as e:
        return e
    return None


def config_from_gguf(facts: dict) -> dict:
    arch = facts["architecture"]
    return {
        "model_format": "gguf",
        "model_family": arch,
        "model_families": [arch] if arch else [],
        "model_type": human_number(facts["parameter_count"]),
        "file_type": facts["file_type"],
    }


def _check_model_gguf(facts: dict, what: str) -> None:
    if facts["split_count"] > 1:
        raise CreateError(
            f"{what} is one part of a split GGUF set ({facts['split_count']} parts); "
            "merge it first with llama-gguf-split --merge"
        )
    if facts["type"] == "adapter":
        raise CreateError(f"{what} is a LoRA adapter, not a model; use it with ADAPTER")
    if facts["architecture"] in _NOT_MODELS:
        raise CreateError(f"{what} is a vision projector; vision models are not supported")
    if not facts["architecture"]:
        raise CreateError(f"{what} has no general.architecture; it is not a model GGUF")
    if facts.get("invalid") is not None:
        raise facts["invalid"]  # InvalidModel: the key and both numbers, as loading would say
