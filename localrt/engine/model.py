"""ModelConfig (built from GGUF metadata in one function) and Model (weights + forward + public API)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from simd_kernels import ops

from ..errors import ContextLengthExceeded, InvalidModel, InvalidRequest, ModelLoadError
from . import arch as archs
from . import validate
from .arch.common import GLOBAL_TENSORS, Batch, dims
from .kv_cache import KVCache
from .speculative import CostModel


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

    @property
    def n_embd_k(self) -> int:
        return self.n_head_kv * self.head_dim


_ROPE_MODES = {"llama": ops.ROPE_NORMAL, "qwen2": ops.ROPE_NEOX, "gemma3": ops.ROPE_NEOX}


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

    n_layer = k.int("block_count", lo=1)
    if tensors is not None:
        validate.check_block_count(k, n_layer, tensors)
    k.int("block_count", lo=1, hi=validate.MAX_BLOCKS)
    n_embd = k.int("embedding_length", hi=validate.MAX_WIDTH)
    n_head = k.per_layer_int("attention.head_count", n_layer, hi=validate.MAX_HEADS)
    n_head_kv = k.per_layer_int("attention.head_count_kv", n_layer, n_head, hi=validate.MAX_HEADS)
    n_ff = k.per_layer_int("feed_forward_length", n_layer, hi=validate.MAX_WIDTH)
    if not k.has("attention.key_length") and n_embd % n_head:
        raise InvalidModel(f"{k.name('embedding_length')} ({n_embd}) is not a multiple of {k.name('attention.head_count')} "
                           f"({n_head}) and the file has no {k.name('attention.key_length')}")
    head_dim = k.int("attention.key_length", n_embd // n_head, hi=validate.MAX_WIDTH)
    head_dim_v = k.int("attention.value_length", head_dim, hi=validate.MAX_WIDTH)
    n_rot = k.int("rope.dimension_count", head_dim, lo=2, hi=validate.MAX_WIDTH)
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None and not k.has("vocab_size"):
        raise InvalidModel(f"model file has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    n_vocab = k.int("vocab_size", len(tokens) if tokens is not None else None)
    _check_experts(k)

    scaling = k.str("rope.scaling.type", "none")
    factor = k.float("rope.scaling.factor", 0.0, positive=False, hi=validate.MAX_ROPE_FACTOR)
    if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
        raise InvalidModel(f"{k.name('rope.scaling.type')} {scaling!r} is not supported")
    freq_scale = 1.0 / factor if factor > 0 else 1.0

    window = k.int("attention.sliding_window", 0, lo=0, hi=validate.MAX_CONTEXT)
    windows = (0,) * n_layer
    if arch == "gemma3" and window > 0:
        windows = tuple(window if swa else 0 for swa in _swa_layers(k, n_layer))

    attn_scale = k.float("attention.scale", 0.0, positive=False, hi=validate.MAX_ATTN_SCALE) or 1.0 / math.sqrt(head_dim)
    if arch == "gemma3" and n_layer == 62:
        # Gemma 3 27B scales by n_embd / n_head instead of head_dim (query_pre_attn_scalar).
        attn_scale = 1.0 / math.sqrt(n_embd // n_head)

    cfg = ModelConfig(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=k.int("context_length", 2048, hi=validate.MAX_CONTEXT),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        rms_eps=k.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_mode=_ROPE_MODES[arch],
        n_rot=n_rot,
        rope_base=k.float("rope.freq_base", 10000.0),
        rope_freq_scale=freq_scale,
        rope_base_swa=k.float("rope.freq_base_swa", 10000.0) if arch == "gemma3" else 10000.0,  # only gemma3's local layers
        windows=windows,
        attn_scale=attn_scale,
        embed_scale=float(np.sqrt(np.float32(n_embd))) if arch == "gemma3" else 1.0,
        final_logit_softcap=k.float("final_logit_softcapping", 0.0, positive=False),
    )
    validate.check_heads(k, cfg)
    validate.check_vocab(k, n_vocab)
    if tensors is not None:
        validate.check_tensors(k, cfg, tensors, GLOBAL_TENSORS, module.BLOCK, dims(cfg))
    return cfg


def _check_experts(k: validate.Keys) -> None:
    """This engine runs dense FFNs only: a mixture-of-experts file is refused by name."""
    n_expert = k.int("expert_count", 0, lo=0, hi=validate.MAX_EXPERTS)
    n_used = k.int("expert_used_count", 0, lo=0, hi=validate.MAX_EXPERTS)
    if n_expert > 0:
        raise InvalidModel(f"{k.name('expert_count')} is {n_expert}: mixture-of-experts models are not supported")
    if n_used > 0:
        raise InvalidModel(f"{k.name('expert_used_count')} is {n_used} but {k.name('expert_count')} is 0")


def _swa_layers(k: validate.Keys, n_layer: int) -> list[bool]:
    """Which layers use the sliding window: a bool per layer, or period p (layer il is local iff il % p < p - 1)."""
    key = k.name("attention.sliding_window_pattern")
    pattern = k.raw("attention.sliding_window_pattern", 6)
    if isinstance(pattern, (list, np.ndarray)):
        if len(pattern) != n_layer:
            raise InvalidModel(f"{key} has {len(pattern)} entries for {n_layer} layers ({k.name('block_count')})")
        if not all(isinstance(b, (bool, np.bool_)) or validate.is_int(b) for b in pattern):
            raise InvalidModel(f"{key} must hold one bool per layer")
        return [bool(b) for b in pattern]
    period = k.int("attention.sliding_window_pattern", 6, lo=0, hi=validate.MAX_BLOCKS)
    return [period > 0 and il % period < period - 1 for il in range(n_layer)]


class Model:
    """A loaded model: config, weights viewed in the mmap, one KV cache, and the public API."""

    def __init__(self, config: ModelConfig, metadata: dict, weights, backend, tokenizer, *, num_ctx: int, num_batch: int = 512, n_slots: int = 1, kv_type: str = "f16", source=None) -> None:
        self.config = config
        self.metadata = metadata
        self.weights = weights
        self.backend = backend
        self.tokenizer = tokenizer
        self.num_ctx = num_ctx
        self.num_batch = num_batch
        self.arch = archs.get(config.arch)
        self.cache = KVCache(
            config.n_layer, config.n_head_kv, config.head_dim, config.head_dim_v, num_ctx, n_slots, config.windows, num_batch, kv_type
        )
        self.load_duration_ns = 0
        self._slot_tokens: dict[int, list[int]] = {}  # slot -> ids whose keys the cache holds (prefix reuse)
        self.forward_costs = CostModel()  # decode forwards' seconds by row count, for every Batcher's draft planning
        self._source = source  # the open GGUF file: keeps the mmap the weights view alive

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    # -- compute ---------------------------------------------------------------------------------

    def forward(self, batch: Batch, cache: KVCache, output_rows: np.ndarray | None = None) -> np.ndarray:
        """Run one batch; logits (len(output_rows), n_vocab) float32 for the chosen rows (all if None)."""
        cache.check_batch(batch.positions, batch.slots)
        h = self.arch.forward(self.backend, self.config, self.weights, batch, cache)  # (n_tok, n_embd)
        cache.advance(batch.positions, batch.slots)
        if output_rows is not None:
            xp = self.output_device.xp
            h = xp.ascontiguousarray(h[xp.asarray(output_rows)])
        return self.project(h)

    @property
    def output_device(self):
        """The device of output_norm + output (the model's backend unless offloaded)."""
        return self.weights.devices[-1] if self.weights.devices else self.backend

    def project(self, h) -> np.ndarray:
        """Final-normed hidden states (n, n_embd) on the output device -> logits (n, n_vocab) float32 on the host."""
        dev = self.output_device
        logits = dev.to_host(dev.linear(self.weights.output, h))
        if self.config.final_logit_softcap > 0:
            ops.softcap(logits, np.float32(self.config.final_logit_softcap))
        return logits

    def hidden(self, ids, slot: int = 0) -> np.ndarray:
        """Final-normed hidden states (len(ids), n_embd) of ids from an empty slot, in num_batch chunks."""
        ids = self._check_ids(ids)
        self.cache.clear(slot)
        self._slot_tokens[slot] = []
        out = np.empty((len(ids), self.config.n_embd), np.float32)  # (n_tok, n_embd)
        for start in range(0, len(ids), self.num_batch):
            batch = self.batch(ids[start : start + self.num_batch], start, slot)
            self.cache.check_batch(batch.positions, batch.slots)
            h = self.arch.forward(self.backend, self.config, self.weights, batch, self.cache)
            out[start : start + len(batch)] = self.output_device.to_host(h)
            self.cache.advance(batch.positions, batch.slots)
        return out

    def batch(self, ids, start_pos: int, slot: int = 0) -> Batch:
        n = len(ids)
        return Batch(
            tokens=np.asarray(ids, np.int64),
            positions=np.arange(start_pos, start_pos + n, dtype=np.int64),
            slots=np.full(n, slot, np.int64),
        )

    def _check_ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids, np.int64).reshape(-1)
        if len(arr) == 0:
            raise InvalidRequest("no tokens to evaluate")
        if arr.min() < 0 or arr.max() >= self.config.n_vocab:
            raise InvalidRequest(f"token id out of range 0..{self.config.n_vocab - 1}")
        if len(arr) > self.num_ctx:
            raise ContextLengthExceeded(len(arr), self.num_ctx)
        return arr

    # -- public API ------------------------------------------------------------------------------

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits (len(ids), n_vocab) float32 from an empty cache."""
        return self.project(self.output_device.put(self.hidden(ids)))

    def embed(self, ids) -> np.ndarray:
        """Mean-pooled final-normed hidden state (n_embd,) float32."""
        return self.hidden(ids).mean(axis=0, dtype=np.float64).astype(np.float32)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Token ids of text; BOS/EOS as the file says; special-token text parsed when `special`."""
        return self._tok().encode(text, add_special=True, parse_special=special)

    def detokenize(self, ids) -> str:
        return self._tok().decode(list(ids))

    def generate(self, ids, options: dict | None = None, *, cancelled=None, constraint=None) -> Iterator:
        """Events (`localrt.engine.events.Token`... then `Done`) for a prompt of token ids; see engine.generate."""
        from .generate import generate

        return generate(self, ids, options or {}, cancelled=cancelled, constraint=constraint)

    def _tok(self):
        if self.tokenizer is None:
            raise ModelLoadError("this model has no usable tokenizer")
        return self.tokenizer
