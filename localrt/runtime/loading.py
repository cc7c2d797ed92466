"""What a load needs and what it loads beside the model: the memory estimate, the context a model gets when nobody
chose one (issue 47), and the draft model (issue 15).

A model whose load options name a `draft_model` (PARAMETER draft_model in its Modelfile, or the request's option)
is loaded with that second model beside it, with as many KV slots, on the same worker: its memory counts in the
load's estimate, its tokenizer is checked against the model's (engine.draft_model.check_tokenizers, a 400 when
they differ), and it is closed with the model."""

from __future__ import annotations

import logging
from typing import Callable

import store as st

from ..errors import InvalidRequest, ModelNotFound
from .jobs import AUTO_PARALLEL, MemoryNeed

log = logging.getLogger("localrt.service")

# The automatic context (LOCALRT_CONTEXT_LENGTH unset or 0): Ollama's ladder on the memory the KV cache lives in,
# (total bytes at least, the ceiling in positions), and 8192 below it rather than Ollama's 4096 for small GPUs,
# so a UI's first message with its tools attached (Open WebUI: about 6,300 tokens) fits a small model.
CONTEXT_TIERS = ((47 << 30, 262144), (23 << 30, 32768), (0, 8192))
CONTEXT_FLOOR = 4096  # halving for memory stops here (or at the trained length, when that is smaller)
KV_SHARE = 0.5  # the KV cache, scratch and private weights of the automatic slots may take this share of free memory


def draft_record(service, name: str) -> st.ModelRecord:
    """The store record of a draft model, or InvalidRequest (the request's model exists: not a 404)."""
    try:
        rec = service.record(name)
    except ModelNotFound:
        raise InvalidRequest(f"draft_model {name!r} not found: pull or create it first") from None
    if rec.model_path is None:
        raise InvalidRequest(f"draft_model {name!r} has no weights layer")
    return rec


def load_draft(service, target, rec: st.ModelRecord, load_options: dict, num_gpu: int, slots: int):
    """The ModelDrafter for load_options' draft_model beside `target` (loaded from rec), or None when none is named."""
    name = load_options.get("draft_model") or ""
    if not name:
        return None
    from ..engine.draft_model import ModelDrafter

    path = draft_record(service, name).model_path
    draft = service._load_model(
        path,
        num_ctx=load_options["num_ctx"],
        num_batch=load_options["num_batch"],
        num_gpu=num_gpu,
        main_gpu=load_options["main_gpu"],
        n_slots=slots,
        use_mmap=load_options.get("use_mmap"),
        num_thread=load_options.get("num_thread") or 0,
    )
    try:
        return ModelDrafter(target, draft, name, target_name=rec.name.display)
    except BaseException:
        draft.close()
        raise


def with_draft_need(service, need: MemoryNeed, load_options: dict, slots: int) -> MemoryNeed:
    """need plus what the draft model named in load_options needs (its weights mapped, its KV slots private)."""
    name = load_options.get("draft_model") or ""
    if not name:
        return need
    extra = estimate_memory(
        draft_record(service, name).model_path,
        load_options["num_ctx"],
        load_options["num_batch"],
        slots,
        use_mmap=load_options.get("use_mmap"),
    )
    return MemoryNeed(private=need.private + extra.private, mapped=need.mapped + extra.mapped)


def estimate_memory(
    path,
    num_ctx: int,
    num_batch: int,
    n_slots: int = 1,
    kv_budget: int = 0,
    kv_budget_bytes: int = 0,
    use_mmap: bool | None = None,
) -> MemoryNeed:
    """What a load needs: the weights read through the mmap are reclaimable page cache, and private when use_mmap
    has the loader copy them (localrt.engine.backends.resident); the KV cache (f16 K and V: the
    paged pool of the full-attention layers, kv_budget positions or n_slots * num_ctx, and a ring per slot for
    sliding-window layers) and the batch scratch are private.

    The numbers are the validated config's (InvalidModel for a file the loader would refuse), capped as the
    loader caps them, so a model with layers never counts a zero-size cache."""
    cfg, mapped = read_config(path)
    return memory_need(cfg, mapped, num_ctx, num_batch, n_slots, kv_budget, kv_budget_bytes, use_mmap)


def read_config(path):
    """(the validated ModelConfig, bytes of its tensors) of the GGUF at path."""
    import gguf_io

    from ..engine.compat import ollama_layout, text_tensors
    from ..engine.model import config_from_metadata

    with gguf_io.open(path) as f:
        # as the loader: an embedded vision tower is never read nor copied, Ollama's layouts read as llama.cpp's
        metadata, tensors = ollama_layout(f.metadata, text_tensors(f.tensors))
        return config_from_metadata(metadata, tensors), sum(t.nbytes for t in tensors.values())


