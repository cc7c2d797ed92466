"""The model-configuration validator, between a GGUF file's metadata and the kernels.

Every hyperparameter the forward uses is read with its type and range checked (`Keys`), then compared with
the shapes of the tensors in the file (`check_block_count`, `check_tensors`), before anything is allocated
or any kernel runs. Each error is an `InvalidModel` (a 400 at the HTTP edge) naming the GGUF key or tensor
and both numbers. `localrt.engine.config.config_from_metadata(metadata, tensors)` drives it; the loader, `create`
and the memory estimate all go through that one call.

`tensors` maps GGUF names to objects with `.shape` (NumPy order) and `.ggml_type` (gguf_io.TensorInfo or
backend.QTensor); where they also have `.data` (raw uint8 rows), small float tensors are checked for NaN/inf.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Mapping

import numpy as np

import simd_kernels

from ..errors import InvalidModel, MissingTensor

MAX_BLOCKS = 4096  # Llama 3.1 405B has 126
MAX_CONTEXT = 1 << 24  # positions; Llama 4 Scout trains 10M
MAX_WIDTH = 1 << 20  # embedding / feed-forward / per-head widths
MAX_HEADS = 1 << 12
MAX_EXPERTS = 1 << 10
MAX_TOKEN_TYPES = 1 << 10  # bert's token types (segments): real files have 1 or 2
MAX_ROPE_FACTOR = 1e6  # rope.scaling.factor (linear); real ones are 1..64
# rope_freqs / rope_factors_long / _short divide each rotation frequency: real ones are about 0.8..100 (Llama 3's
# 1..32, Phi-3's long factors up to ~60). Within 1e-6..1e6 every angle stays finite in float32 up to MAX_CONTEXT;
# zero, a denormal (theta / 1e-40 = inf, then cos(inf) = NaN) or NaN is refused.
ROPE_FACTOR_RANGE = (1.0 / MAX_ROPE_FACTOR, MAX_ROPE_FACTOR)
# rope.scaling.attn_factor multiplies q and k (the scores by its square). Converters write longrope's
# sqrt(1 + ln s / ln n_orig) and YaRN's 0.1 ln s + 1, both under 3 for any context scaling s up to 1e6; llama.cpp reads
# it unchecked, and 1e6 overflows the f16 KV cache (65504) and the scores.
MAX_ROPE_ATTN_FACTOR = 10.0
MAX_ATTN_SCALE = 1e4  # attention.scale; real ones are 1/sqrt(head size), so <= 1: larger ones overflow scores
FLOAT_MIN, FLOAT_MAX = 1e-30, 1e30  # positive float hyperparameters stay well inside float32
FINITE_SCAN_BYTES = 1 << 20  # float tensors up to this size are scanned for NaN/inf; bigger ones are not read

F32, F16, BF16 = 0, 1, 30
ROPE_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.")


def is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


class Keys:
    """Typed, range-checked reads of `<arch>.<suffix>` metadata; every error names the key and its value."""

    def __init__(self, md: Mapping, arch: str) -> None:
        self.md = md
        self.arch = arch

    def name(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.name(suffix) in self.md

    def raw(self, suffix: str, default=None, required: bool = False):
        key = self.name(suffix)
        if key in self.md:
            return self.md[key]
        if required:
            raise InvalidModel(f"model file has no metadata key {key!r}")
        return default

    def int(self, suffix: str, default: int | None = None, *, lo: int = 1, hi: int | None = None) -> int:
        """An integer scalar in lo..hi (default when absent; required when default is None)."""
        value = self.raw(suffix, default, required=default is None)
        return self._int_in(self.name(suffix), value, lo, hi)

    def per_layer_int(
        self, suffix: str, n_layer: int, default: int | None = None, *, lo: int = 1, hi: int | None = None
    ) -> int:
        """An integer that may be stored per layer; this engine needs one value for all layers."""
        key = self.name(suffix)
        value = self.raw(suffix, default, required=default is None)
        if isinstance(value, (list, np.ndarray)):
            if len(value) != n_layer:
                raise InvalidModel(
                    f"{key} has {len(value)} per-layer entries for {n_layer} layers ({self.name('block_count')})"
                )
            vals = sorted({self._int_in(key, v, lo, hi) for v in value})
            if len(vals) != 1:
                raise InvalidModel(f"{key} varies per layer ({vals[:8]}), which is not supported")
            return vals[0]
        return self._int_in(key, value, lo, hi)

    def float(self, suffix: str, default: float, *, positive: bool = True, hi: float = FLOAT_MAX) -> float:
        """A number the float32 kernels can use: finite, > 0 when `positive` (else >= 0), at most hi."""
        key = self.name(suffix)
        value = self.raw(suffix, default)
        if not is_number(value):
            raise InvalidModel(f"{key} must be a number, got {value!r}")
        x = float(value)
        if not (math.isfinite(x) and (x > FLOAT_MIN if positive else x == 0 or x > FLOAT_MIN) and x <= hi):
            floor = "greater than 0" if positive else "0 or more"
            raise InvalidModel(f"{key} is {x:.7g}; it must be a finite number {floor}, at most {hi:.7g}")
        return x

    def str(self, suffix: str, default: str) -> str:
        value = self.raw(suffix, default)
        if not isinstance(value, str):
            raise InvalidModel(f"{self.name(suffix)} must be a string, got {value!r}")
        return value

    @staticmethod
    def _int_in(key: str, value, lo: int, hi: int | None) -> int:
        if not is_int(value):
            raise InvalidModel(f"{key} must be an integer, got {value!r}")
        v = int(value)
        if v < lo or (hi is not None and v > hi):
            bound = f"at least {lo}" + (f" and at most {hi}" if hi is not None else "")
            raise InvalidModel(f"{key} is {v}; it must be {bound}")
        return v


def block_indices(tensors: Mapping) -> set[int]:
    """The N of every `blk.N.*` tensor in the file."""
    found = set()
    for name in tensors:
        m = _BLOCK_NAME.match(name)
        if m:
            found.add(int(m.group(1)))
    return found


def check_block_count(keys: Keys, n_layer: int, tensors: Mapping) -> None:
    """block_count must be the number of blocks the file holds, blk.0 .. blk.{n-1} (before any per-layer allocation)."""
    present = block_indices(tensors)
    key = keys.name("block_count")
    if not present:
        raise InvalidModel(f"{key} is {n_layer} but the file has no blk.N tensors")
    top = max(present)
    contiguous = len(present) == top + 1  # blk.0 .. blk.top, sizes bounded by the file (never by n_layer)
    if contiguous and top + 1 == n_layer:
        return
    if contiguous:
        raise InvalidModel(f"{key} is {n_layer} but the file holds {top + 1} block(s), blk.0 to blk.{top}")
    missing = next(i for i in range(top + 1) if i not in present)
    raise InvalidModel(f"{key} is {n_layer} but the file's blocks go up to blk.{top} with blk.{missing} missing")


def check_heads(keys: Keys, cfg, *, partial_rotary: bool = False) -> None:
    """Head counts, head sizes and the rope dimension count against each other (metadata only)."""
    head, kv = keys.name("attention.head_count"), keys.name("attention.head_count_kv")
    if cfg.n_head % cfg.n_head_kv:
        raise InvalidModel(f"{head} ({cfg.n_head}) is not a multiple of {kv} ({cfg.n_head_kv})")
    rot, kl = keys.name("rope.dimension_count"), keys.name("attention.key_length")
    if cfg.n_rot % 2 or cfg.n_rot > cfg.head_dim:
        raise InvalidModel(
            f"{rot} is {cfg.n_rot} but the head size ({kl}) is {cfg.head_dim}: "
            "it must be even and at most the head size"
        )
    if cfg.n_rot != cfg.head_dim and not partial_rotary:
        # llama.cpp refuses this for llama and qwen3; qwen2 and the gemmas rotate whole heads too. phi3 may not.
        raise InvalidModel(
            f"{rot} is {cfg.n_rot} but the head size ({kl}) is {cfg.head_dim}: {cfg.arch} rotates the whole head"
        )


def dim_labels(keys: Keys, vocab_label: str) -> dict[str, str]:
    """Where each config dimension of the tensor tables comes from, for messages."""
    k = keys.name
    head, kv = k("attention.head_count"), k("attention.head_count_kv")
    kl, vl = k("attention.key_length"), k("attention.value_length")
    return {
        "n_vocab": vocab_label,
        "n_embd": k("embedding_length"),
        "n_ff": k("feed_forward_length"),
        "head_dim": kl,
        "n_head": head,
        "n_q": f"{head} x {kl}",
        "n_k": f"{kv} x {kl}",
        "n_v": f"{kv} x {vl}",
        "n_o": f"{head} x {vl}",
        "n_rot_half": f"{k('rope.dimension_count')} / 2",
        "n_qkv": f"{head} x {kl} + 2 x {kv} x {kl}",
        "n_ff2": f"2 x {k('feed_forward_length')}",
        "n_expert": k("expert_count"),
        "n_ff_exp": k("expert_feed_forward_length"),
        "n_ctx_train": k("context_length"),
        "n_token_types": "tokenizer.ggml.token_type_count",
        "n_cls_out": f"the count of {k('classifier.output_labels')} (1 without it)",
        "n_dense_2_out": k("dense_2_feat_out"),
        "n_dense_3_in": k("dense_3_feat_in"),
    }


def classifier_outputs(keys: Keys) -> int:
    """A classifier's output count, as llama.cpp: the number of classifier.output_labels (strings), 1 without them."""
    key = keys.name("classifier.output_labels")
    labels = keys.raw("classifier.output_labels")
    if labels is None:
        return 1
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):  # a list, or gguf_io's StringArray
        raise InvalidModel(f"{key} must be an array of strings")
    if not 1 <= len(labels) <= MAX_WIDTH:
        raise InvalidModel(f"{key} has {len(labels)} labels; a classifier needs 1 to {MAX_WIDTH}")
    if not all(isinstance(x, str) for x in labels):
        raise InvalidModel(f"{key} must be an array of strings")
    return len(labels)


