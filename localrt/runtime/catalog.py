"""Model management behind the daemon: list, show, copy, delete, create, blob upload. No HTTP, no tensors."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from typing import Any, Callable, Iterator

import modelfile as mfile
import store as st
from store import manifests as mt

from .. import templates
from ..errors import InvalidModel, InvalidRequest, ModelNotFound
from ..models import library
from ..models.create import create as create_model
from .sampling_extras import embedding_only
from .jobs import LOCAL_CALLER

log = logging.getLogger("localrt.catalog")
MAX_INFO_ARRAY = 5  # /api/show replaces longer metadata arrays by [] unless verbose, as Ollama does


def _name_of(body: dict, what: str = "model") -> str:
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{what} is required")
    return name


def _stamp(entry: st.ModelEntry) -> str:
    return entry.modified_at.astimezone().isoformat()


class BlobWriter:
    """An upload in progress: hashed while written to a temp file in the blobs dir, adopted only if it matches."""

    def __init__(self, store: st.Store, digest: str):
        self.store = store
        self.expected = st.digest.normalize(digest)
        self.tmp = store.new_temp_file()
        self._fh = open(self.tmp, "wb")
        self._hash = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self._fh.write(chunk)

    def commit(self) -> None:
        self._fh.close()
        actual = "sha256:" + self._hash.hexdigest()
        if actual != self.expected:
            self.tmp.unlink(missing_ok=True)
            raise st.DigestMismatch(self.expected, actual)
        self.store.adopt_file(self.tmp)

    def abort(self) -> None:
        try:
            self._fh.close()  # flushing what is buffered fails again on a full disk
        except OSError:
            pass
        finally:
            self.tmp.unlink(missing_ok=True)


class Catalog:
    def __init__(self, store: st.Store):
        self.store = store

    def _entry(self, name: str) -> st.ModelEntry:
        try:
            return self.store.get(library.resolve(self.store, name))
        except st.ManifestNotFound:
            raise ModelNotFound(name) from None

    def details(self, entry: st.ModelEntry) -> dict:
        config = mt.parse_config(self.store.read_blob(entry.manifest.config.digest))
        models = entry.manifest.layers_of(mt.MODEL)
        return mt.details(config, (models[0].from_ or "") if models else "")

    def tags(self) -> dict:
        out = []
        for entry in self.store.list():
            try:
                details = self.details(entry)
            except st.StoreError:
                details = {}
            details["parent_model"] = ""
            name = entry.name.display
            out.append(
                {
                    "name": name,
                    "model": name,
                    "modified_at": _stamp(entry),
                    "size": entry.size,
                    "digest": entry.digest,
                    "details": details,
                }
            )
        return {"models": out}

    def show(self, body: dict, record: Callable[[str], st.ModelRecord]) -> dict:
        name = _name_of(body)
        verbose = bool(body.get("verbose"))
        rec = record(name)
        import gguf_io

        from ..engine.compat import ollama_layout

        meta, tensor_list, layout = {}, [], {}
        if rec.model_path is not None:
            with gguf_io.open(rec.model_path) as f:
                meta = _model_info(f.metadata, verbose)
                tensor_list = [
                    {
                        "name": t.name,
                        "type": gguf_io.GGMLType(t.ggml_type).name,
                        "shape": [int(d) for d in reversed(t.shape)],
                    }
                    for t in f.tensors.values()
                ]
                choice = templates.choose_template(f.metadata, rec.template)
                try:
                    layout, _ = ollama_layout(f.metadata, f.tensors)  # Ollama's embeddinggemma: gemma-embedding
                except InvalidModel:  # show describes even a file the loader refuses
                    layout = f.metadata
        else:
            choice = None
        params = dict(rec.params)
        mf = mfile.build(
            [str(rec.model_path or "")],
            adapters=[str(p) for p in rec.adapter_paths],
            strict=False,
            template=rec.template,
            system=rec.system,
            parameters=params,
            licenses=list(rec.licenses),
            messages=rec.messages,
        )
        arch = str(layout.get("general.architecture", "")) if meta else ""
        caps = ["embedding"] if arch and embedding_only(layout, arch) else ["completion"]
        if choice is not None and caps == ["completion"]:
            tmpl = choice.load()
            if getattr(tmpl, "supports_tools", False):
                caps.append("tools")
            if getattr(tmpl, "supports_insert", False):
                caps.append("insert")
            if templates.thinking_tags(tmpl) is not None or templates.is_harmony(tmpl):  # harmony: gpt-oss
                caps.append("thinking")
        out: dict[str, Any] = {
            "license": "\n".join(rec.licenses),
            "modelfile": mfile.format(mf, show_name=rec.name.display),
            "parameters": mfile.format_parameters(params),
            "template": rec.template if rec.template is not None else (choice.source if choice else ""),
            "system": rec.system or "",
            "details": rec.details,
            "messages": rec.messages,
            "model_info": meta or None,
            "tensors": tensor_list,
            "capabilities": caps,
            "modified_at": _stamp(rec.entry),
        }
        if choice is not None:
            out["template_info"] = {
                "origin": choice.origin,
                "kind": choice.kind,
                "reason": choice.reason,
                "stop": list(params.get("stop") or choice.stop),
            }
        return _finite(out)

    def copy(self, body: dict) -> None:
        src, dst = body.get("source"), body.get("destination")
        for key, value in (("source", src), ("destination", dst)):
            if not isinstance(value, str) or not value:
                raise InvalidRequest(f"{key} is required")
            try:
                st.names.parse(value)
            except st.InvalidName:
                raise InvalidRequest(f'{key} "{value}" is invalid') from None
        self.store.copy(self._entry(src).name.display, dst)

    def delete_name(self, body: dict) -> str:
        name = _name_of(body)
        try:
            return st.names.parse(library.resolve(self.store, name)).display
        except st.InvalidName:
            raise InvalidRequest(f'name "{name}" is invalid') from None

    def delete(self, name: str) -> None:
        try:
            self.store.delete(name)
        except st.ManifestNotFound:
            raise ModelNotFound(name) from None

    def create(self, body: dict) -> Iterator[dict]:
        name = _name_of(body)
        quantize = body.get("quantize") or body.get("quantization")
        if quantize is not None and not isinstance(quantize, str):
            raise InvalidRequest("quantize must be a string")
        file_names: dict[str, str] = {}
        if isinstance(body.get("modelfile"), str) and not (body.get("from") or body.get("files")):
            mf = mfile.parse(body["modelfile"])  # the legacy form: a Modelfile whose FROM names a blob or model
        else:
            mf = _modelfile_from_request(body)
            for key in ("files", "adapters"):  # validated by _modelfile_from_request: errors name the user's file
                for fname, digest in (body.get(key) or {}).items():
                    file_names.setdefault(st.digest.normalize(digest), str(fname))
        # Requests come from the network: a FROM that names a server-side path is refused (CVE-2024-39719).
        return create_model(self.store, name, mf, quantize=quantize, allow_local_paths=False, file_names=file_names)

    def blob_exists(self, digest: str) -> bool:
        return self.store.has_blob(digest)  # sha256:<hex> or the URL/file form sha256-<hex>

    def blob_writer(self, digest: str) -> BlobWriter:
        return BlobWriter(self.store, digest)

    def pull_args(self, body: dict) -> tuple[str, bool]:
        name = _name_of(body)
        insecure = body.get("insecure", False)
        if not isinstance(insecure, bool):
            raise InvalidRequest("insecure must be a boolean")
        from ..distribution.pull import is_path

        if is_path(name) and not LOCAL_CALLER.get():
            # Before anything looks at the path: one answer whether or not it exists (CVE-2024-39719 class).
            raise InvalidRequest(
                "a path on the server can only be pulled from this machine; push the model "
                "or serve the folder as a registry mirror instead"
            )
        return name, insecure


KNOWN_CREATE_FIELDS = {
    "model",
    "name",
    "from",
    "files",
    "adapters",
    "template",
    "system",
    "license",
    "parameters",
    "messages",
    "quantize",
    "quantization",
    "stream",
    "modelfile",
}


def _modelfile_from_request(body: dict) -> mfile.Modelfile:
    unknown = set(body) - KNOWN_CREATE_FIELDS
    if unknown:  # Ollama's rule for every request: what we do not know is ignored, and named once in the log
        log.warning("create request: ignored unknown field(s): %s", ", ".join(sorted(unknown)))
    froms: list[str] = []
    files = body.get("files") or {}
    if not isinstance(files, dict):
        raise InvalidRequest("files must be an object of file name -> digest")
    for fname, digest in files.items():
        if not isinstance(fname, str) or os.path.isabs(fname) or ".." in fname.replace("\\", "/").split("/"):
            raise InvalidRequest("file path must be relative")
        froms.append("@" + st.digest.normalize(digest))
    if body.get("from"):
        if not isinstance(body["from"], str):
            raise InvalidRequest("from must be a string")
        froms.insert(0, body["from"])
    if not froms:
        raise InvalidRequest("neither 'from' or 'files' was specified")
    adapters = body.get("adapters") or {}
    if not isinstance(adapters, dict):
        raise InvalidRequest("adapters must be an object of file name -> digest")
    licenses = body.get("license") or []
    licenses = [licenses] if isinstance(licenses, str) else licenses
    if not isinstance(licenses, list) or not all(isinstance(x, str) for x in licenses):
        raise InvalidRequest("license must be a string or an array of strings")
    messages = body.get("messages") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be an array of objects")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("parameters must be an object")
    for key in ("template", "system"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise InvalidRequest(f"{key} must be a string")
    try:
        return mfile.build(
            froms,
            adapters=["@" + st.digest.normalize(d) for d in adapters.values()],
            template=body.get("template"),
            system=body.get("system"),
            parameters=params,
            licenses=licenses,
            messages=[{"role": m.get("role"), "content": m.get("content", "")} for m in messages],
        )
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


def _model_info(meta: dict, verbose: bool) -> dict:
    out = {}
    for key, value in meta.items():
        if key in ("general.name", "tokenizer.chat_template"):
            continue
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, list) and len(value) > MAX_INFO_ARRAY and not verbose:
            value = []
        out[key] = value
    return json.loads(json.dumps(_finite(out), default=str))


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no spelling for them (JavaScript's JSON.stringify does the same),
    and the reply encoder refuses them, so one such metadata value made all of /api/show fail."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
