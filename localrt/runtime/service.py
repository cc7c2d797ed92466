"""The daemon's core, below HTTP: requests in, native reply dicts (or iterators of them) out.

Inference goes through the scheduler: one worker owns each loaded model, and the prompt is built and run
on that worker. Model management (tags, show, create, copy, delete, blobs) is in `catalog.py`.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import store as st

from .. import structured, templates
from ..api.options import Options, config_layer, resolve
from ..api.types import ChatRequest, EmbedRequest, GenerateRequest
from ..engine.backends import heap
from ..engine.events import Done, Token
from ..errors import Cancelled, InvalidRequest, ModelLoadError, ModelNotFound
from ..models import library
from ..templates.toolcalls import ToolCallParser, tag_for_template
from . import embed, rerank
from .batch_driver import BatchDriver
from .catalog import Catalog
from .jobs import AUTO_PARALLEL, CLIENT, Events, Mapped, system_available_memory
from .loaded import Loaded, now_rfc3339, unloads
from .loading import estimate_memory, load_draft, system_total_memory, with_auto_context, with_draft_need
from .scheduler import MemoryNeed, Request, Scheduler
from .sampling_extras import (
    Pending,
    cache_scope,
    count_tokens,
    prompt_ids,
    request_ids,
    refuse_embedding_only,
    request_constraint,
)
from .sampling_extras import sampling_kwargs as _sampling
from .reasoning import HARMONY, ChatItems, GenerateItems, Split, after_reasoning, default_think, tags_for

log = logging.getLogger("localrt.service")

# How long a request waits for the instance of a replaced model (create/copy over its name, other weights) to
# finish its work and unload, before the new weights are loaded; the same wait as a load-option reload.
REPLACED_WAIT_S = 600.0


def _once(item: dict) -> Events:
    return Events(iter([item]))


class Service:
    def __init__(
        self,
        config,
        *,
        load_model: Callable | None = None,
        scheduler_kw: dict | None = None,
        gpu_probe: Callable | None = None,
        total_memory_fn: Callable[[], int] | None = None,
    ):
        self.config = config
        self.store = st.Store(config.models_dir, config.readonly_models_dirs)
        self.catalog = Catalog(self.store)
        if load_model is None:
            from ..engine.loader import load_model
        self._load_model = load_model
        self._gpu_probe = gpu_probe  # main_gpu -> a DeviceReport (engine.backends.devices.probe by default)
        self._weights: dict[str, Any] = {}  # name -> the weights file its loaded instance was loaded from
        self._weights_lock = threading.Lock()
        self._parallel = int(getattr(config, "num_parallel", 1))  # KV slots per loaded model; 0: automatic
        self._auto_slots: dict[tuple, int] = {}  # (weights, num_ctx, num_batch) -> slots chosen automatically
        self._auto_ctx: dict[tuple, int] = {}  # (weights, num_batch, use_mmap) -> num_ctx chosen automatically
        # A model's KV pool: {"kv_budget": positions} or {"kv_budget_bytes": bytes} (LOCALRT_KV_BUDGET); {}: slots * num_ctx.
        self._kv_budget = {
            k: int(getattr(config, k, 0)) for k in ("kv_budget", "kv_budget_bytes") if getattr(config, k, 0)
        }
        self._available = (scheduler_kw or {}).get("available_fn") or system_available_memory
        self._total = total_memory_fn or system_total_memory
        self.scheduler = Scheduler(
            self._load, config, estimate_fn=self._estimate, **{"on_unloaded": _release_memory, **(scheduler_kw or {})}
        )

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
        num_gpu = self._num_gpu(load_options["num_gpu"], load_options["main_gpu"])
        slots = self._slots_for(rec.model_path, load_options)
        model = self._load_model(
            rec.model_path,
            num_ctx=load_options["num_ctx"],
            num_batch=load_options["num_batch"],
            num_gpu=num_gpu,
            main_gpu=load_options["main_gpu"],
            n_slots=slots,
            use_mmap=load_options.get("use_mmap"),
            num_thread=load_options.get("num_thread") or 0,
            **self._kv_budget,
        )
        with self._weights_lock:
            self._weights[name] = rec.model_path
        draft = None
        try:
            draft = load_draft(self, model, rec, load_options, num_gpu, slots)  # None unless draft_model names one
            choice = templates.choose_template(model.metadata, rec.template)
            driver = BatchDriver(model, min(slots, model.cache.n_slots), draft) if hasattr(model, "cache") else None
            return Loaded(
                name, model, rec, choice.load(), tuple(choice.stop), time.perf_counter_ns() - t0, driver, draft
            )
        except BaseException:
            model.close()
            if draft is not None:
                draft.close()
            raise

    def _num_gpu(self, num_gpu: int, main_gpu: int) -> int:
        """Ollama's rule for layers asked for on a GPU that is not there: a warning, and the CPU (not an error)."""
        if num_gpu <= 0:
            return num_gpu
        probe = self._gpu_probe
        if probe is None:
            from ..engine.backends.devices import probe
        report = probe(main_gpu)
        if report.gpu is not None:
            return num_gpu
        log.warning(
            "num_gpu %d asks for GPU layers, but no GPU is usable (%s): the model runs on the CPU",
            num_gpu,
            report.reason or "none found",
        )
        return 0

    def _unload_if_replaced(self, name: str, rec: st.ModelRecord) -> None:
        """A loaded instance of other weights than `name` now names (create/copy replaced it) is unloaded once its
        work is done, so this request loads the new ones, as Ollama reloads when the model path changes."""
        with self._weights_lock:
            loaded_from = self._weights.get(name)
        if loaded_from is not None and loaded_from != rec.model_path:
            log.info("model %s was replaced: unloading the instance of its old weights", name)
            self.scheduler.unload(name, wait=REPLACED_WAIT_S)

    def _estimate(self, name: str, load_options: dict) -> MemoryNeed:
        rec = self.record(name)
        if rec.model_path is None:
            return MemoryNeed(private=0)
        slots = self._slots_for(rec.model_path, load_options)
        return with_draft_need(
            self,
            estimate_memory(
                rec.model_path,
                load_options["num_ctx"],
                load_options["num_batch"],
                slots,
                use_mmap=load_options.get("use_mmap"),
                **self._kv_budget,
            ),
            load_options,
            slots,
        )

    def _slots_for(self, path, load_options: dict) -> int:
        """KV slots: LOCALRT_NUM_PARALLEL when set (the scheduler refuses a load that does not fit), else 4 where 4
        slots' KV cache fits in the memory available at the first estimate, else 1 (once per weights and context)."""
        if self._parallel:
            return self._parallel
        key = (str(path), load_options["num_ctx"], load_options["num_batch"], load_options.get("use_mmap"))
        if key not in self._auto_slots:
            need = estimate_memory(
                path,
                load_options["num_ctx"],
                load_options["num_batch"],
                AUTO_PARALLEL,
                use_mmap=load_options.get("use_mmap"),
                **self._kv_budget,
            )
            available = self._available()
            slots = AUTO_PARALLEL if need.private <= available else 1
            if slots < AUTO_PARALLEL:
                log.info(
                    "%s: 4 KV slots need %.1f GiB, %.1f GiB is available: 1 slot",
                    path,
                    need.private / 2**30,
                    available / 2**30,
                )
            self._auto_slots[key] = slots
        return self._auto_slots[key]

    def options(self, rec: st.ModelRecord, request_options: dict) -> Options:
        """Defaults < server config < the model's params < the request. Unknown and deprecated keys are ignored
        (Ollama's "invalid option provided"); the HTTP edge names the request's in its warning line. A num_ctx that
        none of them sets is chosen for the model (loading.auto_num_ctx), once per weights file."""
        opts = resolve(config_layer(self.config), rec.params, request_options, ignore_unknown=True)
        return with_auto_context(self, rec, opts, request_options)

    def _submit(self, name: str, opts: Options, keep_alive, work, rec: st.ModelRecord | None = None) -> Events:
        self._unload_if_replaced(name, rec if rec is not None else self.record(name, create_builtin=False))
        stream = self.scheduler.submit(Request(model=name, options=opts, keep_alive=keep_alive, work=work))
        return Events(iter(stream), stream)

    def _one_result(self, name: str, opts: Options, keep_alive, work, rec: st.ModelRecord, cancel=None) -> dict:
        """The one item a non-streaming work (embed, rerank) yields; `cancel` (a jobs.Cancel, set when the client
        goes away) stops it at its next step or withdraws it from the queue, and the call raises Cancelled."""
        events = self._submit(name, opts, keep_alive, work, rec)
        if cancel is not None:
            cancel.add_hook(events.cancel)
        try:
            out = list(events)
        except BaseException:
            events.cancel()
            raise
        if out:
            return out[0]
        raise Cancelled() if cancel is not None and cancel.is_set() else InvalidRequest("request canceled")

    def _load_or_unload(self, name: str, opts: Options, keep_alive, reply: Callable[[str], dict]) -> Events:
        if unloads(keep_alive, None):
            self.scheduler.unload(name)
            return _once(reply("unload"))
        return self._submit(name, opts, keep_alive, lambda loaded, req, cancelled: iter([reply("load")]))

    # ---- inference ---------------------------------------------------------------------------------

    def generate(self, req: GenerateRequest) -> Events:
        rec = self.record(req.model, create_builtin=not unloads(req.keep_alive, req.prompt or req.suffix))
        name = rec.name.display
        opts = self.options(rec, req.options)
        structured.check_format(req.format)  # a bad schema is a 400 before anything is scheduled
        base = lambda: {"model": req.model, "created_at": now_rfc3339()}  # noqa: E731
        scope = cache_scope(req, self.config, CLIENT.get())
        if not req.prompt and not req.suffix and not req.prompt_tokens:
            return self._load_or_unload(
                name, opts, req.keep_alive, lambda why: {**base(), "response": "", "done": True, "done_reason": why}
            )

        def work(loaded: Loaded, _req, cancelled: threading.Event) -> Mapped:
            loaded.use_record(rec)
            model = loaded.model
            context_text = model.detokenize(req.context) if req.context else ""
            refuse_embedding_only(model, rec.name.full, "generate")
            n_ctx = min(opts.num_ctx, model.num_ctx)
            tags = None if req.raw else tags_for(loaded.template, req, rec.name.full)
            think = default_think(req.think, tags)
            prompt = templates.generate_prompt(
                None if req.template else loaded.template,
                req.prompt,
                system=req.system or "",
                model_system=rec.system or "",
                model_messages=rec.messages,
                suffix=req.suffix,
                raw=req.raw,
                template_override=req.template or "",
                context_text=context_text,
                has_context=req.context is not None,
                num_ctx=n_ctx,
                count_tokens=lambda t: len(model.tokenize(t, limit=n_ctx)),
                truncate=req.truncate,
                think=think,
            )
            ids = request_ids(model, req, prompt.text, n_ctx, opts.num_keep if req.truncate else None)
            constraint = structured.compile_format(req.format, model.tokenizer) if req.format else None
            constraint = after_reasoning(constraint, tags, prompt.text, think)
            events = _run(loaded, ids, opts, cancelled, constraint, cache_scope=scope, **_sampling(req))
            return Mapped(
                events,
                GenerateItems(
                    Split(tags, prompt.text, think), Pending(req.logprobs), base, req.raw, loaded.take_load_ns
                ),
            )

        return self._submit(name, opts, req.keep_alive, work, rec)

    def chat(self, req: ChatRequest, *, count_only: bool = False) -> Events:
        """The reply's events; with count_only one event, {"input_tokens": n}: the prompt as it would run."""
        rec = self.record(req.model, create_builtin=not unloads(req.keep_alive, req.messages))
        name = rec.name.display
        opts = self.options(rec, req.options)
        structured.check_format(req.format)
        base = lambda: {"model": req.model, "created_at": now_rfc3339()}  # noqa: E731
        scope = cache_scope(req, self.config, CLIENT.get())
        if not req.messages:
            return self._load_or_unload(
                name,
                opts,
                req.keep_alive,
                lambda why: {
                    **base(),
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": why,
                },
            )
        messages = [m.to_dict() for m in req.messages]

        def reply(content: str, calls: list, thinking: str = "", **extra) -> dict:
            msg: dict = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = [c.native() for c in calls]
            return {**base(), "message": msg, **extra}

        def work(loaded: Loaded, _req, cancelled: threading.Event) -> Mapped | list[dict]:
            loaded.use_record(rec)
            model = loaded.model
            refuse_embedding_only(model, rec.name.full, "chat")
            if req.tools and not loaded.template.supports_tools:
                raise InvalidRequest(f"{rec.name.full} does not support tools")
            n_ctx = min(opts.num_ctx, model.num_ctx)  # the request's, not the load's
            tags = tags_for(loaded.template, req, rec.name.full)
            think = default_think(req.think, tags)
            prompt = templates.chat_prompt(
                loaded.template,
                messages,
                model_system=rec.system or "",
                model_messages=rec.messages,
                tools=req.tools or None,
                num_ctx=n_ctx,
                count_tokens=lambda t: len(model.tokenize(t, limit=n_ctx)),
                truncate=req.truncate,
                think=think,
            )
            if prompt.n_dropped:  # as Ollama: the oldest turns go, the system prompt, tools and last message stay
                log.warning(
                    "%s: truncating input messages which exceed the context length: %d of %d dropped, "
                    "%s tokens kept of %d",
                    name,
                    prompt.n_dropped,
                    len(messages),
                    prompt.n_tokens,
                    n_ctx,
                )
            if count_only:  # counted as far as a context-length error would count it
                return [{"input_tokens": count_tokens(model, prompt.text, n_ctx)}]
            ids = prompt_ids(model, prompt.text, n_ctx)
            tag = tag_for_template(loaded.template)
            constraint = after_reasoning(request_constraint(tag, req, model, tags), tags, prompt.text, think)
            parser = ToolCallParser(tag, req.tools) if req.tools and tags is not HARMONY else None
            events = _run(loaded, ids, opts, cancelled, constraint, cache_scope=scope, **_sampling(req))
            return Mapped(
                events,
                ChatItems(Split(tags, prompt.text, think), parser, Pending(req.logprobs), reply, loaded.take_load_ns),
            )

        return self._submit(name, opts, req.keep_alive, work, rec)

    def embed(self, req: EmbedRequest, cancel=None) -> dict:
        """/api/embed and its /v1 and legacy shapes (runtime.embed)."""
        return embed.run(self, req, cancel)

    def rerank(self, req, cancel=None) -> dict:
        """llama-server's /v1/rerank on a reranker model, scheduled as embed is (runtime.rerank)."""
        return rerank.run(self, req, cancel)

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
            models.append(
                {
                    "name": info.name,
                    "model": info.name,
                    "size": int(info.size),
                    "size_vram": info.size_vram,
                    "digest": digest,
                    "details": rec_details,
                    "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "context_length": int(info.context_length),
                    **info.slots,
                }
            )
        return {"models": models}

    def tags(self) -> dict:
        return self.catalog.tags()

    def show(self, body: dict) -> dict:
        shown: list[st.ModelRecord] = []

        def record(name: str) -> st.ModelRecord:
            shown.append(self.record(name, create_builtin=False))
            return shown[-1]

        out = self.catalog.show(body, record)
        info = out.get("model_info")
        if isinstance(info, dict) and "general.parameter_count" not in info and shown and shown[-1].model_path:
            info["general.parameter_count"] = parameter_count(shown[-1].model_path)
        return out

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
        return _pull.pull(
            self.store, name, insecure=insecure, default_registry=self.config.registry, token=self.config.registry_token
        )

    def push(self, body: dict) -> Iterator[dict]:
        from ..distribution import push as _push

        name, insecure = self.catalog.pull_args(body)
        return _push.push(self.store, name, insecure=insecure, token=self.config.registry_token)


def _run(
    loaded: Loaded, ids: list[int], opts: Options, cancelled: threading.Event, constraint=None, **sampling
) -> Iterator[Token | Done]:
    """The engine's events for one request, with the template's stop strings added: the model's batch driver's
    Submission (read straight by the request's consumer), or the model's own generator where it has no driver.
    The engine checks `cancelled` between prefill chunks and decode steps."""
    options = opts.to_dict()
    if not options["stop"] and loaded.template_stop:
        options["stop"] = list(loaded.template_stop)
    if loaded.driver is not None:  # stepped together with the model's other requests
        return loaded.driver.submit(ids, options, constraint, cancelled, **sampling)
    return loaded.model.generate(ids, options, cancelled=cancelled, constraint=constraint, **sampling)


def parameter_count(path) -> int:
    """general.parameter_count as Ollama reports it: the file's own, else the elements of every tensor."""
    from ..models.create import gguf_facts

    return int(gguf_facts(path)["parameter_count"])


def _release_memory() -> None:
    """After a model was unloaded: collect what its objects' cycles still hold, then hand the heap's free pages back
    (engine.backends.heap: its arrays under 32 MiB lived in the heap, which keeps freed memory while serving)."""
    gc.collect()
    heap.release_freed_memory()
