"""What Ollama's own library files carry beyond, or name otherwise than, llama.cpp's layout.

Ollama's files of three families are translated in memory at load, as Ollama's llama.cpp compatibility layer
(llama/compat in its tree) translates them for llama-server (`ollama_layout`; nothing on disk changes):
- gpt-oss, architecture `gptoss`: its keys keep that prefix (the gpt-oss family reads either); the tensors
  `attn_out`, `attn_sinks` and `ffn_norm` are llama.cpp's `attn_output`, `attn_sinks.weight` and
  `post_attention_norm`; a file without `expert_feed_forward_length` takes it from blk.0.ffn_gate_exps, and one
  without `rope.scaling.type` is YaRN (Ollama's converter writes the factor only; llama.cpp's default, linear, would
  scale the positions wrongly without a word). Its pre-tokenizer is `gpt-4o` whatever the file says (Ollama's say
  `default`, which splits prompts otherwise).
- gemma3 from Ollama's converter, known by any of its quirks (an embedded vision tower or its keys, the rope bases
  named `rope.global.freq_base` / `rope.local.freq_base`, `tokenizer.ggml.add_padding_token` or
  `add_unknown_token`, no `attention.layer_norm_rms_epsilon`): those bases are `rope.freq_base` and
  `rope.freq_base_swa`; missing keys take gemma3's own values, not the generic defaults (eps 1e-6, not 1e-5; base
  1000000 and 10000 for local layers; a 131072 context means linear rope scaling by 8, as the 4B-27B configs say);
  tokenizer arrays longer than token_embd (Ollama keeps the multimodal tokens) are cut to its rows. Without this
  such a file would run with the wrong eps or rope base without a word, or be refused for its vocabulary.
- EmbeddingGemma from that converter, architecture `gemma3` with a `dense.0.weight`: it is `gemma-embedding` (its
  `gemma3.*` keys under that prefix but `attention.causal` and `attention.sliding_window_pattern`, its rope bases
  read as above), `dense.0`/`dense.1` are `dense_2`/`dense_3` (their widths from their shapes), `norm.weight` is
  `output_norm.weight`. Ollama's converter writes llama.cpp's layout now; files pulled earlier keep the old one.
A file holding a tensor under both names is refused: one of the two would be dropped without a word.

Ollama's own converter writes the vision tower and its projector into the text model's GGUF (gemma3: tensors
`v.*` such as `v.blk.0.attn_q.weight` and `mm.*` such as `mm.mm_input_projection.weight`, metadata
`gemma3.vision.*` and `gemma3.mm.tokens_per_image`), where llama.cpp keeps them in a separate mmproj file and its
text model never looks them up. This runtime runs the text model only: those tensors are set aside before the
validator, the private copy of the weights and the memory estimate see the file, so the model is exactly the one
a text-only file of the same weights gives, and the load says so once. `show` does not claim `vision`.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from ..errors import InvalidModel

log = logging.getLogger("localrt.engine")

# the tower (Ollama's and llama.cpp's mmproj names) and the projector; no architecture here has a tensor named so
VISION_PREFIXES = ("v.", "mm.")

T = TypeVar("T")


def text_tensors(tensors: Mapping[str, T]) -> dict[str, T]:
    """The tensors the text model may use: all but the vision tower's and projector's."""
    return {name: t for name, t in tensors.items() if not name.startswith(VISION_PREFIXES)}


def text_model_tensors(metadata: Mapping, tensors: Mapping[str, T]) -> dict[str, T]:
    """text_tensors, and one log line when there were others (the loader's call: once per load)."""
    kept = text_tensors(tensors)
    if len(kept) != len(tensors):
        arch = metadata.get("general.architecture") or "model"
        log.warning(
            "%s: %d vision tensors ignored: this runtime runs the text model only", arch, len(tensors) - len(kept)
        )
    return kept


# Ollama's gptoss tensor names -> llama.cpp's (a substring of the name, once).
_GPTOSS_RENAMES = (
    (re.compile(r"\.attn_out\."), ".attn_output."),
    (re.compile(r"\.attn_sinks$"), ".attn_sinks.weight"),
    (re.compile(r"\.ffn_norm\."), ".post_attention_norm."),
)
_EMBEDDINGGEMMA_RENAMES = {
    "dense.0.weight": "dense_2.weight",
    "dense.1.weight": "dense_3.weight",
    "norm.weight": "output_norm.weight",
}


def ollama_layout(metadata: Mapping, tensors: Mapping[str, T]) -> tuple[Mapping, Mapping[str, T]]:
    """(metadata, tensors) of the file as llama.cpp lays that model out: translated copies for Ollama's gptoss,
    gemma3 and embeddinggemma layouts (see above), the same objects for any other file."""
    arch = metadata.get("general.architecture")
    if arch == "gptoss":
        return _gptoss(metadata, tensors)
    if arch == "gemma3":
        if "dense.0.weight" in tensors:
            return _embeddinggemma(_gemma3_rope_bases(metadata), tensors)
        if _ollama_gemma3(metadata, tensors):
            return _gemma3(metadata, tensors), tensors
    return metadata, tensors


def _gemma3_rope_bases(metadata: Mapping) -> dict:
    md = dict(metadata)
    for old, new in (("global", "freq_base"), ("local", "freq_base_swa")):
        if f"gemma3.rope.{old}.freq_base" in md:
            md[f"gemma3.rope.{new}"] = md[f"gemma3.rope.{old}.freq_base"]
    return md


def _ollama_gemma3(metadata: Mapping, tensors: Mapping) -> bool:
    """Whether a gemma3 file shows one of the quirks of Ollama's converters (Ollama's own test)."""
    quirk_keys = (
        "gemma3.mm.tokens_per_image",
        "gemma3.rope.global.freq_base",
        "gemma3.rope.local.freq_base",
        "tokenizer.ggml.add_padding_token",
        "tokenizer.ggml.add_unknown_token",
    )
    return (
        any(k in metadata for k in quirk_keys)
        or "gemma3.attention.layer_norm_rms_epsilon" not in metadata
        or any(name.startswith(VISION_PREFIXES) for name in tensors)
    )


def _gemma3(metadata: Mapping, tensors: Mapping) -> dict:
    md = _gemma3_rope_bases(metadata)
    md.setdefault("gemma3.attention.layer_norm_rms_epsilon", float(np.float32(1e-6)))  # as a file's float32 holds it
    md.setdefault("gemma3.rope.freq_base", 1000000.0)
    md.setdefault("gemma3.rope.freq_base_swa", 10000.0)
    if _int(md.get("gemma3.context_length")) >= 131072 and "gemma3.rope.scaling.type" not in md:
        md["gemma3.rope.scaling.type"] = "linear"
        md.setdefault("gemma3.rope.scaling.factor", 8.0)
    shape = getattr(tensors.get("token_embd.weight"), "shape", ())
    if len(shape) == 2:  # NumPy order: (n_vocab, n_embd)
        rows = int(shape[0])
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            values = md.get(key)
            if values is not None and len(values) > rows:
                md[key] = values[:rows]
    log.info("gemma3: a file of Ollama's converter, read with gemma3's own defaults")
    return md


def _int(value) -> int:
    """value as an int, or 0 for anything that is not one (the validator judges it later)."""
    try:
        return 0 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return 0


def _renamed(name: str, renames) -> str:
    for pattern, new in renames:
        name = pattern.sub(new, name, count=1)
    return name


def _unique(renamed: list[tuple[str, str]], arch: str) -> None:
    """Refuses a file where two tensors come to one name ([(file name, new name)])."""
    seen: dict[str, str] = {}
    for name, new in renamed:
        if new in seen:
            raise InvalidModel(f"{arch} file holds both {seen[new]} and {name}, which name the same tensor")
        seen[new] = name


def _gptoss(metadata: Mapping, tensors: Mapping[str, T]) -> tuple[dict, dict[str, T]]:
    md = dict(metadata)
    names = [(name, _renamed(name, _GPTOSS_RENAMES)) for name in tensors]
    _unique(names, "gptoss")
    out = {new: tensors[name] for name, new in names}
    gate = out.get("blk.0.ffn_gate_exps.weight")
    shape = getattr(gate, "shape", ())
    if "gptoss.expert_feed_forward_length" not in md and len(shape) == 3:  # (n_expert, n_ff_exp, n_embd)
        md["gptoss.expert_feed_forward_length"] = int(shape[1])
    md.setdefault("gptoss.rope.scaling.type", "yarn")
    md["tokenizer.ggml.pre"] = "gpt-4o"
    if out.keys() != tensors.keys():
        log.info("gptoss: Ollama's tensor names read as llama.cpp's gpt-oss ones")
    return md, out


def _embeddinggemma(metadata: Mapping, tensors: Mapping[str, T]) -> tuple[dict, dict[str, T]]:
    md = {
        ("gemma-embedding." + k[len("gemma3.") :] if k.startswith("gemma3.") else k): v
        for k, v in metadata.items()
        if k not in ("gemma3.attention.causal", "gemma3.attention.sliding_window_pattern")
    }
    md["general.architecture"] = "gemma-embedding"
    md.setdefault("gemma-embedding.rope.freq_base_swa", 10000.0)
    names = [(name, _EMBEDDINGGEMMA_RENAMES.get(name, name)) for name in tensors]
    _unique(names, "gemma3 (embeddinggemma)")
    out = {new: tensors[name] for name, new in names}
    for which in ("2", "3"):
        shape = getattr(out.get(f"dense_{which}.weight"), "shape", ())
        if len(shape) == 2:  # NumPy order: (outputs, inputs)
            md[f"gemma-embedding.dense_{which}_feat_out"], md[f"gemma-embedding.dense_{which}_feat_in"] = map(
                int, shape
            )
    log.info("gemma3 with dense layers: Ollama's embeddinggemma, read as llama.cpp's gemma-embedding")
    return md, out
