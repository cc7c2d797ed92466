"""What a request asks of the engine beside its options (logprobs, logit_bias, whose cached prefixes it may reuse, its
prompt's ids up to the context), the final reply's counts, and the engine's log-probability entries as Ollama's
`logprobs` field of a native reply chunk.

Ollama's shape (`api/types.go`, `Logprob`): `[{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}]`, one entry per generated token, carried by the chunk whose text the token is part of; `bytes` and
`top_logprobs` are left out when empty (`omitempty`), and so is the whole key on a chunk without entries.
"""

from __future__ import annotations

import logging
from typing import Iterable

from .. import structured
from ..api.types import PROMPT_CACHED_KEY
from ..engine.events import Done, Logprob, TokenLogprob
from ..errors import ContextLengthExceeded, InvalidRequest
from ..templates.harmony import HARMONY
from ..templates.toolcalls import forced_call_format, opened_call_format
from .prompt_fit import cut_prompt

log = logging.getLogger("localrt.service")


def cache_scope(req, config, client: str) -> str:
    """Whose cached prompt prefixes the request may reuse (Batcher.add): its client's (the caller's address as the
    fair queue groups it; every holder of the API key where one is set) unless LOCALRT_PREFIX_CACHE is "shared",
    and of those only the ones sent with the same cache_salt."""
    who = "" if config.prefix_cache == "shared" or config.api_key else client
    return f"{who}\0{req.cache_salt}" if req.cache_salt else who


COUNT_UPTO = 4  # a prompt too long for the context is counted whole up to this many contexts, for the error


def count_tokens(model, text: str, n_ctx: int) -> int:
    """The text's tokens, counted up to COUNT_UPTO contexts; past that a ContextLengthExceeded."""
    n = len(model.tokenize(text, limit=COUNT_UPTO * n_ctx))
    if n > COUNT_UPTO * n_ctx:
        raise ContextLengthExceeded(n, n_ctx, counted_all=False)
    return n


def embedding_only(metadata, arch: str) -> bool:
    """A file that names its pooling type, or an encoder's, is an embedding model (Ollama: the `embedding`
    capability, no `completion`)."""
    from ..engine.arch import ARCHITECTURES

    return f"{arch}.pooling_type" in metadata or getattr(ARCHITECTURES.get(arch), "ENCODER", False)


def refuse_embedding_only(model, name: str, what: str) -> None:
    meta = getattr(model, "metadata", None) or {}
    arch = str(meta.get("general.architecture", ""))
    if arch and embedding_only(meta, arch):
        raise InvalidRequest(f"{name} does not support {what}: it is an embedding model (use /api/embed)")


def request_ids(model, req, text: str, n_ctx: int, num_keep: int | None) -> list[int]:
    """A /api/generate or /v1/completions prompt's ids: its token ids as given, else its text's (prompt_ids: cut as
    Ollama cuts where num_keep is given, refused past the context where it is None)."""
    return prompt_ids(model, text, n_ctx, num_keep) if req.prompt_tokens is None else given_ids(model, req, n_ctx)


def given_ids(model, req, n_ctx: int) -> list[int]:
    """A prompt given as token ids (/v1/completions), checked against the vocabulary and the context."""
    ids = list(req.prompt_tokens)
    n_vocab = model.config.n_vocab
    if any(not 0 <= t < n_vocab for t in ids):
        raise InvalidRequest(f"prompt: token id out of range 0..{n_vocab - 1}")
    if len(ids) > n_ctx:
        raise ContextLengthExceeded(len(ids), n_ctx)
    return ids


def prompt_ids(model, text: str, n_ctx: int, num_keep: int | None = None) -> list[int]:
    """The prompt's token ids. One longer than n_ctx is cut to its first num_keep ids and its newest ones where
    `num_keep` is given (prompt_fit.cut_prompt), else refused with its count, or, past COUNT_UPTO contexts, once
    tokenizing passes that (a text of megabytes is not tokenized whole only to be refused)."""
    ids = model.tokenize(text, limit=(n_ctx if num_keep is not None else COUNT_UPTO * n_ctx))
    if len(ids) > n_ctx and num_keep is not None:
        return cut_prompt(model, text, n_ctx, num_keep, ids)
    if len(ids) > n_ctx:
        raise ContextLengthExceeded(len(ids), n_ctx, counted_all=len(ids) <= COUNT_UPTO * n_ctx)
    return ids


