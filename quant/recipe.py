"""llama-quantize's per-tensor type choice (`llama_tensor_get_type`) for the file types localrt writes.

Pure: `plan(tensors, metadata, ftype)` maps each tensor to the ggml type it gets. Without an importance
matrix, as `llama-quantize` runs by default. Of the IQ* types only IQ4_NL and IQ4_XS are offered (the others
need an importance matrix or have no kernels here); TQ*, Q2_K_S and MXFP4 are not.

MXFP4 (gpt-oss's expert weights) is read, never chosen: llama-quantize's MXFP4_MOE writes it only for the stacked
expert tensors (the rest Q8_0), so as a target it is refused by name. A tensor that already is MXFP4 keeps its
blocks whatever the target (llama-quantize would refuse it without --allow-requantize, or dequantize it to the
target type): it is 4.25 bits per weight already, and the precision gpt-oss's experts were trained in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quant.formats import FORMATS, GGMLType, QuantError


@dataclass(frozen=True)
class FileType:
    name: str  # as Ollama / llama-quantize spell it
    value: int  # general.file_type (llama_ftype)
    default_type: int  # ggml type most weights get


FILE_TYPES: dict[str, FileType] = {
    ft.name.lower(): ft
    for ft in (
        FileType("F32", 0, GGMLType.F32),
        FileType("F16", 1, GGMLType.F16),
        FileType("BF16", 32, GGMLType.BF16),
        FileType("Q4_0", 2, GGMLType.Q4_0),
        FileType("Q4_1", 3, GGMLType.Q4_1),
        FileType("Q8_0", 7, GGMLType.Q8_0),
        FileType("Q5_0", 8, GGMLType.Q5_0),
        FileType("Q5_1", 9, GGMLType.Q5_1),
        FileType("Q2_K", 10, GGMLType.Q2_K),
        FileType("Q3_K_S", 11, GGMLType.Q3_K),
        FileType("Q3_K_M", 12, GGMLType.Q3_K),
        FileType("Q3_K_L", 13, GGMLType.Q3_K),
        FileType("Q4_K_S", 14, GGMLType.Q4_K),
        FileType("Q4_K_M", 15, GGMLType.Q4_K),
        FileType("Q5_K_S", 16, GGMLType.Q5_K),
        FileType("Q5_K_M", 17, GGMLType.Q5_K),
        FileType("Q6_K", 18, GGMLType.Q6_K),
        FileType("IQ4_NL", 25, GGMLType.IQ4_NL),
        FileType("IQ4_XS", 30, GGMLType.IQ4_XS),
    )
}

# llama.cpp's tensor_type_fallback, for a row length that is not a whole number of blocks
_FALLBACK = {
    GGMLType.Q4_K: GGMLType.Q5_0,
    GGMLType.Q5_K: GGMLType.Q5_1,
    GGMLType.Q6_K: GGMLType.Q8_0,
    GGMLType.Q2_K: GGMLType.Q4_0,
    GGMLType.Q3_K: GGMLType.Q4_0,
    GGMLType.IQ4_XS: GGMLType.IQ4_NL,
}

# name fragments llama.cpp never quantizes (besides norms, 1-D tensors and non-"weight" tensors)
_KEEP_FRAGMENTS = (
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
_LAYER = re.compile(r"blk\.(\d+)\.")


# file types llama-quantize has that are refused by name, with why
_REFUSED = {
    "mxfp4_moe": "llama-quantize's MXFP4_MOE writes MXFP4 for mixture-of-experts tensors only (the rest Q8_0), "
    "and MXFP4 weights are read here but not written",
    "mxfp4": "MXFP4 is a block format for mixture-of-experts tensors only (llama-quantize's MXFP4_MOE), "
    "and MXFP4 weights are read here but not written",
}


def get_file_type(name: str) -> FileType:
    ft = FILE_TYPES.get(name.lower())
    if ft is None and name.lower() in _REFUSED:
        raise QuantError(
            f"unsupported quantization type {name!r}: {_REFUSED[name.lower()]}; choose one of "
            + ", ".join(f.name for f in FILE_TYPES.values())
        )
    if ft is None:
        raise QuantError(
            f"unsupported quantization type {name!r}; choose one of " + ", ".join(f.name for f in FILE_TYPES.values())
        )
    return ft


def llama_order(names) -> list[str]:
    """The order llama-quantize visits (and writes) tensors: non-layer tensors, then by layer, by name."""

    def key(name: str):
        m = _LAYER.match(name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(names, key=key)


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """llama.cpp's tensor_allows_quantization (with the output tensor quantized, its default), and, as Ollama's
    quantizer, never a vision tower's tensor inside a text model's file (`v.*`, `mm.*`: gemma3 files from Ollama's
    library): it is not this file's text model to quantize, and its rows (a 14-wide patch embedding) often do not
    fit a block."""
    return (
        len(shape) >= 2
        and not name.startswith(("v.", "mm."))
        and name.endswith("weight")
        and "_norm.weight" not in name
        and name not in _KEEP_NAMES
        and not any(f in name for f in _KEEP_FRAGMENTS)
    )


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The layers Q4_K_M / Q5_K_M give more bits: first and last eighth, and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for cat in (
        "attn_qkv.weight",
        "attn_kv_b.weight",
        "attn_v.weight",
        "attn_k.weight",
        "attn_q.weight",
        "attn_output.weight",
        "ffn_up",
        "ffn_gate",
        "ffn_down",
    ):
        if cat in name:
            return cat.removesuffix(".weight")
    return "other"


@dataclass
class _Model:
    arch: str
    n_layer: int
    n_expert: int
    n_gqa: int  # query heads per KV head
    is_70b: bool  # llama.cpp gives a 70B model's attn_v more bits
    tied: bool
    n_attention_wv: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0


def _recipe_type(m: _Model, ft: FileType, name: str, ne0: int) -> int:
    """llama_tensor_get_type_impl, restricted to the file types in FILE_TYPES."""
    cat = _category(name)
    new = ft.default_type
    if cat == "output" or (m.tied and cat == "token_embd"):
        if m.arch == "falcon" or ne0 % FORMATS[new].block_size:
            return GGMLType.Q8_0
        return new if new == GGMLType.Q8_0 else GGMLType.Q6_K
    if cat == "token_embd":
        return new
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        new = _attn_v_type(m, ft.name, new)
        m.i_attention_wv += 1
    elif cat == "attn_k" and m.n_expert == 8:
        new = GGMLType.Q8_0
    elif cat == "ffn_down":
        new = _ffn_down_type(m, ft.name, new, _ffn_down_layer(m, name))
        m.i_ffn_down += 1
    elif cat == "attn_output":
        new = _attn_output_type(m, ft.name, new)
    return new


def _attn_v_type(m: _Model, ftype: str, new: int) -> int:
    if ftype == "Q2_K":
        new = GGMLType.Q4_K if m.n_gqa >= 4 else GGMLType.Q3_K
    elif ftype == "Q3_K_M":
        new = GGMLType.Q5_K if m.i_attention_wv < 2 else GGMLType.Q4_K
    elif ftype == "Q3_K_L":
        new = GGMLType.Q5_K
    elif ftype in ("IQ4_NL", "IQ4_XS") and m.n_gqa >= 4:
        new = GGMLType.Q5_K
    elif ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(m.i_attention_wv, m.n_attention_wv):
        new = GGMLType.Q6_K
    elif ftype == "Q4_K_S" and m.i_attention_wv < 4:
        new = GGMLType.Q5_K
    if m.is_70b and new in (GGMLType.Q3_K, GGMLType.Q4_K):
        new = GGMLType.Q5_K
    return GGMLType.Q8_0 if m.n_expert == 8 else new


def _ffn_down_layer(m: _Model, name: str) -> int:
    if m.n_expert == 1:
        return m.i_ffn_down
    # experts' ffn_down tensors are not consecutive: take the layer from the name
    match = _LAYER.match(name)
    if match is None or not 0 <= int(match.group(1)) < m.n_layer:
        raise QuantError(f"cannot tell the layer of tensor {name!r}")
    return int(match.group(1))


def _ffn_down_type(m: _Model, ftype: str, new: int, i_layer: int) -> int:
    n, falcon, more = m.n_layer, m.arch == "falcon", use_more_bits(i_layer, m.n_layer)
    if ftype == "Q2_K":
        return GGMLType.Q3_K
    if ftype == "Q3_K_M":
        return GGMLType.Q5_K if i_layer < n // 16 else GGMLType.Q4_K if not falcon or more else GGMLType.Q3_K
    if ftype == "Q3_K_L":
        return GGMLType.Q4_K if falcon else GGMLType.Q5_K
    if ftype == "Q4_K_M" and falcon:
        return GGMLType.Q6_K if i_layer < n // 16 else GGMLType.Q5_K if more else GGMLType.Q4_K
    if ftype in ("IQ4_NL", "IQ4_XS") and i_layer < n // 8:  # without an importance matrix only
        return GGMLType.Q5_K
    if ftype in ("Q4_K_M", "Q5_K_M") and more:
        return GGMLType.Q6_K
    if ftype == "Q4_K_S" and not falcon and i_layer < n // 8:
        return GGMLType.Q5_K
    return new


def _attn_output_type(m: _Model, ftype: str, new: int) -> int:
    if m.arch == "falcon":
        return GGMLType.Q4_K if ftype == "Q3_K_L" else new
    if m.n_expert == 8:
        bumped = ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS")
        return GGMLType.Q5_K if bumped else new
    return {"Q2_K": GGMLType.Q3_K, "Q3_K_M": GGMLType.Q4_K, "Q3_K_L": GGMLType.Q5_K}.get(ftype, new)


def _fallback(name: str, ggml_type: int, ne0: int) -> int:
    if ne0 % FORMATS[ggml_type].block_size == 0:
        return ggml_type
    alt = _FALLBACK.get(ggml_type)
    if alt is None:
        raise QuantError(
            f"tensor {name!r}: row length {ne0} is not a multiple of the "
            f"{FORMATS[ggml_type].name} block size and {FORMATS[ggml_type].name} has no fallback"
        )
    return alt if ne0 % FORMATS[alt].block_size == 0 else GGMLType.F16


def _first(value) -> int:
    """A per-layer hyperparameter array's first entry, or the scalar itself (llama.cpp reads layer 0)."""
    if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0):
        return int(value[0]) if len(value) else 0
    return int(value)


