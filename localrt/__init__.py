"""localrt: a local LLM runtime. `load_model(path, num_ctx=...)` is the public entry point of the engine."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that `import localrt` (CLI start, client) does not pull in numba.
    if name == "load_model":
        from .engine.loader import load_model

        return load_model
    raise AttributeError(name)
