"""`load_model(path, num_ctx=...)`: open a GGUF file, configure, view weights in place (or copy them into private memory:
`use_mmap`, backends.resident), build a Model."""

from __future__ import annotations

import os
import time
from pathlib import Path

from simd_kernels.warm import init_target, init_target_in_background

from ..errors import ModelLoadError
from . import arch as archs
from .arch.common import TensorSource, select_rope_factors
from .backends.backend import CPUBackend, QTensor
from .backends.heap import retain_freed_memory
from .backends.offload import offload
from .backends.resident import PrivateWeights, private_size, private_weights
from .compat import ollama_layout, text_model_tensors
from .kv_cache import KV_TYPES
from .encoder import Encoder
from .model import Model, config_from_metadata

DEFAULT_NUM_CTX = 4096


def load_model(
    path: str | os.PathLike,
    num_ctx: int = DEFAULT_NUM_CTX,
    *,
    num_batch: int = 512,
    n_slots: int = 1,
    kv_type: str = "f16",
    tokenizer: bool = True,
    num_gpu: int = -1,
    main_gpu: int = 0,
    kv_budget: int = 0,
    kv_budget_bytes: int = 0,
    use_mmap: bool | None = None,
    num_thread: int = 0,
) -> Model:
    """Load a GGUF model for inference. num_ctx is capped by the model's trained context length.

    kv_type "f16" (default) keeps keys and values at float16 precision as llama.cpp does; "f32" keeps
    them exact. n_slots is the number of sequences the KV cache holds at once. num_gpu / main_gpu place
    the last layers on a GPU as Ollama's options do (-1 automatic, 0 CPU only; see localrt.engine.backends.placement);
    `model.placement` records the decision and its VRAM bytes. kv_budget: positions of the paged KV pool the
    full-attention layers share (0: n_slots * num_ctx; at least one full context; see localrt.engine.kv_cache), or
    kv_budget_bytes its size in bytes. use_mmap: Ollama's option; False copies the weights into private memory, True
    reads them through the mmap, None decides by their size (localrt.engine.backends.resident). num_thread: Ollama's
    option, the most threads a forward uses (0: all of the process's; simd_kernels.threads.capped).
    """
    t0 = time.perf_counter_ns()
    if num_ctx <= 0 or num_batch <= 0 or n_slots <= 0 or kv_budget < 0 or kv_budget_bytes < 0 or num_thread < 0:
        raise ModelLoadError(
            f"num_ctx, num_batch and n_slots must be positive and the KV budget and num_thread not "
            f"negative, got {num_ctx}, {num_batch}, {n_slots}, {kv_budget or kv_budget_bytes}, {num_thread}"
        )
    if kv_type not in KV_TYPES:
        raise ModelLoadError(f"kv_type must be one of {KV_TYPES}, got {kv_type!r}")
    # Numba's one-time start-up (a no-op once warm_up's thread is done), here rather than in the first kernel call:
    # it ends in gc.freeze(), which this model's objects must not join, so that unloading it frees them all.
    init_target()
    retain_freed_memory()  # a forward's per-op buffers are reused from the heap, not faulted in anew (backends.heap)
    f = _open_gguf(Path(path))
    try:
        # without an embedded vision tower, and Ollama's own layouts as llama.cpp's (engine.compat)
        metadata, file_tensors = ollama_layout(f.metadata, text_model_tensors(f.metadata, f.tensors))
        cfg = config_from_metadata(metadata, file_tensors)  # validated against the file before anything is allocated
        backend = CPUBackend()
        tensors = {
            name: QTensor(name, t.ggml_type, tuple(int(d) for d in t.shape), t.data) for name, t in file_tensors.items()
        }
        huge_pages = None  # the start of the thread moving a private copy onto huge pages
        datas = [t.data for t in tensors.values()]  # uint8 views into the file's mmap
        if private_weights(use_mmap, sum(d.nbytes for d in datas)):
            private = PrivateWeights(private_size(datas))
            copies = private.copy_all(datas, [not d.flags.writeable for d in datas])  # drop the read-only file pages
            tensors = {name: QTensor(t.name, t.ggml_type, t.shape, c) for (name, t), c in zip(tensors.items(), copies)}
            huge_pages = private.to_huge_pages
        weights = archs.get(cfg.arch).load(cfg, TensorSource(tensors, backend))
        n_ctx = min(num_ctx, cfg.n_ctx_train)
        tok = _tokenizer(metadata) if tokenizer else None
        # an encoder has no KV cache and no GPU layers; num_ctx bounds each input, num_batch the tokens of the inputs
        # that share a forward (as llama-server's -b over its slots): not capped by the context
        if cfg.encoder:
            model = Encoder(
                cfg,
                metadata,
                weights,
                backend,
                tok,
                num_ctx=n_ctx,
                num_batch=num_batch,
                source=f,
                num_thread=num_thread,
            )
            model.load_duration_ns = time.perf_counter_ns() - t0
            return model
        select_rope_factors(weights, cfg, n_ctx)
        model = Model(
            cfg,
            metadata,
            weights,
            backend,
            tok,
            num_ctx=n_ctx,
            num_batch=min(num_batch, num_ctx),
            n_slots=n_slots,
            kv_type=kv_type,
            kv_budget=kv_budget,
            kv_budget_bytes=kv_budget_bytes,
            source=f,
            num_thread=num_thread,
        )
        offload(model, num_gpu, main_gpu)
    except BaseException:
        f.close()
        raise
    model.load_duration_ns = time.perf_counter_ns() - t0
    model.after_first_forward = huge_pages  # Model.finish_loading starts it
    return model


def warm_up():
    """Start the kernels' one-time runtime start-up (Numba's target context and runtime: simd_kernels.warm) on a
    background thread, so that a daemon's first load does not pay it; returns the thread."""
    return init_target_in_background()


def _tokenizer(metadata: dict):
    from .tokenizer import Tokenizer

    return Tokenizer.from_gguf(metadata)


def _open_gguf(path: Path):
    import gguf_io

    if not path.is_file():
        raise ModelLoadError(f"model file {str(path)!r} does not exist")
    # InvalidGGUF (a ValueError) names what is wrong and where. String arrays (the vocabulary, merges) stay
    # in the mapping as offsets; the tokenizer indexes them there instead of as Python str objects.
    return gguf_io.open(path, lazy_strings=True)
