"""ModelConfig: every hyperparameter the forward uses, built from GGUF metadata in one function.

Defaults and per-family rules are llama.cpp's (`src/llama-model.cpp`, `src/models/<arch>.cpp`); every value
is range-checked by `validate.Keys` and, given the file's tensors, checked against their shapes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import InvalidModel
from . import arch as archs
from . import validate
from .arch.common import GLOBAL_TENSORS, dims

log = logging.getLogger("localrt.engine")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # per-head width of q and k
    head_dim_v: int
    n_ff: int
    rms_eps: float
    rope_mode: int  # ops.ROPE_NORMAL or ops.ROPE_NEOX
    n_rot: int
    rope_base: float
    rope_freq_scale: float  # 1 / linear scaling factor; applies to full-attention layers
    rope_base_swa: float  # base of sliding-window layers
    windows: tuple[int, ...]  # per layer: 0 = full attention, else the sliding window
    attn_scale: float  # multiplies q.k
    embed_scale: float  # multiplies the token embedding
    final_logit_softcap: float  # 0 = off
    rope_freq_scale_swa: float = 1.0  # frequency scale of sliding-window layers
    attn_softcap: float = 0.0  # q.k * attn_scale -> cap * tanh(. / cap) before the softmax; 0 = off
    rope_attn_factor: float = 1.0  # multiplies the rotated dims of q and k (llama.cpp's rope attn_factor)
    rope_orig_ctx: int = 0  # longrope: a context above this picks rope_factors_long (else _short)
    n_expert: int = 0  # mixture of experts (qwen3moe, gpt-oss): experts per layer; 0 = dense FFN
    n_expert_used: int = 0  # experts each token is routed to (top-k of the router's softmax)
    n_ff_exp: int = 0  # each expert's feed-forward width
    expert_weights_norm: bool = False  # renormalise the top-k router probabilities to sum to 1
    # "softmax": top-k of the router's softmax over all experts; "softmax_weight" (gpt-oss): top-k of the raw
    # logits, weighted by the softmax over the k chosen (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT)
    expert_gating: str = "softmax"
    expert_act: str = "swiglu"  # the experts' gated activation: "swiglu", or "swiglu_oai" (gpt-oss, clamped)
    # YaRN rope (rope.scaling.type "yarn"): (n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow) as llama.cpp's
    # context computes them (simd_kernels.ops.rope); () = none. attn_factor already holds rope.scaling.attn_factor.
    rope_yarn: tuple = ()
    encoder: bool = False  # an encoder-only family (bert): whole-input attention, no KV cache (engine.encoder)
    norm_eps: float = 0.0  # encoders: the LayerNorms' epsilon (attention.layer_norm_epsilon)
    n_token_types: int = 0  # encoders: rows of token_types (tokenizer.ggml.token_type_count)
    rank: bool = False  # encoders: pooling_type 4 (rank), a reranker scored by its classification head
    n_cls_out: int = 1  # encoders: the head's outputs (classifier.output_labels' count, else 1, as llama.cpp)
    n_dense_2_out: int = 0  # gemma-embedding: dense_2's rows (dense_2_feat_out), 0 = none
    n_dense_3_in: int = 0  # gemma-embedding: dense_3's columns (dense_3_feat_in), 0 = none

    @property
    def n_embd_k(self) -> int:
        return self.n_head_kv * self.head_dim


GPT_OSS = ("gpt-oss", "gptoss")  # llama.cpp's name and Ollama's for one family; keys are prefixed by the file's
# default sliding_window_pattern: layer il is local iff il % p < p - 1
SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, **{a: 2 for a in GPT_OSS}}
GEMMA = ("gemma2", "gemma3", "gemma-embedding")  # scaled embedding; gemma-embedding: gemma3's body as an encoder
WINDOW_REQUIRED = (*GPT_OSS, "gemma-embedding")  # families whose window key is required and at least 1
SWA_DEFAULT = {"gemma2": 4096}  # sliding window when the file has none (llama.cpp's n_swa for gemma 2)
PARTIAL_ROTARY = ("phi3",)  # families whose rope may rotate fewer dims than the head (Phi-4-mini: 96 of 128)
FACTOR_SCALING = {"llama": "llama3", "phi3": "longrope"}  # rope.scaling.type carried by factor tensors
MOE = ("qwen3moe", *GPT_OSS)  # families whose FFN is a mixture of experts
NORM_TOPK = ("qwen3moe",)  # MoE families whose graph renormalises the top-k weights (no key read, as llama.cpp)
# Families whose rope may be YaRN, checked against llama.cpp (tests/engine/arch/test_arch_fixtures.py); others refuse it by name.
YARN = ("qwen2", "qwen3", *GPT_OSS)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults (llama_hparams); these families read no keys for them


def config_from_metadata(md: dict, tensors: Mapping | None = None) -> ModelConfig:
    """Every hyperparameter the forward uses, read from GGUF metadata with llama.cpp's defaults and validated.

    With `tensors` (GGUF name -> .shape/.ggml_type[/.data], the file's tensor infos) the config is also checked
    against the file: block_count before anything per layer is built, then every tensor the forward indexes
    (see localrt.engine.validate). Raises InvalidModel naming the key and both numbers."""
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise InvalidModel("model file has no general.architecture")
    module = archs.get(arch)  # raises UnsupportedArchitecture
    k = validate.Keys(md, arch)
    for key in getattr(module, "REQUIRED_KEYS", ()):  # keys a family needs where llama.cpp would default
        k.raw(key, required=True)

    n_layer = k.int("block_count", lo=1)
    if tensors is not None:
        validate.check_block_count(k, n_layer, tensors)
    k.int("block_count", lo=1, hi=validate.MAX_BLOCKS)
    n_embd = k.int("embedding_length", hi=validate.MAX_WIDTH)
    n_head = k.per_layer_int("attention.head_count", n_layer, hi=validate.MAX_HEADS)
    n_head_kv = k.per_layer_int("attention.head_count_kv", n_layer, n_head, hi=validate.MAX_HEADS)
    n_ff = k.per_layer_int("feed_forward_length", n_layer, hi=validate.MAX_WIDTH)
    if not k.has("attention.key_length") and n_embd % n_head:
        raise InvalidModel(
            f"{k.name('embedding_length')} ({n_embd}) is not a multiple of {k.name('attention.head_count')} "
            f"({n_head}) and the file has no {k.name('attention.key_length')}"
        )
    head_dim = k.int("attention.key_length", n_embd // n_head, hi=validate.MAX_WIDTH)
    head_dim_v = k.int("attention.value_length", head_dim, hi=validate.MAX_WIDTH)
    n_rot = k.int("rope.dimension_count", head_dim, lo=2, hi=validate.MAX_WIDTH)
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None and not k.has("vocab_size"):
        raise InvalidModel(f"model file has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    n_vocab = k.int("vocab_size", len(tokens) if tokens is not None else None)
    n_ctx_train = k.int("context_length", 2048, hi=validate.MAX_CONTEXT)
    n_expert, n_expert_used, n_ff_exp = _experts(k, n_layer, n_ff)

    freq_scale = _rope_freq_scale(k, tensors)
    rope_attn_factor = k.float("rope.scaling.attn_factor", 1.0, hi=validate.MAX_ROPE_ATTN_FACTOR)
    rope_orig_ctx = k.int("rope.scaling.original_context_length", n_ctx_train, hi=validate.MAX_CONTEXT)
    rope_base = k.float("rope.freq_base", 10000.0)
    windows = _windows(k, n_layer)
    gemma = arch in GEMMA

    attn_scale = k.float("attention.scale", 0.0, positive=False, hi=validate.MAX_ATTN_SCALE) or 1.0 / math.sqrt(
        head_dim
    )
    if arch in GPT_OSS:  # llama.cpp's gpt-oss graph scales by 1/sqrt(n_rot) whatever attention.scale says
        attn_scale = 1.0 / math.sqrt(n_rot)
    if gemma:
        # query_pre_attn_scalar: head_dim, but n_embd / n_head for the 27B models (gemma2: 46 layers, gemma3: 62),
        # set by llama.cpp whatever attention.scale says.
        attn_scale = 1.0 / math.sqrt(
            n_embd // n_head if n_layer == {"gemma2": 46, "gemma3": 62}.get(arch) else head_dim
        )

    cfg = ModelConfig(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        rms_eps=k.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_mode=module.ROPE_MODE,
        n_rot=n_rot,
        rope_base=rope_base,
        rope_freq_scale=freq_scale,
        # Sliding-window layers: gemma3 (and gemma-embedding) have their own base (default 10000) and no scaling;
        # gemma2 the global ones.
        rope_base_swa=k.float("rope.freq_base_swa", 10000.0 if arch in GEMMA[1:] else rope_base),
        rope_freq_scale_swa=1.0 if arch in GEMMA[1:] else freq_scale,
        windows=windows,
        attn_scale=attn_scale,
        embed_scale=float(np.sqrt(np.float32(n_embd))) if gemma else 1.0,
        # gemma2 always caps (llama.cpp's defaults 50 and 30); others only where the file says so.
        final_logit_softcap=k.float(
            "final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0, positive=arch == "gemma2"
        ),
        attn_softcap=k.float("attn_logit_softcapping", 50.0) if arch == "gemma2" else 0.0,
        rope_attn_factor=rope_attn_factor,
        rope_orig_ctx=rope_orig_ctx,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        expert_weights_norm=arch in NORM_TOPK,
        expert_gating="softmax_weight" if arch in GPT_OSS else "softmax",
        expert_act="swiglu_oai" if arch in GPT_OSS else "swiglu",
        rope_yarn=_yarn(k, freq_scale, rope_attn_factor, rope_orig_ctx),
        **(_encoder(k, md, module) if getattr(module, "ENCODER", False) else {}),
        **(module.config_keys(k) if hasattr(module, "config_keys") else {}),  # a family's own keys
    )
    validate.check_heads(k, cfg, partial_rotary=arch in PARTIAL_ROTARY)
    validate.check_vocab(k, n_vocab)
    if tensors is not None:
        validate.check_tensors(k, cfg, tensors, getattr(module, "GLOBALS", GLOBAL_TENSORS), module.BLOCK, dims(cfg))
        if hasattr(module, "check_tensors"):
            module.check_tensors(cfg, tensors)
    return cfg


def _encoder(k: validate.Keys, md: Mapping, module) -> dict:
    """An encoder's LayerNorm epsilon (required, as llama.cpp) and token type count (llama.cpp refuses 0; a family
    without token types (TOKEN_TYPES False: gemma-embedding) has none)."""
    eps_key = module.NORM_EPS_KEY
    typed = getattr(module, "TOKEN_TYPES", True)
    types = md.get("tokenizer.ggml.token_type_count") if typed else 0
    if typed and (not validate.is_int(types) or not 1 <= int(types) <= validate.MAX_TOKEN_TYPES):
        raise InvalidModel(
            f"tokenizer.ggml.token_type_count is {str(types)[:40]}: an encoder needs a count of token "
            f"types from 1 to {validate.MAX_TOKEN_TYPES}"
        )
    k.raw(eps_key, required=True)
    return {
        "encoder": True,
        "norm_eps": k.float(eps_key, 0.0, hi=1.0),
        "n_token_types": int(types),
        "rank": validate.is_int(k.raw("pooling_type")) and int(k.raw("pooling_type")) == 4,
        "n_cls_out": validate.classifier_outputs(k),
    }


def _rope_freq_scale(k: validate.Keys, tensors: Mapping | None) -> float:
    """1 / rope.scaling.factor for linear scaling; 1 for none, and for the types whose factors are tensors."""
    key = k.name("rope.scaling.type")
    scaling = k.str("rope.scaling.type", "linear")  # llama.cpp's default
    factor = k.float("rope.scaling.factor", 0.0, positive=False, hi=validate.MAX_ROPE_FACTOR)
    by_tensor = FACTOR_SCALING.get(k.arch)
    if scaling == by_tensor:
        # llama3 (rope_freqs) / longrope (rope_factors_long/short): the per-dimension factors are in the file.
        needed = (
            ("rope_freqs.weight",) if scaling == "llama3" else ("rope_factors_long.weight", "rope_factors_short.weight")
        )
        if tensors is not None and not any(n in tensors for n in needed):
            raise InvalidModel(
                f"{key} is {scaling!r} but the file has no {' or '.join(needed)} tensor with its factors"
            )
        return 1.0
    if scaling == "yarn" and k.arch in YARN:
        return 1.0 / factor if factor > 0 else 1.0
    if scaling not in ("none", "linear") and factor not in (0.0, 1.0):  # yarn & co. with a factor of 1 scale nothing
        raise InvalidModel(f"{key} {scaling!r} (factor {factor:g}) is not supported for {k.arch}")
    return 1.0 / factor if scaling == "linear" and factor > 0 else 1.0


def _yarn(k: validate.Keys, freq_scale: float, rope_attn_factor: float, n_ctx_orig: int) -> tuple:
    """YaRN's rope parameters where the file's rope.scaling.type is "yarn" (a family in YARN), else (): as llama.cpp's
    context sets them, ext_factor 1 and attn_factor = mscale(s) / (1 + 0.1 ln s) * rope.scaling.attn_factor for the
    scaling s = 1 / freq_scale (mscale(s) = 1 + 0.1 ln s above 1, else 1: the ratio cancels the magnitude scaling
    ggml's rope_yarn applies again), in float32."""
    if k.arch not in YARN or k.str("rope.scaling.type", "linear") != "yarn":
        return ()
    f32 = np.float32
    s = f32(1.0) / f32(freq_scale)
    ln_s = f32(np.log(s))
    attn = f32(1.0) if s <= 1 else f32(f32(0.1) * ln_s + f32(1.0))
    attn = f32(attn * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * ln_s)))
    attn = f32(attn * f32(rope_attn_factor))
    return (n_ctx_orig, 1.0, float(attn), YARN_BETA_FAST, YARN_BETA_SLOW)


