"""Docker v2 image manifests with Ollama's media types, and the config blob (ollama_spec 9.3).

Parsing is strict about what we rely on (digests, sizes, media types) and keeps unknown keys, so a
manifest written by a newer Ollama survives a read/write round trip."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import digest as dg
from .errors import InvalidDigest, InvalidManifest

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
_PREFIX = "application/vnd.ollama.image."
MODEL = _PREFIX + "model"
ADAPTER = _PREFIX + "adapter"
PROJECTOR = _PREFIX + "projector"
TEMPLATE = _PREFIX + "template"
PROMPT = _PREFIX + "prompt"  # legacy name of the template layer; read as a template
SYSTEM = _PREFIX + "system"
PARAMS = _PREFIX + "params"
MESSAGES = _PREFIX + "messages"
LICENSE = _PREFIX + "license"
EMBED = _PREFIX + "embed"  # obsolete; kept in manifests, never used

MAX_LAYERS = 4096  # a real model has a handful; a hostile manifest may claim a million
MAX_MANIFEST_BYTES = 4 << 20
MAX_BLOB_SIZE = 1 << 50  # 1 PiB: any larger size is a lie


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int
    from_: str | None = None
    extra: tuple[tuple[str, object], ...] = ()  # unknown keys, kept in order for round trips

    def to_json(self) -> dict:
        d: dict = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.from_:
            d["from"] = self.from_
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class Manifest:
    config: Layer
    layers: tuple[Layer, ...]
    schema_version: int = 2
    media_type: str = MANIFEST_MEDIA_TYPE
    extra: tuple[tuple[str, object], ...] = field(default=())

    @property
    def size(self) -> int:
        """Sum of layer sizes plus the config size (what /api/tags reports)."""
        return self.config.size + sum(layer.size for layer in self.layers)

    @property
    def digests(self) -> list[str]:
        """Every blob this manifest needs: config first, then layers."""
        return [self.config.digest] + [layer.digest for layer in self.layers]

    def layers_of(self, *media_types: str) -> list[Layer]:
        return [layer for layer in self.layers if layer.media_type in media_types]

    def to_json(self) -> dict:
        d = {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        d.update(self.extra)
        return d

    def to_bytes(self) -> bytes:
        """Compact JSON with a trailing newline, as Ollama writes locally created manifests."""
        return (json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _layer(obj: object, where: str) -> Layer:
    if not isinstance(obj, dict):
        raise InvalidManifest(where, "a layer is not a JSON object")
    media_type, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
    if not isinstance(media_type, str) or not media_type:
        raise InvalidManifest(where, "a layer has no mediaType")
    try:
        dg.validate(digest)
    except InvalidDigest:
        raise InvalidManifest(where, f"layer digest {str(digest)[:80]!r} is not sha256:<64 hex>") from None
    # bool is an int subclass in Python; JSON true is not a size.
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_BLOB_SIZE:
        raise InvalidManifest(where, f"layer {digest} has an invalid size {size!r}")
    from_ = obj.get("from")
    if from_ is not None and not isinstance(from_, str):
        raise InvalidManifest(where, f"layer {digest} has a non-string 'from'")
    extra = tuple((k, v) for k, v in obj.items() if k not in ("mediaType", "digest", "size", "from"))
    return Layer(media_type, digest, size, from_ or None, extra)


def parse(data: bytes, where: str = "") -> Manifest:
    """Parse manifest bytes; raises InvalidManifest naming `where` (a model name or path)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidManifest(where, f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidManifest(where, f"not JSON ({e})") from None
    except RecursionError:  # nested deeper than the parser's stack
        raise InvalidManifest(where, "JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise InvalidManifest(where, "not a JSON object")
    if obj.get("schemaVersion") != 2:
        raise InvalidManifest(where, f"schemaVersion is {obj.get('schemaVersion')!r}, expected 2")
    layers = obj.get("layers")
    if not isinstance(layers, list):
        raise InvalidManifest(where, "'layers' is not a list")
    if len(layers) > MAX_LAYERS:
        raise InvalidManifest(where, f"{len(layers)} layers (at most {MAX_LAYERS})")
    media_type = obj.get("mediaType", MANIFEST_MEDIA_TYPE)
    if not isinstance(media_type, str):
        raise InvalidManifest(where, "'mediaType' is not a string")
    known = ("schemaVersion", "mediaType", "config", "layers")
    return Manifest(
        config=_layer(obj.get("config"), where),
        layers=tuple(_layer(layer, where) for layer in layers),
        media_type=media_type,
        extra=tuple((k, v) for k, v in obj.items() if k not in known),
    )


def build(config: Layer, layers: list[Layer]) -> Manifest:
    return Manifest(config=config, layers=tuple(layers))


# Keys `config_blob` writes itself; any other key of a source config is carried over as-is.
CONFIG_KEYS = frozenset(
    ["model_format", "model_family", "model_families", "model_type", "file_type", "architecture", "os", "rootfs"]
)


def config_blob(
    *,
    model_format: str = "gguf",
    model_family: str = "",
    model_families: list[str] | None = None,
    model_type: str = "",
    file_type: str = "",
    diff_ids: list[str] = (),
    **optional: object,
) -> bytes:
    """The image config (ConfigV2) in Ollama's key order; `optional` adds keys such as context_length."""
    cfg: dict = {
        "model_format": model_format,
        "model_family": model_family,
        "model_families": list(model_families) if model_families else ([model_family] if model_family else []),
        "model_type": model_type,
        "file_type": file_type,
    }
    cfg.update({k: v for k, v in optional.items() if v not in (None, "")})
    # Constant placeholders: Ollama writes them too; they say nothing about this machine.
    cfg.update({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}})
    return json.dumps(cfg, separators=(",", ":"), ensure_ascii=False).encode()


def parse_config(data: bytes) -> dict:
    """The config blob as a dict; tolerant (older Ollama configs lack the model_* keys)."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def details(config: dict, parent_model: str = "") -> dict:
    """The `details` object of /api/tags and /api/show, from a config dict."""
    families = config.get("model_families")
    family = config.get("model_family") or ""
    return {
        "parent_model": parent_model,
        "format": config.get("model_format") or "",
        "family": family,
        "families": list(families) if isinstance(families, list) else ([family] if family else None),
        "parameter_size": config.get("model_type") or "",
        "quantization_level": config.get("file_type") or "",
    }
