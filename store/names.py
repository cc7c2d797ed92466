"""Model-name grammar, in one place: `[scheme://][host/][namespace/]model[:tag]` as Ollama reads it.

Defaults fill the missing parts (registry.ollama.ai / library / latest). Every part is checked against
Ollama's character and length rules; on top of them a name may not hold `..` (so no part can climb out
of the models directory) nor a Windows device name (CON, NUL, COM1, ...), which no OS may create safely.
Names compare case-insensitively (ASCII only, as Ollama does)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidName

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Allowed characters per part, and length limits (ollama_spec 9.4); the first character is alnum or '_'.
_PART_RULES: dict[str, tuple[re.Pattern, int]] = {
    # Ollama allows any ':' in a host; only `name:port` means something, and anything else could be read as
    # a drive ("C:") by Windows path functions, so the port must be digits.
    "host": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(:[0-9]+)?"), 350),
    "namespace": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*"), 80),
    "model": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80),
    "tag": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80),
}
# A whole name longer than this is refused before any splitting work.
MAX_NAME_LEN = 350 + 1 + 80 + 1 + 80 + 1 + 80 + len("https://")
# One directory level on common file systems holds at most 255 bytes.
MAX_FILENAME_BYTES = 255
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)


@dataclass(frozen=True)
class ModelName:
    """A fully qualified, validated model name. Build it with `parse`; case is preserved."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def display(self) -> str:
        """Shortest form, tag always shown: `m:tag`, `ns/m:tag` or `host/ns/m:tag` (Ollama's DisplayShortest)."""
        if self.host.lower() == DEFAULT_HOST:
            if self.namespace.lower() == DEFAULT_NAMESPACE:
                return f"{self.model}:{self.tag}"
            return f"{self.namespace}/{self.model}:{self.tag}"
        return self.full

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def path_parts(self) -> tuple[str, str, str, str]:
        """Directory levels under `manifests/`: host, namespace, model, tag."""
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Case-insensitive identity (ASCII lower-case, as Ollama compares names)."""
        return tuple(p.lower() for p in self.path_parts)  # type: ignore[return-value]

    def equal_fold(self, other: "ModelName") -> bool:
        return self.key == other.key

    def __str__(self) -> str:
        return self.display


def _check_part(kind: str, value: str, original: str) -> None:
    pattern, max_len = _PART_RULES[kind]
    if not value:
        raise InvalidName(original, f"the {kind} part is empty")
    if len(value) > max_len:
        raise InvalidName(original, f"the {kind} part is longer than {max_len} characters")
    if not pattern.fullmatch(value):
        raise InvalidName(original, f"the {kind} part {value!r} has a character that is not allowed")
    if ".." in value:
        raise InvalidName(original, f"the {kind} part {value!r} contains '..'")
    if len(value.encode()) > MAX_FILENAME_BYTES:
        raise InvalidName(original, f"the {kind} part is too long to be a file name")
    if kind == "host" and re.match(r"[A-Za-z]:", value):
        raise InvalidName(original, f"the host part {value!r} looks like a Windows drive")
    if value.split(".")[0].lower() in _WINDOWS_DEVICES:
        raise InvalidName(original, f"the {kind} part {value!r} is a reserved device name on Windows")


def _strip_scheme(name: str) -> str:
    for scheme in ("https://", "http://"):
        if name.startswith(scheme):
            return name[len(scheme) :]
    return name


def parse(name: str) -> ModelName:
    """Parse and validate a model name, filling default host, namespace and tag.

    Raises `InvalidName` (a ValueError) saying which part is wrong."""
    if not isinstance(name, str):
        raise InvalidName(name, "a model name must be a string")
    if not name:
        raise InvalidName(name, "the name is empty")
    if len(name) > MAX_NAME_LEN:
        raise InvalidName(name[:40] + "...", f"the name is longer than {MAX_NAME_LEN} characters")
    rest = _strip_scheme(name)
    tag = DEFAULT_TAG
    # The tag separator is the last ':' after the last '/', so 'host:port/ns/m' keeps its port.
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag = rest.rsplit(":", 1)
        _check_part("tag", tag, name)
    pieces = rest.split("/")
    if len(pieces) > 3:
        raise InvalidName(name, "expected at most host/namespace/model")
    model = pieces[-1]
    namespace = pieces[-2] if len(pieces) >= 2 else DEFAULT_NAMESPACE
    host = pieces[-3] if len(pieces) == 3 else DEFAULT_HOST
    _check_part("model", model, name)
    _check_part("namespace", namespace, name)
    _check_part("host", host, name)
    return ModelName(host, namespace, model, tag)


def is_valid(name: str) -> bool:
    try:
        parse(name)
    except InvalidName:
        return False
    return True


def from_path_parts(parts: tuple[str, ...] | list[str]) -> ModelName:
    """The name stored at `manifests/<host>/<namespace>/<model>/<tag>`; raises InvalidName for a stray path."""
    if len(parts) != 4:
        raise InvalidName("/".join(parts), "a manifest path has exactly four levels")
    host, namespace, model, tag = parts
    original = f"{host}/{namespace}/{model}:{tag}"
    for kind, value in zip(("host", "namespace", "model", "tag"), parts):
        _check_part(kind, value, original)
    return ModelName(host, namespace, model, tag)
