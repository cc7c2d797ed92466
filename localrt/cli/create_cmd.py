"""`localrt create`'s client side: the Modelfile is parsed here, local weight files are uploaded as blobs (with
progress: a GGUF is hundreds of megabytes), and the modern create request is sent."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

from .progress import ProgressView


class AdapterMissing(Exception):
    pass


def create_body(client, model: str, file: Path, quantize: str | None, view: ProgressView) -> dict:
    """The create request for the Modelfile at `file`; raises ModelfileError, AdapterMissing."""
    from modelfile import parse

    mf = parse(file.read_text(encoding="utf-8"))
    body: dict = {"model": model}
    if quantize:
        body["quantize"] = quantize
    files: dict[str, str] = {}
    adapters: dict[str, str] = {}
    named = []  # (kind, argument, its path): all checked before the first upload, which a refusal would strand
    for kind, args in [("from", a) for a in mf.froms] + [("adapter", a) for a in mf.adapters]:
        path = Path(os.path.expanduser(args))
        named.append((kind, args, path if path.is_absolute() else file.parent / path))
        if kind == "adapter" and not named[-1][2].is_file():
            raise AdapterMissing(f"adapter file {args} not found")
    for kind, args, path in named:
        if path.is_file():
            (files if kind == "from" else adapters)[path.name] = upload(client, path, view)
        else:
            body["from"] = args
    for key, value in (("template", mf.template), ("system", mf.system)):
        if value is not None:
            body[key] = value
    if mf.licenses:
        body["license"] = mf.licenses
    if mf.messages:
        body["messages"] = mf.messages
    if mf.parameters:
        body["parameters"] = mf.parameters
    if files:
        body["files"] = files
    if adapters:
        body["adapters"] = adapters
    return body


def _bar(view: ProgressView, status: str, total: int, **key: str) -> Callable[[int], None]:
    return lambda done: view.event({"status": status, **key, "total": total, "completed": done})


def upload(client, path: Path, view: ProgressView) -> str:
    """Hash `path` and upload it as a blob unless the daemon has it; returns its digest."""
    size = path.stat().st_size
    h, done = hashlib.sha256(), 0
    hashed = _bar(view, f"hashing {path.name}", size)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            done += len(block)
            hashed(done)
    digest = "sha256:" + h.hexdigest()
    client.create_blob(path, digest, progress=_bar(view, "transferring model data", size, digest=digest))
    return digest
