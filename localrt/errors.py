"""Typed errors of the core. The server maps them to HTTP status and body in exactly one function."""

from __future__ import annotations


class LocalrtError(Exception):
    """Base of every error the runtime raises on purpose."""


class InvalidRequest(LocalrtError):
    """A request or option that fails validation (bad type, out of range, unknown field)."""


class ModelNotFound(LocalrtError):
    def __init__(self, name: str):
        super().__init__(f"model '{name}' not found")
        self.name = name


class InvalidModelName(LocalrtError):
    def __init__(self, name: str, why: str = ""):
        super().__init__(f"invalid model name {name!r}" + (f": {why}" if why else ""))
        self.name = name


class ModelLoadError(LocalrtError):
    """The file is a valid GGUF but cannot be run (unsupported architecture, missing tensor, ...)."""


class InvalidModel(ModelLoadError, InvalidRequest):
    """The model file's metadata or tensors are wrong or out of range: the input's fault, so a 400 at the HTTP edge.

    The message names the GGUF key or tensor and both numbers (see localrt.engine.validate)."""


class UnsupportedArchitecture(InvalidModel):
    def __init__(self, arch: str):
        super().__init__(f"unsupported model architecture {arch!r}")
        self.arch = arch


class MissingTensor(InvalidModel):
    def __init__(self, name: str):
        super().__init__(f"model file has no tensor {name!r}")
        self.tensor = name


class NonFiniteOutput(LocalrtError):
    """The forward produced NaN or infinite logits (or an embedding): the model's weights hold non-finite values,
    or values whose products overflow float32. Nothing the request can change: a 500 at the HTTP edge, naming the
    model (runtime.jobs sets `model`, the name the request used) and the cause, never a bare internal error."""

    def __init__(self, what: str, model: str = ""):
        super().__init__(what)
        self.what = what
        self.model = model

    def __str__(self) -> str:
        who = f"model {self.model!r}" if self.model else "the model"
        return (
            f"{who} produced {self.what}: its weights are corrupt (NaN or infinite values, or values that "
            f"overflow float32); create it again from a good GGUF file"
        )


class ContextLengthExceeded(LocalrtError):
    def __init__(self, n_prompt: int, n_ctx: int, *, counted_all: bool = True):
        # counted_all False: tokenizing stopped once past the context, so n_prompt is only where it stopped
        if counted_all:
            super().__init__(f"the prompt has {n_prompt} tokens, more than the context length of {n_ctx} tokens")
        else:
            super().__init__(f"the prompt has more than {n_ctx} tokens, the context length")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        self.counted_all = counted_all

    def openai_message(self) -> str:
        """Words the clients match on besides the code (the openai SDK puts only the message in the exception's
        text): litellm's context-window fallback looks for the first clause, langchain-openai's for the second."""
        count = f"{self.n_prompt}" if self.counted_all else f"more than {self.n_ctx}"
        return f"This model's maximum context length is {self.n_ctx} tokens; the prompt is too long: {count} tokens."


class Busy(LocalrtError):
    """The request queue is full."""


class Cancelled(LocalrtError):
    """The client went away; work stopped."""


class DraftModelMismatch(InvalidRequest):
    """draft_model names a model whose tokenizer is not the target's (vocabulary, ids, BOS/EOS/EOG): a 400."""


class KVCacheFull(LocalrtError):
    """The paged KV pool has no free or evictable block (every block is in a running sequence's table)."""

    def __init__(self, n_blocks: int, size: int):
        super().__init__(f"the KV cache's {n_blocks} blocks of {size} positions are all in use by running sequences")
        self.n_blocks = n_blocks
        self.size = size
