"""Model: weights + forward + public API (its ModelConfig comes from `localrt.engine.config`, re-exported here)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from simd_kernels import ops, threads

from ..errors import ContextLengthExceeded, InvalidRequest, ModelLoadError, NonFiniteOutput
from . import arch as archs
from .arch.common import Batch, layer_devices
from .backends.pieces import prefill_end
from .config import ModelConfig, config_from_metadata
from .kv_cache import KVCache, budget_positions, pool_blocks, pool_position_bytes

__all__ = ["Model", "ModelConfig", "config_from_metadata"]


class Model:
    """A loaded model: config, weights (viewed in the mmap, or a private copy), one KV cache, and the public API."""

    def __init__(
        self,
        config: ModelConfig,
        metadata: dict,
        weights,
        backend,
        tokenizer,
        *,
        num_ctx: int,
        num_batch: int = 512,
        n_slots: int = 1,
        kv_type: str = "f16",
        kv_budget: int = 0,
        kv_budget_bytes: int = 0,
        source=None,
        num_thread: int = 0,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.weights = weights
        self.backend = backend
        self.tokenizer = tokenizer
        self.num_ctx = num_ctx
        self.num_batch = num_batch
        self.arch = archs.get(config.arch)
        # kv_budget: positions of the paged pool (0: n_slots * num_ctx; never less than one full context), or its bytes.
        per_pos = pool_position_bytes(config.windows, config.n_head_kv, config.head_dim, config.head_dim_v, kv_type)
        kv_budget = budget_positions(kv_budget, kv_budget_bytes, per_pos)
        self.cache = KVCache(
            config.n_layer,
            config.n_head_kv,
            config.head_dim,
            config.head_dim_v,
            num_ctx,
            n_slots,
            config.windows,
            num_batch,
            kv_type,
            n_blocks=pool_blocks(num_ctx, n_slots, kv_budget),
        )
        self.load_duration_ns = 0
        self._source = source  # the open GGUF file: keeps the mmap the weights view alive
        self.num_thread = num_thread  # Ollama's option: the most threads a forward uses (0: all; simd_kernels.threads)
        self.huge_pages = None  # the thread moving private weights onto huge pages (backends.resident), once started
        self.after_first_forward = None  # the loader's start of that thread: a first token never waits for it

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    # -- compute ---------------------------------------------------------------------------------

    def forward(self, batch: Batch, cache: KVCache, output_rows: np.ndarray | None = None) -> np.ndarray:
        """Run one batch; logits (len(output_rows), n_vocab) float32 for the chosen rows (all if None)."""
        with threads.capped(self.num_thread):
            logits = self._forward(batch, cache, output_rows)
        if self.after_first_forward is not None:
            self.finish_loading(wait=False)
        return logits

    def _forward(self, batch: Batch, cache: KVCache, output_rows: np.ndarray | None) -> np.ndarray:
        cache.check_batch(batch.positions, batch.slots)
        cache.prepare(batch.positions, batch.slots)  # blocks for the positions written (KVCacheFull if none)
        h = self._run(batch, cache)  # (n_tok, n_embd)
        cache.advance(batch.positions, batch.slots)
        if output_rows is not None:
            xp = self.output_device.xp
            h = xp.ascontiguousarray(h[xp.asarray(output_rows)])
        return self.project(h)

    def finish_loading(self, wait: bool = True) -> None:
        """Start the loader's background work if the first forward has not yet (after_first_forward), and with
        `wait`, wait for it to end: a benchmark of steady speeds calls this first."""
        start, self.after_first_forward = self.after_first_forward, None
        if start is not None:
            self.huge_pages = start()
        if wait and self.huge_pages is not None:
            self.huge_pages.join()

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
        return check_finite_output(logits, "logits")

    def hidden(self, ids, slot: int = 0) -> np.ndarray:
        """Final-normed hidden states (len(ids), n_embd) of ids from an empty slot, in num_batch chunks."""
        ids = self._check_ids(ids)
        self.cache.clear(slot)
        self.cache.pool.drop_slot(slot)  # per-slot layers are overwritten: a prefix they held is gone
        out = np.empty((len(ids), self.config.n_embd), np.float32)  # (n_tok, n_embd)
        start = 0
        with threads.capped(self.num_thread):
            while start < len(ids):
                batch = self.batch(ids[start : prefill_end(start, len(ids), self.num_batch)], start, slot)
                self.cache.check_batch(batch.positions, batch.slots)
                self.cache.prepare(batch.positions, batch.slots)
                out[start : start + len(batch)] = self.output_device.to_host(self._run(batch, self.cache))
                self.cache.advance(batch.positions, batch.slots)
                start += len(batch)
        return out

    def _run(self, batch: Batch, cache: KVCache):
        """The architecture's forward with every device told which rows are canonical blocks (see backends.pieces.BLOCK)."""
        with contextlib.ExitStack() as planned:
            for dev in {id(d): d for d in layer_devices(self.backend, self.weights)}.values():
                if hasattr(dev, "planned"):
                    planned.enter_context(dev.planned(batch.positions, batch.slots))
            return self.arch.forward(self.backend, self.config, self.weights, batch, cache)

    def batch(self, ids, start_pos: int, slot: int = 0) -> Batch:
        n = len(ids)
        return Batch(
            tokens=np.asarray(ids, np.int64),
            positions=np.arange(start_pos, start_pos + n, dtype=np.int64),
            slots=np.full(n, slot, np.int64),
        )

    def _check_ids(self, ids) -> np.ndarray:
        return check_ids(ids, self.config.n_vocab, self.num_ctx)

    # -- public API ------------------------------------------------------------------------------

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits (len(ids), n_vocab) float32 from an empty cache."""
        return self.project(self.output_device.put(self.hidden(ids)))

    def embed(self, ids) -> np.ndarray:
        """The final-normed hidden states (n_embd,) float32, pooled as the file says (engine.pooling)."""
        from .pooling import pool, pooling_type

        return check_finite_output(
            pool(self.hidden(ids), pooling_type(self.metadata, self.config.arch)), "embedding values"
        )

    def tokenize(self, text: str, special: bool = True, limit: int | None = None) -> list[int]:
        """Token ids of text; BOS/EOS as the file says; special-token text parsed when `special`. With `limit`, a
        text of more than limit tokens gives only the first ones (more than limit): Tokenizer.encode."""
        return self._tok().encode(text, add_special=True, parse_special=special, limit=limit)

    def detokenize(self, ids) -> str:
        return self._tok().decode(list(ids))

    def generate(self, ids, options: dict | None = None, *, cancelled=None, constraint=None, **sampling) -> Iterator:
        """Events (`localrt.engine.events.Token`... then `Done`) for a prompt of token ids; see engine.generate."""
        from .generate import generate

        return generate(self, ids, options or {}, cancelled=cancelled, constraint=constraint, **sampling)

    def _tok(self):
        if self.tokenizer is None:
            raise ModelLoadError("this model has no usable tokenizer")
        return self.tokenizer


def check_ids(ids, n_vocab: int, num_ctx: int) -> np.ndarray:
    """ids as a flat int64 array, checked: not empty, every id in the vocabulary, no longer than the context."""
    arr = np.asarray(ids, np.int64).reshape(-1)
    if len(arr) == 0:
        raise InvalidRequest("no tokens to evaluate")
    if arr.min() < 0 or arr.max() >= n_vocab:
        raise InvalidRequest(f"token id out of range 0..{n_vocab - 1}")
    if len(arr) > num_ctx:
        raise ContextLengthExceeded(len(arr), num_ctx)
    return arr


def check_finite_output(values: np.ndarray, what: str) -> np.ndarray:
    """values, or NonFiniteOutput when they hold NaN or inf: NaN logits would be sampled as garbage (or refused by the
    sampler as a bare ValueError) and NaN embeddings fail as JSON, on every request. ~40 us for Gemma 3's 262k logits."""
    finite = np.isfinite(values)
    if not finite.all():
        bad = values[~finite]
        raise NonFiniteOutput(
            f"non-finite {what} ({bad.size} of {values.size} values NaN or infinite, the first {bad[0]})"
        )
    return values