def metrics(ev: Done, load_ns: int) -> dict:
    """The final reply's counts and durations."""
    return {
        "done": True,
        "done_reason": ev.done_reason,
        "total_duration": ev.total_duration + load_ns,
        "load_duration": ev.load_duration + load_ns,
        "prompt_eval_count": ev.prompt_eval_count,
        "prompt_eval_duration": ev.prompt_eval_duration,
        "eval_count": ev.eval_count,
        "eval_duration": ev.eval_duration,
        PROMPT_CACHED_KEY: getattr(ev, "prompt_cached_count", 0),
        **_draft_counts(ev),
    }


def _draft_counts(ev: Done) -> dict:
    """Speculative decoding's counts as extra fields of the final reply (not Ollama's), when it was on."""
    if getattr(ev, "draft_count", None) is None:
        return {}
    return {"draft_count": ev.draft_count, "draft_accepted_count": ev.draft_accepted_count}


def request_constraint(tag: str, req, model, reasoning=None):
    """The constraint of a chat request: a forced call (tool_choice "required" or a named tool), else its `format`,
    else with tools (tool_choice "auto") the call schema from the moment the model opens a call by itself (a lazy
    constraint); None when nothing constrains it. A harmony model (`reasoning` is HARMONY) writes its calls in their
    own messages: only its `format` constrains it, and a forced call is refused."""
    if reasoning is HARMONY:
        if req.tool_choice is not None:
            raise InvalidRequest(
                'tool_choice that forces a tool call is not supported for harmony (gpt-oss) models; use "auto"'
            )
        return structured.compile_format(req.format, model.tokenizer) if req.format else None
    if req.tool_choice is not None:
        chosen = [t for t in req.tools if not req.tool_choice or t["function"].get("name") == req.tool_choice]
        return structured.compile_format(forced_call_format(tag, chosen), model.tokenizer)
    if req.format:
        return structured.compile_format(req.format, model.tokenizer)
    tokenizer = getattr(model, "tokenizer", None)
    if not req.tools or tokenizer is None:  # without a tokenizer of its own (a scripted test model) nothing is masked
        return None
    trigger, fmt, at_start = opened_call_format(tag, req.tools)
    try:
        grammar = structured.compile_format(fmt, tokenizer).grammar
    except structured.SchemaError as exc:  # a tool schema outside the supported subset: calls stay unconstrained
        log.info("tool-call arguments are not constrained: %s", exc)
        return None
    return structured.LazyConstraint(grammar, trigger.encode(), at_start)


def sampling_kwargs(req) -> dict:
    """The engine's keyword arguments beside the options, for a Generate/ChatRequest: logprobs (how many
    alternatives per token) and a logit_bias, only when asked for."""
    out: dict = {}
    if req.logprobs:
        out["logprobs"] = req.top_logprobs
    if req.logit_bias:
        out["logit_bias"] = req.logit_bias
    return out


def _token(t: TokenLogprob) -> dict:
    out: dict = {"token": t.text, "logprob": t.logprob}
    if t.bytes:
        out["bytes"] = list(t.bytes)
    return out


def native(entries: Iterable[Logprob]) -> list[dict]:
    out = []
    for e in entries:
        d = _token(e.token)
        if e.top:
            d["top_logprobs"] = [_token(t) for t in e.top]
        out.append(d)
    return out


class Pending:
    """Entries waiting for the next chunk that goes out (a chat reply holds back text a tool call may be)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self._items: list[dict] = []

    def add(self, entries: Iterable[Logprob]) -> None:
        if self.on:
            self._items.extend(native(entries))

    def take(self) -> dict:
        """{"logprobs": [...]} for the chunk going out now, or {} when there is nothing to carry."""
        if not self._items:
            return {}
        out, self._items = self._items, []
        return {"logprobs": out}