def check_vocab(keys: Keys, n_vocab: int) -> None:
    """The tokenizer's token count must be the vocabulary the output layer scores (else sampled ids have no text)."""
    tokens = keys.md.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != n_vocab:
        raise InvalidModel(f"{keys.name('vocab_size')} is {n_vocab} but tokenizer.ggml.tokens has {len(tokens)} tokens")


def check_tensors(keys: Keys, cfg, tensors: Mapping, global_table: dict, block_table: dict, dims: dict) -> None:
    """Every tensor the forward indexes: present when required, of the config's shape, of a type the kernels read,
    and (small float ones) finite."""
    vocab_label = keys.name("vocab_size") if keys.has("vocab_size") else "the number of tokenizer.ggml.tokens"
    labels = dim_labels(keys, vocab_label)
    for name, spec in global_table.items():
        _check_tensor(tensors, name, spec, dims, labels)
    for il in range(cfg.n_layer):
        for name, spec in block_table.items():
            _check_tensor(tensors, f"blk.{il}.{name}", spec, dims, labels)
    for name in ROPE_FACTOR_TENSORS:
        if name in tensors:
            check_rope_factors(name, tensors[name])


def check_rope_factors(name: str, t) -> None:
    """A rope factor tensor holds floats in ROPE_FACTOR_RANGE (its length is the tensor tables' n_rot / 2)."""
    if t.ggml_type not in (F32, F16, BF16):
        raise InvalidModel(f"tensor {name!r} has ggml type {t.ggml_type}; rope factors must be F32, F16 or BF16")
    values = _float_values(t, limit=None)
    if values is None:  # no data to read (a header-only check)
        return
    lo, hi = ROPE_FACTOR_RANGE
    bad = np.flatnonzero(~((values >= lo) & (values <= hi)))  # NaN fails both comparisons
    if len(bad):
        i = int(bad[0])
        raise InvalidModel(
            f"tensor {name!r} holds {float(values[i]):.7g} at index {i}: rope divides its frequencies by "
            f"these factors, so each must be a finite number greater than 0, from {lo:g} to {hi:g}"
        )