def memory_need(
    cfg,
    mapped: int,
    num_ctx: int,
    num_batch: int,
    n_slots: int = 1,
    kv_budget: int = 0,
    kv_budget_bytes: int = 0,
    use_mmap: bool | None = None,
) -> MemoryNeed:
    """estimate_memory's arithmetic on a config already read."""
    from ..engine.backends.resident import private_weights
    from ..engine.kv_cache import KV_BLOCK, budget_positions, pool_blocks, pool_position_bytes

    n_ctx = min(num_ctx, cfg.n_ctx_train)  # as load_model
    n_batch = num_batch if cfg.encoder else min(num_batch, num_ctx)  # an encoder's inputs share a forward (loader)
    per_pos = cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2  # K (n_head_kv, head_dim) + V f16, one layer
    pool_pos = pool_position_bytes(cfg.windows, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    kv_budget = budget_positions(kv_budget, kv_budget_bytes, pool_pos)  # as the Model sizes its pool
    pooled = pool_blocks(n_ctx, n_slots, kv_budget) * KV_BLOCK if n_slots > 0 else 0  # positions of the shared pool
    kv = sum(pooled if w <= 0 else min(n_ctx, w + n_batch) * n_slots for w in cfg.windows) * per_pos
    if cfg.encoder:  # an encoder (engine.encoder) keeps no KV cache; its scores are (n_head, 256, n_tok) f32
        kv = cfg.n_head * 256 * n_ctx * 4
    scratch = (
        n_batch * 8 * max(cfg.n_embd, cfg.n_ff) + 2 * cfg.n_vocab
    ) * 4  # activations of one prefill chunk + a logits row
    scratch += (
        n_batch * (cfg.n_expert + cfg.n_expert_used * cfg.n_embd) * 4
    )  # MoE: router probs, per-rank expert outputs
    private = kv + scratch + (32 << 20)
    if private_weights(use_mmap, mapped):
        return MemoryNeed(private=private + mapped, mapped=0)
    return MemoryNeed(private=private, mapped=mapped)


def kv_counts(cache) -> dict:
    """/api/ps's view of a KV cache: bytes allocated (pool + per-slot rings), bytes holding keys (blocks in use or
    cached, filled ring positions), and the pool's blocks: in use by running sequences, cached, total."""
    pool = cache.pool
    return {
        "kv_cache_bytes": int(cache.nbytes),
        "kv_cache_used_bytes": int(cache.used_bytes),
        "kv_block_size": int(cache.block_size),
        "kv_blocks": int(pool.n_blocks),
        "kv_blocks_in_use": int(pool.n_in_use),
        "kv_blocks_cached": int(pool.n_cached),
    }


def context_ceiling(total_memory: int) -> int:
    return next(ctx for least, ctx in CONTEXT_TIERS if total_memory >= least)


def auto_num_ctx(n_ctx_train: int, total_memory: int, available: int, need: Callable[[int], int]) -> int:
    """The context a model gets when nobody chose one: its trained length, capped by the memory tier, then halved
    while `need(n_ctx)` (private bytes of the load) exceeds KV_SHARE of the available memory, down to the floor."""
    n = min(n_ctx_train, context_ceiling(total_memory))
    floor = min(n, CONTEXT_FLOOR)
    while n > floor and need(n) > available * KV_SHARE:
        n = max(floor, n // 2)
    return n


def system_total_memory() -> int:
    from ..engine.backends.sysmem import physical_memory

    return physical_memory()


def automatic_context(
    name: str, path, num_batch: int, use_mmap, slots: int, available: int, total: int, **kv_budget
) -> int:
    """auto_num_ctx for the model at path, its load needing `slots` KV slots (0: automatic, as AUTO_PARALLEL). A file
    whose config cannot be read gets the floor: its load then fails with the loader's own error."""
    try:
        cfg, mapped = read_config(path)  # once: the halving below only redoes the arithmetic
    except Exception:  # noqa: BLE001 - the load reports what is wrong with the file
        return CONTEXT_FLOOR
    trained = cfg.n_ctx_train
    n = auto_num_ctx(
        trained,
        total,
        available,
        lambda ctx: (
            memory_need(cfg, mapped, ctx, num_batch, slots or AUTO_PARALLEL, use_mmap=use_mmap, **kv_budget).private
        ),
    )
    log.info(
        "%s: context %d chosen (trained %d, %.1f GiB memory, %.1f GiB available)",
        name,
        n,
        trained,
        total / 2**30,
        available / 2**30,
    )
    return n


def with_auto_context(service, rec: st.ModelRecord, opts, request_options):
    """opts with the automatic num_ctx (automatic_context, once per weights file, batch and mmap choice) where
    neither LOCALRT_CONTEXT_LENGTH, the model's params nor the request set one."""
    import dataclasses

    chosen = [layer.get("num_ctx") for layer in (rec.params or {}, request_options or {})]
    if service.config.context_length or rec.model_path is None or any(v is not None for v in chosen):
        return opts
    key = (str(rec.model_path), opts.num_batch, opts.use_mmap)
    if key not in service._auto_ctx:
        service._auto_ctx[key] = automatic_context(
            rec.name.display,
            rec.model_path,
            opts.num_batch,
            opts.use_mmap,
            service._parallel,
            service._available(),
            service._total(),
            **service._kv_budget,
        )
    return dataclasses.replace(opts, num_ctx=service._auto_ctx[key])
