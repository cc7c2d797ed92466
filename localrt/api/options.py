"""Ollama's generation options: names, types, defaults, range checks, layering; and keep_alive durations.

Facts from Ollama v0.13 (`api/types.go`: Options, Runner, DefaultOptions, FromMap, Duration), see
`shared/reference/ollama_spec.md` sections 5 and 6. A key we do not know is Ollama's "invalid option provided":
requests ignore it (`resolve(..., ignore_unknown=True)` lists it in `Options.ignored`; the HTTP edge logs it),
while a single parameter set by name (`/set parameter`) is refused. Where we are stricter than Ollama it is on
purpose (pain_points sections 4 and 8): a non-integral number for an integer option or an out-of-range value is
an `InvalidRequest` naming the option, never a silent truncation or skip.

`repeat_penalty` defaults to 1.1, Ollama's default through the v0.13 era this project targets (it became
1.0 much later, in v0.32.10).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from ..errors import InvalidRequest

NUM_CTX_MAX = 1 << 20  # sane cap: a 1M-token KV cache is far beyond any model we can run on a PC
NUM_BATCH_MAX = 1 << 16
NUM_THREAD_MAX = 1024  # pain_points 8.20: num_thread 100000 must be refused
NUM_GPU_MAX = 1 << 16  # layers to offload; -1 = automatic
SEED_MAX = (1 << 63) - 1  # Ollama's seed is a Go int (int64)
INT32_MAX = (1 << 31) - 1
STOP_MAX_COUNT = 256
STOP_MAX_CHARS = 4096
DRAFT_MAX = 256  # draft_num_predict: the engine drafts fewer where more rows would change a token's numerics
DRAFT_NAME_MAX = 512  # draft_model: a store name (host/namespace/model:tag); the store checks its grammar at load
DRAFT_DEFAULT = 16  # llama.cpp's default speculative.n_max; the engine adapts below it (localrt.engine.speculative)

# Options that decide how a model is loaded; changing one (num_ctx upwards) means a reload.
# draft_model too: the draft model is loaded beside the model (an instance with a draft serves requests without one).
LOAD_TIME = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "draft_model")

# Keys the official Python client 0.6.x still models and Ollama v0.13 accepts and ignores (it logs
# "invalid option provided"). We accept them too, after a type check, and report them in `Options.ignored`.
DEPRECATED: dict[str, tuple[type, str]] = {
    "numa": (bool, "NUMA pinning was removed from Ollama before v0.5.0"),
    "low_vram": (bool, "removed in Ollama v0.7.0; memory is planned per model"),
    "f16_kv": (bool, "removed in Ollama v0.7.0; the KV cache type is fixed by the runtime"),
    "logits_all": (bool, "removed in Ollama v0.7.0; only the last position's logits are computed"),
    "vocab_only": (bool, "removed in Ollama v0.7.0; a model is always loaded with its weights"),
    "use_mlock": (bool, "removed in Ollama v0.7.0; weights stay in the page cache of the mmap"),
    "embedding_only": (bool, "removed in Ollama v0.7.0; every model serves generation and embeddings"),
    "tfs_z": (float, "tail-free sampling was removed from llama.cpp and Ollama (v0.6.0)"),
    "penalize_newline": (bool, "removed in Ollama v0.6.0; newlines are penalized like any token"),
    "mirostat": (int, "removed in Ollama v0.7.0; the top_k/top_p/min_p chain is always used"),
    "mirostat_tau": (float, "removed in Ollama v0.7.0 together with mirostat"),
    "mirostat_eta": (float, "removed in Ollama v0.7.0 together with mirostat"),
}


@dataclass(frozen=True)
class Options:
    """Resolved options. Field names, types and defaults are Ollama's (`DefaultOptions`)."""

    # load time (Runner)
    num_ctx: int = 4096
    num_batch: int = 512
    num_gpu: int = -1  # -1: the runtime decides how many layers go to a GPU
    main_gpu: int = 0
    use_mmap: bool | None = None  # None: the runtime decides (mmap on)
    num_thread: int = 0  # 0: the runtime decides (all allowed cores)
    # per request
    num_keep: int = 4
    seed: int = -1  # -1: a fresh random seed per sampler
    num_predict: int = -1  # -1: until a stop or the context is full; -2: fill the context
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_last_n: int = 64  # 0: off, -1: num_ctx
    temperature: float = 0.8
    repeat_penalty: float = 1.1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    # speculative decoding (not Ollama's): the most tokens drafted per step, 0 = off; and the name of a draft
    # model in the store with the model's tokenizer, loaded beside it ("" = none: drafts come from prompt lookup)
    draft_num_predict: int = DRAFT_DEFAULT
    draft_model: str = ""
    ignored: tuple[str, ...] = ()  # keys that were given and ignored: DEPRECATED ones, and unknown ones

    def load_options(self) -> dict[str, Any]:
        """The load-time subset, for the scheduler and the loader."""
        return {name: getattr(self, name) for name in LOAD_TIME}

    def to_dict(self) -> dict[str, Any]:
        """Every option as Ollama names it (without `ignored`); `stop` as a list."""
        out = asdict(self)
        out.pop("ignored")
        out["stop"] = list(self.stop)
        return out


