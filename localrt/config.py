"""The one place that reads LOCALRT_* environment variables. Everything else takes values from here.

Where a LOCALRT_ variable has no value, its Ollama twin (OLLAMA_HOST, OLLAMA_MODELS, ...) is read instead, so a
user moving from Ollama keeps the settings they have. Every mistake is a ConfigError naming the variable it came
from; the CLI prints it as one line."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
DEFAULT_PORT = 11434

# LOCALRT_<X> read from OLLAMA_<X> when unset: the variables Ollama documents that mean the same thing here
OLLAMA_TWINS = (
    "HOST",
    "MODELS",
    "KEEP_ALIVE",
    "NUM_PARALLEL",
    "MAX_LOADED_MODELS",
    "MAX_QUEUE",
    "ORIGINS",
    "CONTEXT_LENGTH",
)


class ConfigError(ValueError):
    """A configuration variable's value is wrong; the message starts with the variable's name."""


def _data_dir() -> Path:
    return Path(platformdirs.user_data_dir("localrt", appauthor=False))


def parse_host(value: str | None, name: str = "LOCALRT_HOST") -> tuple[str, int, str]:
    """`LOCALRT_HOST` read the way Ollama reads `OLLAMA_HOST`.

    Forms: "", "host", ":port", "host:port", "[v6]:port", "http://host" (port 80), "https://host" (443).
    Returns (host, port, scheme)."""
    v = (value or "").strip().strip("\"'").strip()
    scheme, port = "http", DEFAULT_PORT
    if "://" in v:
        scheme, v = v.split("://", 1)
        port = 443 if scheme == "https" else 80
    v = v.split("/", 1)[0]
    host, port_text = v, ""
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif v.count(":") == 1:
        host, port_text = v.split(":")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"{name} has an invalid port: {value!r}")
        port = int(port_text)
    return host or DEFAULT_HOST, port, scheme


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Config:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    scheme: str = "http"
    models_dir: Path = field(default_factory=lambda: _data_dir() / "models")
    readonly_models_dirs: tuple[Path, ...] = ()
    data_dir: Path = field(default_factory=_data_dir)
    keep_alive: str = "5m"
    num_parallel: int = (
        0  # requests one loaded model runs together: 1..16, or 0 = automatic (as Ollama: 4, or 1 where 4 do not fit)
    )
    max_loaded_models: int = 3
    max_queue: int = 512
    origins: tuple[str, ...] = ()
    api_key: str | None = None
    registry: str | None = None  # default mirror for short names in pull (http(s):// or file://)
    registry_token: str | None = None  # bearer token sent to mirrors that require one
    registry_public: bool = False  # serve the store's registry routes on a non-loopback bind without a token
    context_length: int = 0  # LOCALRT_CONTEXT_LENGTH; 0: each model's trained length as memory allows (runtime.loading)
    num_threads: int = 0  # 0: all cores
    # "client" (default): a request reuses the cached prompt prefixes of its own client only (the API key's holders
    # where one is set, else the caller's address); "shared": of every client (a single-user machine)
    prefix_cache: str = "client"
    kv_budget: int = 0  # positions of each loaded model's paged KV pool (LOCALRT_KV_BUDGET); 0: num_parallel * num_ctx
    kv_budget_bytes: int = 0  # or its size in bytes (LOCALRT_KV_BUDGET with a unit: "2GiB", "512MB")

    @property
    def base_url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{h}:{self.port}"


def _get(env: dict, key: str) -> tuple[str, str | None]:
    """(the variable actually read, its value): `key` when it has a value, else its OLLAMA_ twin when it has one.
    An empty value counts as unset, as Ollama reads its own variables."""
    suffix = key.removeprefix("LOCALRT_")
    twin = f"OLLAMA_{suffix}"
    if suffix in OLLAMA_TWINS and not (env.get(key) or "").strip() and (env.get(twin) or "").strip():
        return twin, env[twin]
    return key, env.get(key)


def _text(env: dict, key: str, default: str = "") -> str:
    return (_get(env, key)[1] or "").strip() or default


def _int(env: dict, key: str, default: int, lowest: int | None = None, what: str = "") -> int:
    name, raw = _get(env, key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if lowest is not None and value < lowest:
        raise ConfigError(f"{name} must be {what or f'at least {lowest}'}, got {value}")
    return value


def _nonnegative(env: dict, key: str) -> int:
    return _int(env, key, 0, lowest=0, what="0 (automatic) or a positive integer")


def _bool(env: dict, key: str) -> bool:
    raw = (env.get(key) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{key} must be true or false, got {raw!r}")


def _choice(env: dict, key: str, choices: tuple[str, ...]) -> str:
    """One of choices (the first when unset)."""
    raw = (env.get(key) or "").strip().lower() or choices[0]
    if raw not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def _keep_alive(env: dict) -> str:
    """Checked here, so that a typo is an error of every command and not only of the daemon's start."""
    from .api.options import parse_duration  # a leaf of localrt (errors only): no cycle
    from .errors import InvalidRequest

    name, _ = _get(env, "LOCALRT_KEEP_ALIVE")
    value = _text(env, "LOCALRT_KEEP_ALIVE", "5m")
    try:
        parse_duration(value, bare_seconds=True)
    except InvalidRequest as e:
        raise ConfigError(f"{name}: {e}") from None
    return value


