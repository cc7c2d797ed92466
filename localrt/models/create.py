"""Create a model from a Modelfile: base layers (a GGUF file, a stored blob, or an existing model) plus
adapter / template / system / params / messages / license layers, a config blob and a manifest.

`create(...)` is a generator of Ollama's create progress objects (`{"status": ...}` and, while a file
is imported, `total`/`completed`); errors are raised from it. Nothing is visible under the new name until
the manifest is written, and a replaced manifest's no-longer-used blobs are collected afterwards. What a create
added (blobs it wrote, and uploads it was given that no manifest referenced) and its manifest does not use (the
unquantized source of a quantize; everything, when it fails) is removed when it ends, not left to prune's grace
period; the blobs a running create uses are held against collection by the others (store.holds)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

import gguf_io
import modelfile as mfile
import store as st
from store import manifests as mt

from ..errors import InvalidModel, InvalidRequest
from . import builtins
from .gguf_facts import (  # noqa: F401 - part of create's interface
    FILE_TYPES,
    CreateError,
    _check_model_gguf,
    config_from_gguf,
    gguf_facts,
    human_number,
)

PROGRESS_INTERVAL_S = 0.25  # at most this often a progress object while a file is imported


def status(text: str, **extra: object) -> dict:
    return {"status": text, **extra}


# ----- FROM / ADAPTER arguments ---------------------------------------------------------------------------


def _looks_like_path(arg: str) -> bool:
    return (
        arg.startswith(("/", "./", "../", "~", "\\", ".\\", "..\\"))
        or arg.lower().endswith((".gguf", ".bin"))
        or (len(arg) > 2 and arg[1] == ":" and arg[2] in "/\\")
        or arg == "."
    )


def _blob_ref(arg: str) -> str | None:
    """`@sha256:<hex>`, `sha256:<hex>` or `sha256-<hex>` -> normalized digest; None if not a digest form."""
    a = arg[1:] if arg.startswith("@") else arg
    if a.startswith(("sha256:", "sha256-")):
        return st.digest.normalize(a)  # InvalidDigest for a malformed one
    return None


def _resolve_path(arg: str, base_dir: Path | None) -> Path:
    p = Path(os.path.expanduser(arg))
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    return p


def _classify(arg: str, base_dir: Path | None, allow_paths: bool) -> tuple[str, object]:
    """('blob', digest) | ('file', Path) | ('name', ModelName) for a FROM/ADAPTER argument."""
    digest = _blob_ref(arg)
    if digest is not None:
        return "blob", digest
    if _looks_like_path(arg) or not st.names.is_valid(arg):
        if not allow_paths:
            # One message whether or not the file exists, so a remote caller learns nothing about local files.
            raise CreateError(f"local file paths are not accepted here: {arg!r}; upload the file as a blob")
        path = _resolve_path(arg, base_dir)
        if path.is_dir():
            raise CreateError(f"{arg!r} is a directory; give the path of the .gguf file")
        if not path.is_file():
            raise CreateError(f"no such file {arg!r} (and it is not a valid model name)")
        return "file", path
    if allow_paths:
        path = _resolve_path(arg, base_dir)
        if path.is_file():
            return "file", path  # Ollama's rule: an existing path wins over a model name
    return "name", st.names.parse(arg)


# ----- progress while a long job runs in a thread ---------------------------------------------------------


class _Stop(Exception):
    pass


def _with_progress(job: Callable[[Callable[[int], None]], object], text: str, total: int) -> Iterator[dict]:
    """Run `job(progress)` in a thread, yielding progress objects; returns the job's result."""
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    last = [0.0]

    def progress(done: int) -> None:
        if stop.is_set():
            raise _Stop()
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL_S and done < total:
            last[0] = now
            events.put(("progress", done))

    def run() -> None:
        try:
            events.put(("done", job(progress)))
        except BaseException as e:  # handed to the generator, which re-raises it
            events.put(("error", e))

    worker = threading.Thread(target=run, name="localrt-create", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = events.get()
            if kind == "progress":
                yield status(text, total=total, completed=value)
            elif kind == "error":
                raise value
            else:
                yield status(text, total=total, completed=total)
                return value
    finally:
        stop.set()  # the consumer went away or failed: the job stops at its next chunk
        worker.join()


# ----- layers ---------------------------------------------------------------------------------------------


class _Build:
    """Layers being assembled, plus one status line per layer in order."""

    def __init__(self, store: st.Store, file_names: Mapping[str, str] | None = None):
        self.store = store
        self.file_names = dict(file_names or {})  # digest -> the client's name of the file it uploaded as that blob
        self.layers: list[mt.Layer] = []
        self.config: dict = {}
        self.params: dict = {}
        self.messages: list = []
        # blobs this create added: those it wrote, and uploads it was given that no manifest referenced; whichever
        # of them its manifest does not reference (the unquantized source; all of them if it fails) go when it ends
        self.created: set[str] = set()
        self.used: set[str] = set()  # blobs held against collection while this create runs (store.holds)

    def use(self, digest: str) -> None:
        if digest not in self.used:
            self.store.hold(digest)
            self.used.add(digest)

    def release(self) -> None:
        for d in self.used:
            self.store.release(d)
        self.used.clear()

    def add_blob(self, media_type: str, info: st.BlobInfo, from_: str | None = None) -> dict:
        self.use(info.digest)
        self.layers.append(mt.Layer(media_type, info.digest, info.size, from_))
        if info.created:
            self.created.add(info.digest)
        verb = "creating new layer" if info.created else "using existing layer"
        return status(f"{verb} {info.digest}")

    def add_text(self, media_type: str, text: str) -> dict:
        self.drop(media_type)
        return self.add_blob(media_type, self.store.write_blob(text.encode("utf-8")))

    def drop(self, *media_types: str) -> None:
        self.layers = [x for x in self.layers if x.media_type not in media_types]


def _facts_of(path: Path, label: str, scan: bool = False) -> dict:
    """gguf_facts(path), its InvalidGGUF naming `label` (the user's file) instead of `path`: a blob's store path
    means nothing to the user (issue 46), and a remote caller should not learn the server's paths."""
    try:
        return gguf_facts(path, scan=scan)
    except gguf_io.InvalidGGUF as e:
        text = str(e)
        if str(path) == label:
            raise
        prefix = f"{path}: "
        text = label + ": " + text[len(prefix) :] if text.startswith(prefix) else text.replace(str(path), label)
        raise gguf_io.InvalidGGUF(text) from None


def _import_gguf(b: _Build, path: Path, media_type: str, check: Callable[[dict, str], None]) -> Iterator[dict]:
    """Validate a local GGUF, copy it in (hashed while copied), validate the stored blob; returns facts."""
    yield status("parsing GGUF")
    check(gguf_facts(path), repr(path.name))  # fail fast, before copying gigabytes
    total = path.stat().st_size
    info = yield from _with_progress(lambda cb: b.store.import_file(path, cb), f"copying file {path.name}", total)
    blob = b.store.blob_path(info.digest)
    try:
        # the file may have changed while it was copied; the blob is what counts, its errors naming the file
        facts = _facts_of(blob, str(path), scan=True)
        check(facts, repr(path.name))
    except (gguf_io.InvalidGGUF, CreateError, InvalidModel):
        if info.created:
            b.store.remove_unreferenced([info.digest])
        raise
    yield b.add_blob(media_type, info)
    return facts


def _use_blob(b: _Build, digest: str, media_type: str, check: Callable[[dict, str], None]) -> Iterator[dict]:
    yield status("parsing GGUF")
    b.use(digest)
    path = b.store.blob_path(digest)
    if digest not in b.store.referenced_digests():
        b.created.add(digest)  # an upload made for this create (as `localrt create` and Ollama's clients upload)
    name = b.file_names.get(digest)  # the uploaded file's name, where the request said it (`files`, `adapters`)
    facts = _facts_of(path, name or digest, scan=True)
    check(facts, repr(name) if name else digest)
    yield b.add_blob(media_type, st.BlobInfo(digest, path.stat().st_size, created=False))
    return facts


def _inherit(b: _Build, name: st.ModelName) -> Iterator[dict]:
    rec = model_record(
        b.store, name.display, create_builtin=True
    )  # a built-in model is created on first use  # ManifestNotFound: neither stored nor built in
    src = rec.entry.name.display
    for layer in rec.entry.manifest.layers:
        inherited = mt.Layer(layer.media_type, layer.digest, layer.size, layer.from_ or src, layer.extra)
        b.use(layer.digest)  # a concurrent `rm` of the base model leaves them for this create
        b.layers.append(inherited)
        yield status(f"using existing layer {layer.digest}")
    b.config = {k: v for k, v in rec.config.items() if k not in ("rootfs", "architecture", "os")}
    b.params = dict(rec.params)
    b.messages = list(rec.messages)


def _base(b: _Build, arg: str, base_dir: Path | None, allow_paths: bool) -> Iterator[dict]:
    kind, ref = _classify(arg, base_dir, allow_paths)
    if kind == "name":
        yield from _inherit(b, ref)
        return
    if kind == "file":
        facts = yield from _import_gguf(b, ref, mt.MODEL, _check_model_gguf)
    else:
        facts = yield from _use_blob(b, ref, mt.MODEL, _check_model_gguf)
    b.config = config_from_gguf(facts)


def _adapter(b: _Build, arg: str, base_dir: Path | None, allow_paths: bool) -> Iterator[dict]:
    family = b.config.get("model_family", "")

    def check(facts: dict, what: str) -> None:
        if facts["type"] != "adapter":
            raise CreateError(f"ADAPTER {what} is not a LoRA adapter GGUF (general.type is {facts['type']!r})")
        if family and facts["architecture"] and facts["architecture"] != family:
            raise CreateError(f"ADAPTER {what} is for {facts['architecture']!r} models, the base model is {family!r}")

    kind, ref = _classify(arg, base_dir, allow_paths)
    if kind == "name":
        raise CreateError(f"ADAPTER {arg!r} must be a .gguf file or a blob digest")
    if kind == "file":
        yield from _import_gguf(b, ref, mt.ADAPTER, check)
    else:
        yield from _use_blob(b, ref, mt.ADAPTER, check)


def _quantizer() -> Callable:
    """`localrt.quantize.quantize_model(src, dst, level)`, a generator of (done, total, tensor)."""
    from .quantize import quantize_model

    return quantize_model


# Ollama quantizes only unquantized weights: re-quantizing a quantized model loses quality twice over.
QUANTIZE_SOURCES = ("F32", "F16", "BF16")


def _check_quantize_source(file_type: str | None, what: str) -> None:
    if file_type is not None and file_type not in QUANTIZE_SOURCES:
        raise CreateError(
            f"cannot quantize {what}: its weights are {file_type}; quantization is only supported "
            f"for F16, BF16 and F32 models"
        )


def _source_file_type(store: st.Store, arg: str, base_dir: Path | None, allow_paths: bool) -> str | None:
    """The file type of the weights FROM names, told before anything is written (a FROM that is refused outright
    raises here as it would in the import); None when telling needs the import itself, which then reports what
    is wrong, and _quantize checks the imported layer again."""
    try:
        kind, ref = _classify(arg, base_dir, allow_paths)
        if kind == "file":
            path = ref
        elif kind == "blob":
            path = store.blob_path(ref)
        else:
            path = model_record(store, ref.display, create_builtin=True).model_path
        return gguf_facts(path)["file_type"] if path is not None and Path(path).is_file() else None
    except (st.StoreError, gguf_io.InvalidGGUF, OSError, ValueError):
        return None


def _quantize(b: _Build, level: str, quantize_model: Callable) -> Iterator[dict]:
    models = [x for x in b.layers if x.media_type == mt.MODEL]
    if len(models) != 1:
        raise CreateError("quantize needs exactly one model layer")
    _check_quantize_source(b.config.get("file_type"), "this model")
    src = b.store.blob_path(models[0].digest)
    with gguf_io.open(src) as f:
        sizes = {name: t.nbytes for name, t in f.tensors.items()}
    tmp = b.store.new_temp_file()
    text = f"quantizing {b.config.get('file_type') or 'the'} model to {level.upper()}"
    try:
        try:
            done = 0
            for _count, _tensors, tensor in quantize_model(src, tmp, level):
                done += sizes.get(tensor, 0)
                # Ollama's progress: bytes of the source's weights done, with a placeholder digest clients key bars on
                yield status(text, digest="0000000000000000000", total=sum(sizes.values()), completed=done)
        except ValueError as e:  # quant.QuantError: unsupported level or source tensor types
            raise CreateError(f"cannot quantize: {e}") from None
        yield status("verifying conversion")
        facts = gguf_facts(tmp, scan=True)
        _check_model_gguf(facts, "the quantized model")
        info = b.store.adopt_file(tmp)
    finally:
        tmp.unlink(missing_ok=True)
    b.drop(mt.MODEL)
    b.use(info.digest)
    if info.created:
        b.created.add(info.digest)
    b.layers.insert(0, mt.Layer(mt.MODEL, info.digest, info.size, models[0].from_))
    yield status(f"{'creating new' if info.created else 'using existing'} layer {info.digest}")
    b.config.update(config_from_gguf(facts))


def _check_template(text: str) -> None:
    from ..templates import GoTemplate, TemplateError

    try:
        GoTemplate(text)
    except TemplateError as e:
        raise CreateError(f"template error: {e}") from None


def _text_layers(b: _Build, m: mfile.Modelfile) -> Iterator[dict]:
    """New TEMPLATE/SYSTEM/params/messages layers replace inherited ones; licenses are added to them."""
    if m.template is not None:
        _check_template(m.template)
        b.drop(mt.PROMPT)
        yield b.add_text(mt.TEMPLATE, m.template)
    if m.system is not None:
        yield b.add_text(mt.SYSTEM, m.system)
    if m.parameters:
        if m.parameters.get("draft_model"):
            from ..api.options import resolve

            try:
                resolve({"draft_model": m.parameters["draft_model"]})
            except InvalidRequest as e:
                raise CreateError(f"PARAMETER draft_model: {e}") from None
        b.params.update(m.parameters)  # merged over inherited ones, new values win (as Ollama)
        yield b.add_text(mt.PARAMS, json.dumps(b.params, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    if m.messages:
        b.messages = m.messages
        yield b.add_text(mt.MESSAGES, json.dumps(b.messages, separators=(",", ":"), ensure_ascii=False))
    for text in m.licenses:
        yield b.add_blob(mt.LICENSE, b.store.write_blob(text.encode("utf-8")))


def _write_config(b: _Build) -> Iterator[dict]:
    fields = {k: v for k, v in b.config.items() if k not in mt.CONFIG_KEYS}
    data = mt.config_blob(
        model_format=b.config.get("model_format", "gguf"),
        model_family=b.config.get("model_family", ""),
        model_families=b.config.get("model_families"),
        model_type=b.config.get("model_type", ""),
        file_type=b.config.get("file_type", ""),
        diff_ids=[x.digest for x in b.layers],
        **fields,
    )
    info = b.store.write_blob(data)
    b.use(info.digest)
    if info.created:
        b.created.add(info.digest)
    yield status(f"{'creating new' if info.created else 'using existing'} layer {info.digest}")
    return mt.Layer(mt.CONFIG_MEDIA_TYPE, info.digest, info.size)


def create(
    store: st.Store,
    name: str,
    modelfile: str | mfile.Modelfile,
    *,
    base_dir: str | os.PathLike | None = None,
    quantize: str | None = None,
    allow_local_paths: bool = True,
    file_names: Mapping[str, str] | None = None,
) -> Iterator[dict]:
    """Create (or replace) model `name` from a Modelfile, yielding Ollama's create progress objects.

    FROM may be a local .gguf path (relative to `base_dir`, default the working directory), a stored blob
    (`@sha256:<hex>`), or a model name (its layers are inherited; a built-in model is created on first use).
    With `allow_local_paths=False` (a request from another machine) file paths are refused outright.
    `file_names` (digest -> file name: a request's `files` / `adapters`) names an uploaded blob in errors about
    it, so they name the user's file rather than a digest or the blob's store path.
    `quantize` (e.g. "q4_K_M") converts the model layer with localrt.models.quantize.quantize_model.
    Raises ModelfileError, CreateError, gguf_io.InvalidGGUF, store errors (InvalidName, ManifestNotFound, ...)."""
    # Everything that can be refused without touching the store is checked before the first event, so a
    # server can answer 400 before sending a byte.
    target = st.names.parse(name)
    m = modelfile if isinstance(modelfile, mfile.Modelfile) else mfile.parse(modelfile)
    if len(m.froms) > 1:
        raise CreateError("more than one FROM (a vision projector) is not supported")
    quantize_model = _quantizer() if quantize else None
    base = Path(base_dir) if base_dir is not None else None
    if quantize:
        _check_quantize_source(_source_file_type(store, m.from_, base, allow_local_paths), repr(m.from_))
    yield status("parsing modelfile")
    for w in m.warnings:
        yield status(f"warning: {w}")
    b = _Build(store, file_names)
    written = False
    try:
        yield from _base(b, m.from_, base, allow_local_paths)
        for arg in m.adapters:
            yield from _adapter(b, arg, base, allow_local_paths)
        if quantize:
            yield from _quantize(b, quantize, quantize_model)
        yield from _text_layers(b, m)
        config = yield from _write_config(b)
        manifest = mt.build(config, b.layers)
        yield status("writing manifest")
        old = store.put_manifest(target, manifest)
        written = True
    finally:
        b.release()
        if not written and b.created:  # failed or abandoned: what it added goes at once, not after prune's grace
            with contextlib.suppress(st.StoreError, OSError):
                store.remove_unreferenced(b.created)
    replaced = set(old.digests) - set(manifest.digests) if old is not None else set()
    store.remove_unreferenced(replaced | b.created)
    yield status("success")


# ---- the built-in models, created through the same path ------------------------------------------------------


def ensure_builtin(store: st.Store, name: str) -> bool:
    """Make sure the built-in model `name` refers to is stored, creating it from the installed package if needed.

    Returns False when `name` is not a built-in (nothing done), True when it is stored afterwards. Raises
    builtin_models.BuiltinModelMissing when its PyPI package is not installed."""
    spec = builtins.builtin_for(name)
    if spec is None:
        return False
    with builtins.LOCKS[spec.name]:
        if not store.exists(spec.name):
            path = Path(spec.gguf_path())
            try:
                for _ in create(store, spec.name, spec.modelfile(str(path))):
                    pass
            finally:
                if spec.converted:
                    shutil.rmtree(path.parent, ignore_errors=True)
    return True


def model_record(store: st.Store, name: str, *, create_builtin: bool = False) -> st.ModelRecord:
    """The record of the model `name` means (see resolve()); with `create_builtin`, a built-in model is created
    first when it is not stored yet. Raises store.ManifestNotFound for an unknown model, store.InvalidName for a
    bad name."""
    try:
        return store.model_record(name)
    except st.ManifestNotFound:
        spec = builtins.builtin_for(name)
        if spec is None:
            raise
        if create_builtin:
            ensure_builtin(store, spec.name)
        return store.model_record(spec.name)