def plan(tensors: list[tuple[str, tuple[int, ...], int]], metadata: dict, ftype: str) -> dict[str, int]:
    """(name, shape in NumPy order, current ggml type) per tensor -> {name: target ggml type}.

    Visits tensors in llama-quantize's order (see `llama_order`), which the layer counters depend on. An MXFP4
    tensor keeps its type (see the module's docstring); it still counts where llama.cpp's counters count it.
    """
    ft = get_file_type(ftype)
    arch = str(metadata.get("general.architecture", ""))
    names = [t[0] for t in tensors]
    by_name = {t[0]: t for t in tensors}
    n_layer = int(metadata.get(f"{arch}.block_count", 0))
    n_head = _first(metadata.get(f"{arch}.attention.head_count", 0))
    n_head_kv = _first(metadata.get(f"{arch}.attention.head_count_kv", n_head))
    m = _Model(
        arch=arch,
        n_layer=n_layer,
        n_expert=max(1, int(metadata.get(f"{arch}.expert_count", 0) or 0)),
        n_gqa=n_head // n_head_kv if n_head_kv else 0,
        # llama.cpp's model type: a llama with 80 layers and grouped KV heads is "70B"
        is_70b=arch == "llama" and n_layer == 80 and n_head != n_head_kv,
        tied="output.weight" not in by_name,
        n_attention_wv=sum(_category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in names),
    )
    quantized_target = ft.default_type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
    out: dict[str, int] = {}
    for name in llama_order(names):
        _, shape, current = by_name[name]
        if not allows_quantization(name, shape):
            out[name] = current
        elif not quantized_target:
            out[name] = current if current == GGMLType.MXFP4 else ft.default_type
        else:
            new = _recipe_type(m, ft, name, shape[-1])  # before the MXFP4 test: it advances the layer counters
            out[name] = current if current == GGMLType.MXFP4 else _fallback(name, new, shape[-1])
    return out