def _windows(k: validate.Keys, n_layer: int) -> tuple[int, ...]:
    """Per layer the sliding window (0: full attention), from attention.sliding_window and its pattern."""
    arch = k.arch
    # gpt-oss and gemma-embedding require the key (REQUIRED_KEYS) and a window of at least 1: their local layers
    # always slide
    window = k.int(
        "attention.sliding_window",
        SWA_DEFAULT.get(arch, 0),
        lo=1 if arch in WINDOW_REQUIRED else 0,
        hi=validate.MAX_CONTEXT,
    )
    if arch == "phi3" and window > 0:
        log.warning(
            "%s is %d: llama.cpp runs Phi-3 with full attention (its sliding window is disabled), and so does localrt",
            k.name("attention.sliding_window"),
            window,
        )
    if arch not in SWA_PERIOD or window == 0:
        return (0,) * n_layer
    return tuple(window if swa else 0 for swa in _swa_layers(k, n_layer, SWA_PERIOD[arch]))


def _experts(k: validate.Keys, n_layer: int, n_ff: int) -> tuple[int, int, int]:
    """(expert_count, expert_used_count, expert_feed_forward_length) of a mixture-of-experts family, as llama.cpp
    reads them (the width defaults to feed_forward_length / expert_used_count); (0, 0, 0) for a dense one, whose
    file must not claim experts. What qwen3moe's graph has no use for (expert groups) is refused by name."""
    if k.arch not in MOE:
        n_expert = k.int("expert_count", 0, lo=0, hi=validate.MAX_EXPERTS)
        n_used = k.per_layer_int("expert_used_count", n_layer, 0, lo=0, hi=validate.MAX_EXPERTS)
        if n_expert > 0:
            raise InvalidModel(f"{k.name('expert_count')} is {n_expert}: {k.arch} has no mixture-of-experts layers")
        if n_used > 0:
            raise InvalidModel(f"{k.name('expert_used_count')} is {n_used} but {k.name('expert_count')} is 0")
        return 0, 0, 0
    n_expert = k.int("expert_count", hi=validate.MAX_EXPERTS)
    n_used = k.per_layer_int("expert_used_count", n_layer, hi=n_expert)  # 1..expert_count
    groups = k.int("expert_group_count", 0, lo=0, hi=validate.MAX_EXPERTS)
    if groups > 1:
        raise InvalidModel(
            f"{k.name('expert_group_count')} is {groups}: grouped expert selection is not supported for {k.arch}"
        )
    if not k.has("expert_feed_forward_length") and n_ff < n_used:
        raise InvalidModel(
            f"the file has no {k.name('expert_feed_forward_length')} and {k.name('feed_forward_length')} "
            f"({n_ff}) / {k.name('expert_used_count')} ({n_used}) is 0"
        )
    n_ff_exp = k.per_layer_int("expert_feed_forward_length", n_layer, n_ff // n_used, hi=validate.MAX_WIDTH)
    return n_expert, n_used, n_ff_exp


def _swa_layers(k: validate.Keys, n_layer: int, default: int) -> list[bool]:
    """Which layers use the sliding window: a bool per layer, or period p (layer il is local iff il % p < p - 1;
    p = 0: every layer, as llama.cpp's set_swa_pattern)."""
    key = k.name("attention.sliding_window_pattern")
    pattern = k.raw("attention.sliding_window_pattern", default)
    if isinstance(pattern, (list, np.ndarray)):
        if len(pattern) != n_layer:
            raise InvalidModel(f"{key} has {len(pattern)} entries for {n_layer} layers ({k.name('block_count')})")
        if not all(isinstance(b, (bool, np.bool_)) or validate.is_int(b) for b in pattern):
            raise InvalidModel(f"{key} must hold one bool per layer")
        return [bool(b) for b in pattern]
    period = k.int("attention.sliding_window_pattern", default, lo=0, hi=validate.MAX_BLOCKS)
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]
