"""The one place that reads LOCALRT_* environment variables. Everything else takes values from here."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
DEFAULT_PORT = 11434


def _data_dir() -> Path:
    return Path(platformdirs.user_data_dir("localrt", appauthor=False))


def parse_host(value: str | None) -> tuple[str, int, str]:
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
            raise ValueError(f"LOCALRT_HOST has an invalid port: {value!r}")
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
    num_parallel: int = 0  # requests one loaded model runs together: 1..16, or 0 = automatic (as Ollama: 4, or 1 where 4 do not fit)
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


def _int(env: dict, key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None


def _nonnegative(env: dict, key: str) -> int:
    value = _int(env, key, 0)
    if value < 0:
        raise ValueError(f"{key} must be 0 (automatic) or a positive integer, got {value}")
    return value


def _bool(env: dict, key: str) -> bool:
    raw = (env.get(key) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{key} must be true or false, got {raw!r}")


def _choice(env: dict, key: str, choices: tuple[str, ...]) -> str:
    """One of choices (the first when unset)."""
    raw = (env.get(key) or "").strip().lower() or choices[0]
    if raw not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def load(env: dict | None = None) -> Config:
    """Build the Config from the environment (or a given mapping, for tests)."""
    env = dict(os.environ if env is None else env)
    host, port, scheme = parse_host(env.get("LOCALRT_HOST"))
    data_dir = Path(env["LOCALRT_DATA"]) if env.get("LOCALRT_DATA") else _data_dir()
    models = Path(env["LOCALRT_MODELS"]) if env.get("LOCALRT_MODELS") else data_dir / "models"
    ro = tuple(Path(p) for p in env.get("LOCALRT_MODELS_READONLY", "").split(os.pathsep) if p.strip())
    origins = tuple(o.strip() for o in env.get("LOCALRT_ORIGINS", "").split(",") if o.strip())
    return Config(
        host=host,
        port=port,
        scheme=scheme,
        models_dir=models,
        readonly_models_dirs=ro,
        data_dir=data_dir,
        keep_alive=env.get("LOCALRT_KEEP_ALIVE", "5m").strip() or "5m",
        num_parallel=_int(env, "LOCALRT_NUM_PARALLEL", 0),
        max_loaded_models=_int(env, "LOCALRT_MAX_LOADED_MODELS", 3),
        max_queue=_int(env, "LOCALRT_MAX_QUEUE", 512),
        origins=origins,
        api_key=env.get("LOCALRT_API_KEY") or None,
        registry=env.get("LOCALRT_REGISTRY") or None,
        registry_token=env.get("LOCALRT_REGISTRY_TOKEN") or None,
        registry_public=_bool(env, "LOCALRT_REGISTRY_PUBLIC"),
        context_length=_nonnegative(env, "LOCALRT_CONTEXT_LENGTH"),
        num_threads=_int(env, "LOCALRT_NUM_THREADS", 0),
        prefix_cache=_choice(env, "LOCALRT_PREFIX_CACHE", ("client", "shared")),
        **_kv_budget(env.get("LOCALRT_KV_BUDGET")),
    )


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _kv_budget(raw: str | None) -> dict:
    """LOCALRT_KV_BUDGET: positions ("16384"), or bytes with a unit ("2GiB", "1.5 GB"); empty or 0: automatic."""
    text = (raw or "").strip().lower().replace(" ", "")
    if not text:
        return {}
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    try:
        value = float(digits) if unit else int(digits)
    except ValueError:
        value = -1
    if value < 0 or (unit and unit not in _UNITS) or value != value or value > 1 << 60:
        raise ValueError(f"LOCALRT_KV_BUDGET must be a number of positions (16384) or a size (2GiB), got {raw!r}")
    return {"kv_budget_bytes": int(value * _UNITS[unit])} if unit else {"kv_budget": int(value)}