def _check_tensor(tensors: Mapping, name: str, spec: tuple, dims: dict, labels: dict) -> None:
    shape_dims, required = spec
    t = tensors.get(name)
    if t is None:
        if required:
            raise MissingTensor(name)
        return
    want = tuple(dims[d] for d in shape_dims)
    got = tuple(int(x) for x in t.shape)
    if got != want:
        why = "; ".join(
            f"{labels[d]} is {dims[d]}" for i, d in enumerate(shape_dims) if i >= len(got) or got[i] != dims[d]
        )
        raise InvalidModel(f"tensor {name!r} has shape {got} but the metadata gives {want} ({why or 'wrong rank'})")
    if len(want) >= 2 and (t.ggml_type not in simd_kernels.MUL or t.ggml_type not in simd_kernels.ROWS):
        raise InvalidModel(f"tensor {name!r} has ggml type {t.ggml_type}, which this runtime cannot compute with")
    if len(want) == 1 and t.ggml_type not in simd_kernels.ROWS:
        raise InvalidModel(f"tensor {name!r} has ggml type {t.ggml_type}, which this runtime cannot read")
    values = _float_values(t)
    if values is not None and not np.isfinite(values).all():
        raise InvalidModel(f"tensor {name!r} holds NaN or infinite values")


def _float_values(t, limit: int | None = FINITE_SCAN_BYTES) -> np.ndarray | None:
    """A float view of an F32/F16/BF16 tensor's data of at most `limit` bytes; None for bigger, quantized or
    data-less ones."""
    data = getattr(t, "data", None)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or (limit is not None and data.nbytes > limit):
        return None
    flat = data.reshape(-1)
    if t.ggml_type == F32:
        return flat.view(np.float32)
    if t.ggml_type == F16:
        return flat.view(np.float16)
    if t.ggml_type == BF16:
        return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return None