# name -> (kind, low, high); None = unbounded on that side. Floats must also be finite.
_RULES: dict[str, tuple[str, float | None, float | None]] = {
    "num_ctx": ("int", 1, NUM_CTX_MAX),
    "num_batch": ("int", 1, NUM_BATCH_MAX),
    "num_gpu": ("int", -1, NUM_GPU_MAX),
    "main_gpu": ("int", 0, 255),
    "use_mmap": ("bool?", None, None),
    "num_thread": ("int", 0, NUM_THREAD_MAX),
    "num_keep": ("int", -1, NUM_CTX_MAX),
    "seed": ("int", -1, SEED_MAX),
    "num_predict": ("int", -2, INT32_MAX),
    "top_k": ("int", 0, INT32_MAX),
    "top_p": ("float", 0.0, 1.0),
    "min_p": ("float", 0.0, 1.0),
    "typical_p": ("float", 0.0, 1.0),
    "repeat_last_n": ("int", -1, NUM_CTX_MAX),
    "temperature": ("float", 0.0, None),
    "repeat_penalty": ("float>0", 0.0, None),
    "presence_penalty": ("float", None, None),
    "frequency_penalty": ("float", None, None),
    "stop": ("stop", None, None),
    "draft_num_predict": ("int", 0, DRAFT_MAX),
    "draft_model": ("draft_model", None, None),
}
assert set(_RULES) == {f.name for f in fields(Options)} - {"ignored"}


def ignored_options(layer: Mapping[str, Any] | None) -> list[str]:
    """The keys of one options object that no option reads: unknown and deprecated ones, in order."""
    if not isinstance(layer, Mapping):
        return []
    return [str(k) for k in layer if k not in _RULES]