def _path(env: dict, key: str) -> Path | None:
    raw = _get(env, key)[1]
    return Path(raw) if raw and raw.strip() else None


def load(env: dict | None = None) -> Config:
    """Build the Config from the environment (or a given mapping, for tests). Raises ConfigError."""
    env = dict(os.environ if env is None else env)
    host_var, host_text = _get(env, "LOCALRT_HOST")
    host, port, scheme = parse_host(host_text, host_var)
    data_dir = _path(env, "LOCALRT_DATA") or _data_dir()
    models = _path(env, "LOCALRT_MODELS") or data_dir / "models"
    ro = tuple(Path(p) for p in env.get("LOCALRT_MODELS_READONLY", "").split(os.pathsep) if p.strip())
    origins = tuple(o.strip() for o in _text(env, "LOCALRT_ORIGINS").split(",") if o.strip())
    return Config(
        host=host,
        port=port,
        scheme=scheme,
        models_dir=models,
        readonly_models_dirs=ro,
        data_dir=data_dir,
        keep_alive=_keep_alive(env),
        num_parallel=_nonnegative(env, "LOCALRT_NUM_PARALLEL"),
        max_loaded_models=_int(env, "LOCALRT_MAX_LOADED_MODELS", 3, lowest=0, what="0 (automatic) or more"),
        max_queue=_int(env, "LOCALRT_MAX_QUEUE", 512, lowest=1),
        origins=origins,
        api_key=env.get("LOCALRT_API_KEY") or None,
        registry=env.get("LOCALRT_REGISTRY") or None,
        registry_token=env.get("LOCALRT_REGISTRY_TOKEN") or None,
        registry_public=_bool(env, "LOCALRT_REGISTRY_PUBLIC"),
        context_length=_nonnegative(env, "LOCALRT_CONTEXT_LENGTH"),
        num_threads=_nonnegative(env, "LOCALRT_NUM_THREADS"),
        prefix_cache=_choice(env, "LOCALRT_PREFIX_CACHE", ("client", "shared")),
        **_kv_budget(env.get("LOCALRT_KV_BUDGET")),
    )


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def _kv_budget(raw: str | None) -> dict:
    """LOCALRT_KV_BUDGET: positions ("16384"), or bytes with a unit ("2GiB", "1.5 GB"); empty or 0: automatic."""
    text = (raw or "").strip().lower().replace(" ", "")
    if not text:
        return {}
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits) :]
    try:
        value = float(digits) if unit else int(digits)
    except ValueError:
        value = -1
    if value < 0 or (unit and unit not in _UNITS) or value != value or value > 1 << 60:
        raise ConfigError(f"LOCALRT_KV_BUDGET must be a number of positions (16384) or a size (2GiB), got {raw!r}")
    return {"kv_budget_bytes": int(value * _UNITS[unit])} if unit else {"kv_budget": int(value)}
