"""Ollama's modern /api/create request body (ollama_spec 3.1) as a Modelfile, so one create() path serves
both the CLI's Modelfile and API clients. Uploaded files are referenced as `@sha256:<hex>` blobs."""

from __future__ import annotations

import posixpath

from . import params as P
from .format import param_text
from .parser import ROLES, Command, Modelfile, ModelfileError


def _err(msg: str) -> ModelfileError:
    return ModelfileError(0, msg)


def _files(body: dict, key: str) -> list[str]:
    """Digests of an uploaded-files map {relative file name: "sha256:<hex>"} (validated by the store later)."""
    files = body.get(key)
    if files is None:
        return []
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise _err(f"'{key}' must be an object mapping file names to digests")
    for name in files:
        norm = posixpath.normpath(name.replace("\\", "/"))
        if not name or norm.startswith(("/", "../")) or norm == ".." or ":" in name.split("/")[0]:
            raise _err("file path must be relative")
    return ["@" + d for d in files.values()]


def _param_commands(parameters: object, warnings: list[str]) -> list[Command]:
    if parameters is None:
        return []
    if not isinstance(parameters, dict):
        raise _err("'parameters' must be an object")
    out = []
    for name, value in parameters.items():
        if name in P.DEPRECATED:
            warnings.append(f"parameter {name} is deprecated and is ignored")
            continue
        if name not in P.TYPES:
            raise _err(f"unknown parameter '{name}'")
        if name == "stop" and isinstance(value, str):
            value = [value]  # openapi.yaml allows a bare string; Ollama's code wants a list
        if P.TYPES[name] == P.FLOAT and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if P.TYPES[name] == P.INT and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON numbers may arrive as 4096.0
        try:
            P.check_json_value(name, value)
        except P.ParamError as e:
            raise _err(str(e)) from None
        for v in value if isinstance(value, list) else [value]:
            out.append(Command("parameter", param_text(v), param=name, value=v))
    return out


def _messages(messages: object) -> list[Command]:
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise _err("'messages' must be a list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise _err("each message needs a 'role' and a string 'content'")
        if m.get("role") not in ROLES:
            raise _err('message role must be one of "system", "user", or "assistant"')
        out.append(Command("message", m.get("content", ""), role=m["role"]))
    return out


def _text(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise _err(f"'{key}' must be a string")
    return value or None


def from_create_request(body: dict) -> Modelfile:
    """The Modelfile a modern create request describes. Raises ModelfileError(0, msg) for a bad body."""
    if not isinstance(body, dict):
        raise _err("the request must be a JSON object")
    froms = _files(body, "files")
    base = _text(body, "from")
    if base and froms:
        raise _err("give either 'from' or 'files', not both")
    if base:
        froms = [base]
    if not froms:
        raise _err("neither 'from' or 'files' was specified")
    warnings: list[str] = []
    cmds = [Command("from", f) for f in froms] + [Command("adapter", a) for a in _files(body, "adapters")]
    for key in ("template", "system"):
        value = _text(body, key)
        if value is not None:
            cmds.append(Command(key, value))
    cmds += _param_commands(body.get("parameters"), warnings)
    licenses = body.get("license")
    licenses = [licenses] if isinstance(licenses, str) else (licenses or [])
    if not isinstance(licenses, list) or not all(isinstance(x, str) for x in licenses):
        raise _err("'license' must be a string or a list of strings")
    cmds += [Command("license", x) for x in licenses] + _messages(body.get("messages"))
    return Modelfile(cmds, warnings)
