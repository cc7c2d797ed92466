"""The daemon's core, below HTTP: requests in, native reply dicts (or iterators of them) out.

Inference goes through the scheduler: one worker owns each loaded model, and the prompt is built and run
on that worker. Model management (tags, show, create, copy, delete, blobs) is in `catalog.py`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import numpy as np

import store as st

from .. import structured, templates
from ..api.options import Options, config_layer, parse_duration, resolve
from ..api.types import ChatRequest, EmbedRequest, GenerateRequest
from ..engine.events import Done, Token
from ..errors import Cancelled, InvalidRequest, ModelLoadError, ModelNotFound
from ..models import library
from ..templates.toolcalls import ToolCallParser, tag_for_template
from .catalog import Catalog
from .scheduler import MemoryNeed, Request, Scheduler

log = logging.getLogger("localrt.service")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Loaded:
    """A model on a worker: the engine model plus what prompt building needs from the store."""

    name: str
    model: Any  # localrt.engine.model.Model
    record: st.ModelRecord
    template: Any  # templates.ChatTemplate
    template_stop: tuple[str, ...]
    unreported_load_ns: int = 0  # the load's duration, reported once, by the request that waited for it

    @property
    def size_vram(self) -> int:
        plan = getattr(self.model, "placement", None)
        return int(getattr(plan, "vram_bytes", 0) or 0)

    def take_load_ns(self) -> int:
        ns, self.unreported_load_ns = self.unreported_load_ns, 0
        return ns

    def close(self) -> None:
        self.model.close()


class Events:
    """An iterator of reply dicts over a scheduler stream, with a thread-safe cancel() for the HTTP layer."""

    def __init__(self, it: Iterator[dict], stream=None):
        self._it = it
        self._stream = stream

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._it)

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()


def _once(item: dict) -> Events:
    return Events(iter([item]))


class Service:
    def __init__(self, config, *, load_model: Callable | None = None, scheduler_kw: dict | None = None):
        self.config = config
        self.store = st.Store(config.models_dir, config.readonly_models_dirs)
        self.catalog = Catalog(self.store)
        if load_model is None:
            from ..engine.loader import load_model
        self._load_model = load_model
        self.scheduler = Scheduler(self._load, config, estimate_fn=self._estimate, **(scheduler_kw or {}))

    def close(self) -> None:
        self.scheduler.stop()

    # ---- loading -------------------------------------------------------------------------------------

    def record(self, name: str, *, create_builtin: bool = True) -> st.ModelRecord:
        """The model a request names; inference creates a built-in model on first use, `show` does not."""
        try:
            return library.model_record(self.store, name, create_builtin=create_builtin)
        except st.ManifestNotFound:
            raise ModelNotFound(name) from None

    def _load(self, name: str, load_options: dict) -> Loaded:
        rec = self.record(name)
        if rec.model_path is None:
            raise ModelLoadError(f"model '{name}' has no weights layer")
        if rec.adapter_paths:
            raise ModelLoadError(f"model '{name}' has a LoRA adapter; adapters are not supported by this runtime yet")
        if rec.projector_paths:
            raise ModelLoadError(f"model '{name}' has a vision projector; vision is not supported yet")
        t0 = time.perf_counter_ns()
        model = self._load_model(rec.model_path, num_ctx=load_options["num_ctx"], num_batch=load_options["num_batch"],
                                 num_gpu=load_options["num_gpu"], main_gpu=load_options["main_gpu"])
        try:
            choice = templates.choose_template(model.metadata, rec.template)
            return Loaded(name, model, rec, choice.load(), tuple(choice.stop), time.perf_counter_ns() - t0)
        except BaseException:
            model.close()
            raise

    def _estimate(self, name: str, load_options: dict) -> MemoryNeed:
        rec = self.record(name)
        if rec.model_path is None:
            return MemoryNeed(private=0)
        return estimate_memory(rec.model_path, load_options["num_ctx"], load_options["num_batch"])

    def options(self, rec: st.ModelRecord, request_options: dict) -> Options:
        opts = resolve(config_layer(self.config), rec.params, request_options)
        if opts.ignored:
            log.info("ignoring deprecated option(s) %s, as Ollama does", ", ".join(opts.ignored))
        return opts

    def _submit(self, name: str, opts: Options, keep_alive, work) -> Events:
        stream = self.scheduler.submit(Request(model=name, options=opts, keep_alive=keep_alive, work=work))
        return Events(iter(stream), stream)

    def _load_or_unload(self, name: str, opts: Options, keep_alive, reply: Callable[[str], dict]) -> Events:
        if _unloads(keep_alive, None):
            self.scheduler.unload(name)
            return _once(reply("unload"))
        return self._submit(name, opts, keep_alive, lambda loaded, req, cancelled: iter([reply("load")]))

    # ---- inference ---------------------------------------------------------------------------------

    def generate(self, req: GenerateRequest) -> Events:
        rec = self.record(req.model, create_builtin=not _unloads(req.keep_alive, req.prompt or req.suffix))
        name = rec.name.display
        opts = self.options(rec, req.options)
        structured.check_format(req.format)  # a bad schema is a 400 before anything is scheduled
        base = lambda: {"model": req.model, "created_at": now_rfc3339()}  # noqa: E731
        if not req.prompt and not req.suffix:
            return self._load_or_unload(name, opts, req.keep_alive,
                                        lambda why: {**base(), "response": "", "done": True, "done_reason": why})

        def work(loaded: Loaded, _req, cancelled: threading.Event) -> Iterator[dict]:
            model = loaded.model
            context_text = model.detokenize(req.context) if req.context else ""
            prompt = templates.generate_prompt(
                None if req.template else loaded.template, req.prompt, system=req.system or "",
                model_system=rec.system or "", model_messages=rec.messages, suffix=req.suffix, raw=req.raw,
                template_override=req.template or "", context_text=context_text, has_context=req.context is not None,
                num_ctx=min(opts.num_ctx, model.num_ctx), count_tokens=lambda t: len(model.tokenize(t)),
                truncate=req.truncate)
            ids = model.tokenize(prompt.text)
            constraint = structured.compile_format(req.format, model.tokenizer) if req.format else None
            for ev in _run(loaded, ids, opts, cancelled, constraint):
                if isinstance(ev, Done):
                    out = {**base(), "response": ev.text, **_metrics(ev, loaded.take_load_ns())}
                    if not req.raw:
                        out["context"] = list(ev.context)
                    yield out
                else:
                    yield {**base(), "response": ev.text, "done": False}

        return self._submit(name, opts, req.keep_alive, work)

    def chat(self, req: ChatRequest) -> Events:
        rec = self.record(req.model, create_builtin=not _unloads(req.keep_alive, req.messages))
        name = rec.name.display
        opts = self.options(rec, req.options)
        structured.check_format(req.format)
        base = lambda: {"model": req.model, "created_at": now_rfc3339()}  # noqa: E731
        if not req.messages:
            return self._load_or_unload(name, opts, req.keep_alive, lambda why: {
                **base(), "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": why})
        messages = [m.to_dict() for m in req.messages]

        def reply(content: str, calls: list, **extra) -> dict:
            msg: dict = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = [c.native() for c in calls]
            return {**base(), "message": msg, **extra}

        def work(loaded: Loaded, _req, cancelled: threading.Event) -> Iterator[dict]:
            model = loaded.model
            if req.tools and not loaded.template.supports_tools:
                raise InvalidRequest(f"{rec.name.full} does not support tools")
            prompt = templates.chat_prompt(
                loaded.template, messages, model_system=rec.system or "", model_messages=rec.messages,
                tools=req.tools or None, num_ctx=min(opts.num_ctx, model.num_ctx),  # the request's, not the load's
                count_tokens=lambda t: len(model.tokenize(t)), truncate=req.truncate)
            ids = model.tokenize(prompt.text)
            constraint = structured.compile_format(req.format, model.tokenizer) if req.format else None
            parser = ToolCallParser(tag_for_template(loaded.template), req.tools) if req.tools else None
            for ev in _run(loaded, ids, opts, cancelled, constraint):
                got = parser.feed(ev.text) if parser else None
                content, calls = (got.content, got.calls) if got else (ev.text, [])
                if isinstance(ev, Done):
                    if parser:
                        rest = parser.flush()
                        content, calls = content + rest.content, calls + rest.calls
                    yield reply(content, calls, **_metrics(ev, loaded.take_load_ns()))
                elif content or calls:
                    yield reply(content, calls, done=False)

        return self._submit(name, opts, req.keep_alive, work)

    def embed(self, req: EmbedRequest, cancel=None) -> dict:
        """`cancel` (a jobs.Cancel, set when the client goes away) stops the work between inputs, or withdraws the
        request while it waits in the queue; the call then raises Cancelled."""
        rec = self.record(req.model, create_builtin=not _unloads(req.keep_alive, req.inputs))
        name = rec.name.display
        opts = self.options(rec, req.options)
        t0 = time.perf_counter_ns()
        if not req.inputs:
            list(self._load_or_unload(name, opts, req.keep_alive, lambda why: {}))
            return {"model": req.model, "embedding": []} if req.legacy else {"model": req.model, "embeddings": []}

        def work(loaded: Loaded, _req, cancelled: threading.Event) -> Iterator[dict]:
            model = loaded.model
            limit = min(opts.num_ctx, model.num_ctx)  # the request's context, whatever the model was loaded with
            vectors, count = [], 0
            for text in req.inputs:
                if cancelled.is_set():
                    return
                ids = model.tokenize(text)
                if len(ids) > limit:
                    if not req.truncate:
                        raise InvalidRequest("input exceeds maximum context length")
                    ids = ids[:limit]
                count += len(ids)
                vectors.append(np.asarray(model.embed(ids), dtype=np.float64))
            yield {"vectors": vectors, "count": count, "load": loaded.take_load_ns()}

        events = self._submit(name, opts, req.keep_alive, work)
        if cancel is not None:
            cancel.add_hook(events.cancel)  # the worker stops at its next input; a queued request is withdrawn
        try:
            out = list(events)
        except BaseException:
            events.cancel()
            raise
        if not out:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            raise InvalidRequest("request canceled")
        result = out[0]
        if req.legacy:
            return {"embedding": [float(x) for x in result["vectors"][0]]}
        embeddings = [_normalize(v, req.dimensions) for v in result["vectors"]]
        return {"model": req.model, "embeddings": embeddings, "total_duration": time.perf_counter_ns() - t0,
                "load_duration": result["load"], "prompt_eval_count": result["count"]}

    # ---- models ------------------------------------------------------------------------------------

    def ps(self) -> dict:
        models = []
        for info in self.scheduler.ps():
            try:
                entry = self.store.get(info.name)
                rec_details, digest = self.catalog.details(entry), entry.digest
            except st.StoreError:
                rec_details, digest = {}, ""
            expires = info.expires_at or datetime(2318, 1, 1, tzinfo=timezone.utc)
            models.append({"name": info.name, "model": info.name, "size": int(info.size), "size_vram": info.size_vram,
                           "digest": digest, "details": rec_details,
                           "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                           "context_length": int(info.context_length)})
        return {"models": models}

    def tags(self) -> dict:
        return self.catalog.tags()

    def show(self, body: dict) -> dict:
        return self.catalog.show(body, lambda name: self.record(name, create_builtin=False))

    def copy(self, body: dict) -> None:
        self.catalog.copy(body)

    def delete(self, body: dict) -> None:
        name = self.catalog.delete_name(body)
        self.scheduler.unload(name)
        self.catalog.delete(name)

    def create(self, body: dict) -> Iterator[dict]:
        return self.catalog.create(body)

    def blob_exists(self, digest: str) -> bool:
        return self.catalog.blob_exists(digest)

    def blob_writer(self, digest: str):
        return self.catalog.blob_writer(digest)

    def pull(self, body: dict) -> Iterator[dict]:
        from ..distribution import pull as _pull

        name, insecure = self.catalog.pull_args(body)
        if not _pull.is_path(name) and library.is_builtin(name):
            return library.pull_builtin(self.store, name)
        return _pull.pull(self.store, name, insecure=insecure, default_registry=self.config.registry,
                          token=self.config.registry_token)

    def push(self, body: dict) -> Iterator[dict]:
        from ..distribution import push as _push

        name, insecure = self.catalog.pull_args(body)
        return _push.push(self.store, name, insecure=insecure, token=self.config.registry_token)


def _unloads(keep_alive, work) -> bool:
    """A request with nothing to do and keep_alive 0 only unloads: it never creates a built-in model."""
    return not work and keep_alive is not None and parse_duration(keep_alive) == 0


def estimate_memory(path, num_ctx: int, num_batch: int) -> MemoryNeed:
    """What a load needs: the weights stay in the mmap (reclaimable page cache); the KV cache (f32 K and V for
    every layer and position) and the batch scratch are private."""
    import gguf_io

    with gguf_io.open(path) as f:
        md = f.metadata
        arch = md.get("general.architecture", "")
        n_layer = int(md.get(f"{arch}.block_count", 0) or 0)
        n_embd = int(md.get(f"{arch}.embedding_length", 0) or 0)
        n_head = int(md.get(f"{arch}.attention.head_count", 1) or 1)
        n_head_kv = md.get(f"{arch}.attention.head_count_kv", n_head)
        n_head_kv = int(max(n_head_kv) if hasattr(n_head_kv, "__len__") else n_head_kv)
        head_dim = int(md.get(f"{arch}.attention.key_length", n_embd // max(n_head, 1)) or 0)
        n_vocab = len(md.get("tokenizer.ggml.tokens", ())) or 32000
        mapped = sum(t.nbytes for t in f.tensors.values())
        trained = md.get(f"{arch}.context_length", 2048)
    num_ctx = min(num_ctx, int(trained) if isinstance(trained, int) and trained > 0 else 2048)  # the loader's cap
    kv = 2 * n_layer * num_ctx * n_head_kv * head_dim * 4  # (2, n_layer, n_ctx, n_head_kv, head_dim) f32
    scratch = (num_batch * 8 * n_embd + 2 * n_vocab) * 4  # activations of one prefill chunk + a logits row
    return MemoryNeed(private=kv + scratch + (32 << 20), mapped=mapped)


def _run(loaded: Loaded, ids: list[int], opts: Options, cancelled: threading.Event,
         constraint=None) -> Iterator[Token | Done]:
    """The engine's events for one request, with the template's stop strings added. The engine checks
    `cancelled` between prefill chunks and decode steps; the scheduler stops pulling events once it is set."""
    options = opts.to_dict()
    if not options["stop"] and loaded.template_stop:
        options["stop"] = list(loaded.template_stop)
    gen = loaded.model.generate(ids, options, cancelled=cancelled, constraint=constraint)
    try:
        yield from gen
    finally:
        gen.close()


def _metrics(ev: Done, load_ns: int) -> dict:
    return {"done": True, "done_reason": ev.done_reason, "total_duration": ev.total_duration + load_ns,
            "load_duration": ev.load_duration + load_ns, "prompt_eval_count": ev.prompt_eval_count,
            "prompt_eval_duration": ev.prompt_eval_duration, "eval_count": ev.eval_count,
            "eval_duration": ev.eval_duration}


def _normalize(v: np.ndarray, dims: int | None) -> list[float]:
    if dims is not None:
        if dims > len(v):
            raise InvalidRequest(f"dimensions must be at most {len(v)}, got {dims}")
        v = v[:dims]
    norm = float(np.linalg.norm(v))
    return [float(x) for x in (v / norm if norm > 0 else v)]