def resolve(*layers: Mapping[str, Any] | None, ignore_unknown: bool = False) -> Options:
    """Merge option layers over the defaults; later layers win (defaults < model params < request).

    A layer is a mapping from Ollama option names to JSON values; None layers and None values are
    skipped (as FromMap skips JSON null). Raises InvalidRequest naming the option on a bad value, and on an
    unknown key unless `ignore_unknown` (then it is listed in `ignored`, as deprecated keys are)."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            raise InvalidRequest(f"options must be an object, got {type(layer).__name__}")
        for key, raw in layer.items():
            if raw is None:
                continue
            if key in _RULES:
                values[key] = _check(key, raw)
            elif key in DEPRECATED:
                _check_deprecated(key, raw)
                if key not in ignored:
                    ignored.append(key)
            elif ignore_unknown:
                if key not in ignored:
                    ignored.append(str(key))
            else:
                raise InvalidRequest(f"unknown option {key!r}")
    return Options(**values, ignored=tuple(ignored))


def _check(key: str, raw: Any) -> Any:
    kind, low, high = _RULES[key]
    if kind == "int":
        value = _as_int(key, raw)
    elif kind == "bool?":
        if not isinstance(raw, bool):
            raise InvalidRequest(f"option {key!r} must be a boolean, got {raw!r}")
        return raw
    elif kind == "stop":
        return _as_stop(raw)
    elif kind == "draft_model":
        return _as_draft_model(raw)
    else:
        value = _as_float(key, raw)
        if kind == "float>0" and value <= 0:
            raise InvalidRequest(f"option {key!r} must be greater than 0, got {raw!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequest(f"option {key!r} must be in {_range_text(low, high)}, got {raw!r}")
    return value


def _range_text(low: float | None, high: float | None) -> str:
    lo = "-inf" if low is None else repr(low)
    hi = "inf" if high is None else repr(high)
    return f"[{lo}, {hi}]"


def _as_int(key: str, raw: Any) -> int:
    # bool is an int subclass in Python but not a JSON number.
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidRequest(f"option {key!r} must be an integer, got {raw!r}")
    if isinstance(raw, float):
        # JSON numbers arrive as floats from some clients (4096.0); Ollama truncates 2.5 to 2, we refuse.
        if not math.isfinite(raw) or raw != int(raw):
            raise InvalidRequest(f"option {key!r} must be an integer, got {raw!r}")
        return int(raw)
    return raw


def _as_float(key: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidRequest(f"option {key!r} must be a number, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value):
        raise InvalidRequest(f"option {key!r} must be a finite number, got {raw!r}")
    return value


def _as_stop(raw: Any) -> tuple[str, ...]:
    # Ollama wants an array; its openapi.yaml and many clients send a bare string, so both are accepted.
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)):
        raise InvalidRequest(f"option 'stop' must be a string or an array of strings, got {raw!r}")
    if len(items) > STOP_MAX_COUNT:
        raise InvalidRequest(f"option 'stop' has {len(items)} entries, at most {STOP_MAX_COUNT} are allowed")
    for item in items:
        if not isinstance(item, str):
            raise InvalidRequest(f"option 'stop' must contain only strings, got {item!r}")
        if not item:
            raise InvalidRequest("option 'stop' must not contain an empty string")
        if len(item) > STOP_MAX_CHARS:
            raise InvalidRequest(f"option 'stop' entries must be at most {STOP_MAX_CHARS} characters")
    return tuple(items)


def _as_draft_model(raw: Any) -> str:
    if not isinstance(raw, str):
        raise InvalidRequest(f"option 'draft_model' must be a model name (a string), got {raw!r}")
    if len(raw) > DRAFT_NAME_MAX or any(c.isspace() or not c.isprintable() for c in raw):
        raise InvalidRequest(
            f"option 'draft_model' must be a model name (no spaces, at most {DRAFT_NAME_MAX} "
            f"characters), got {raw[:80]!r}"
        )
    return raw


def _check_deprecated(key: str, raw: Any) -> None:
    expected, _ = DEPRECATED[key]
    if expected is bool:
        ok = isinstance(raw, bool)
    elif expected is int:
        ok = not isinstance(raw, bool) and isinstance(raw, (int, float)) and float(raw).is_integer()
    else:
        ok = not isinstance(raw, bool) and isinstance(raw, (int, float)) and math.isfinite(raw)
    if not ok:
        raise InvalidRequest(f"option {key!r} must be of type {expected.__name__}, got {raw!r}")


def config_layer(config: Any) -> dict[str, Any]:
    """The server-wide defaults layer taken from `localrt.config.Config` (LOCALRT_CONTEXT_LENGTH; 0: chosen per model,
    see localrt.runtime.loading.auto_num_ctx)."""
    return {"num_ctx": config.context_length} if config.context_length else {}


# ---------------------------------------------------------------------------------------------------
# keep_alive durations

_MAX_SECONDS = ((1 << 63) - 1) / 1e9
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# One Go duration component: digits with an optional fraction (".5" and "5." are valid), then a unit.
_COMPONENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration(value: Any, *, bare_seconds: bool = False) -> float | None:
    """keep_alive as Ollama reads it. Returns seconds, 0.0 = unload now, None = keep forever.

    JSON numbers are seconds (fractions allowed); strings are Go durations ("5m", "1h30m", "300ms", "0").
    Anything negative means forever. A bare numeric string ("300") is an error in a request, as in Ollama,
    and seconds when `bare_seconds` is set (the LOCALRT_KEEP_ALIVE environment variable allows it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidRequest(f"keep_alive must be a number of seconds or a duration string, got {value!r}")
    if isinstance(value, str):
        return _parse_go_duration(value, bare_seconds)
    seconds = float(value)
    if math.isnan(seconds):
        raise InvalidRequest("keep_alive must not be NaN")
    return _forever_if_unbounded(seconds)


def _forever_if_unbounded(seconds: float) -> float | None:
    # Negative means forever; so does anything past Go's largest Duration (~292 years), which Ollama
    # could not represent either.
    return None if seconds < 0 or seconds > _MAX_SECONDS else seconds


def _parse_go_duration(text: str, bare_seconds: bool) -> float | None:
    if bare_seconds and re.fullmatch(r"[+-]?\d+", text.strip()):
        return _forever_if_unbounded(float(int(text.strip())))
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not body:
        raise InvalidRequest(f"invalid keep_alive duration {text!r}")
    total, pos = 0.0, 0
    for match in _COMPONENT.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        if re.fullmatch(r"[\d.]+", body[pos:]):
            raise InvalidRequest(f"invalid keep_alive duration {text!r}: missing unit (e.g. '5m', '300s')")
        raise InvalidRequest(f"invalid keep_alive duration {text!r}: use units ns, us, ms, s, m, h")
    return _forever_if_unbounded(-total if text.startswith("-") and total else total)
