"""Native reply dicts -> OpenAI's `/v1` replies: chat.completion(.chunk) and text_completion objects.

A request with `n` > 1 runs n native requests (openai_choices); their items carry `_choice` (0..n-1), and every
choice gets its own index, deltas, finish chunk and logprobs. Usage counts the prompt once and sums the choices'
completion tokens. Logprobs come from the native items' `logprobs` entries (Ollama's shape, api/types): chat puts
them in `choices[i].logprobs.content`, legacy completions in `choices[i].logprobs.{tokens, token_logprobs,
top_logprobs, text_offset}`.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from ..api.types import PROMPT_CACHED_KEY
from .openai_compat import Opts, sse

CHOICE_KEY = "_choice"  # which choice a native item belongs to (absent: 0)


def usage_of(dones: dict[int, dict], n: int = 0) -> dict:
    """OpenAI's usage: each prompt once (the count of its first choice, i % n == 0, with n choices per prompt; n 0:
    one prompt) and how much of it came from the prompt cache; the completion tokens of every choice."""
    firsts = [d for i, d in dones.items() if i % n == 0] if n else [dones.get(0) or next(iter(dones.values()), {})]
    p = sum(int(d.get("prompt_eval_count", 0)) for d in firsts)
    c = sum(int(d.get("eval_count", 0)) for d in dones.values())
    cached = sum(int(d.get(PROMPT_CACHED_KEY, 0)) for d in firsts)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _finish_reason(done: dict, had_tools: bool) -> str:
    if had_tools:
        return "tool_calls"
    return "length" if done.get("done_reason") == "length" else "stop"


def _tool_calls(calls: list[dict], start: int) -> list[dict]:
    out = []
    for k, c in enumerate(calls):
        fn = c.get("function", {})
        out.append(
            {
                "id": c.get("id") or "call_" + secrets.token_hex(4),
                "index": start + k,
                "type": "function",
                "function": {"name": fn.get("name"), "arguments": json.dumps(fn.get("arguments", {}))},
            }
        )
    return out


def _tail(base: dict, opts: Opts, dones: dict[int, dict]) -> bytes:
    """The end of an SSE stream: the usage chunk when asked for (`choices: []`), then [DONE]."""
    extra = sse({**base, "choices": [], "usage": usage_of(dones, opts.n)}) if opts.include_usage else b""
    return extra + b"data: [DONE]\n\n"


def _by_choice(items: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for item in items:
        out.setdefault(int(item.get(CHOICE_KEY, 0)), []).append(item)
    return dict(sorted(out.items()))


def _chat_entry(e: dict) -> dict:
    """A native logprob entry -> OpenAI's chat shape (`bytes` null when the token has none; top_logprobs a list)."""

    def one(t: dict) -> dict:
        return {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes") or None}

    return {**one(e), "top_logprobs": [one(t) for t in e.get("top_logprobs") or ()]}


def _chat_logprobs(entries: list[dict]) -> dict:
    return {"content": [_chat_entry(e) for e in entries], "refusal": None}


class ChatStream:
    """Native /api/chat items -> chat.completion(.chunk) objects.

    Streamed as OpenAI does: `role` only in a choice's first delta, content and tool calls in deltas of their own,
    and a last chunk per choice with an empty delta that carries finish_reason."""

    def __init__(self, model: str, opts: Opts):
        self.model, self.opts = model, opts
        self.id = "chatcmpl-" + secrets.token_hex(6)
        self.created = int(time.time())  # one value for the whole stream
        self.n_tools: dict[int, int] = {}
        self.sent_role: set[int] = set()
        self.dones: dict[int, dict] = {}

    def _base(self, obj: str) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_localrt",
        }

    def _chunk(self, i: int, delta: dict, finish: str | None, entries: list[dict] | None = None) -> bytes:
        out = self._base("chat.completion.chunk")
        choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
        if self.opts.logprobs:
            choice["logprobs"] = _chat_logprobs(entries) if entries else None
        out["choices"] = [choice]
        return sse(out)

    def chunk(self, item: dict) -> bytes:
        i = int(item.get(CHOICE_KEY, 0))
        msg = item.get("message") or {}
        entries = item.get("logprobs") or []
        delta: dict[str, Any] = {}
        if i not in self.sent_role:
            delta["role"] = "assistant"
            self.sent_role.add(i)
        if msg.get("thinking"):  # llama-server's and vLLM's field, and Ollama's
            delta["reasoning_content"] = delta["reasoning"] = msg["thinking"]
        if msg.get("content") or not (item.get("done") or msg.get("thinking")):
            delta["content"] = msg.get("content", "")
        if msg.get("tool_calls"):
            delta["tool_calls"] = _tool_calls(msg["tool_calls"], self.n_tools.get(i, 0))
            self.n_tools[i] = self.n_tools.get(i, 0) + len(msg["tool_calls"])
        if not item.get("done"):
            return self._chunk(i, delta, None, entries)
        self.dones[i] = item
        head = self._chunk(i, {"content": "", **delta}, None, entries) if delta or entries else b""
        return head + self._chunk(i, {}, _finish_reason(item, self.n_tools.get(i, 0) > 0))

    def tail(self) -> bytes:
        return _tail(self._base("chat.completion.chunk"), self.opts, self.dones)

    def whole(self, items: list[dict]) -> dict:
        choices, dones = [], {}
        for i, mine in (_by_choice(items) or {0: []}).items():
            done = dones[i] = mine[-1] if mine else {}
            content = "".join((m.get("message") or {}).get("content", "") for m in mine)
            calls = [c for m in mine for c in (m.get("message") or {}).get("tool_calls", [])]
            message: dict[str, Any] = {"role": "assistant", "content": content}
            thinking = "".join((m.get("message") or {}).get("thinking", "") for m in mine)
            if thinking:
                message["reasoning_content"] = message["reasoning"] = thinking
            if calls:
                message["tool_calls"] = _tool_calls(calls, 0)
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": _finish_reason(done, bool(calls)),
            }
            if self.opts.logprobs:
                choice["logprobs"] = _chat_logprobs([e for m in mine for e in m.get("logprobs") or ()])
            choices.append(choice)
        out = self._base("chat.completion")
        out["choices"] = choices
        out["usage"] = usage_of(dones)
        return out


class CompletionStream:
    """Native /api/generate items -> text_completion objects."""

    def __init__(self, model: str, opts: Opts):
        self.model, self.opts = model, opts
        self.id = "cmpl-" + secrets.token_hex(6)
        self.dones: dict[int, dict] = {}
        self.offsets: dict[int, int] = {}  # choice -> characters of its text so far (text_offset)
        self.echoed: set[int] = set()  # choices whose text has started (with the prompt, under echo)

    def _base(self) -> dict:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": "fp_localrt",
        }

    def _logprobs(self, i: int, entries: list[dict]) -> dict:
        """Legacy completions' logprobs: parallel lists; top_logprobs one {token: logprob} per position."""
        tokens, lps, tops, offsets = [], [], [], []
        at = self.offsets.get(i, 0)
        for e in entries:
            tokens.append(e.get("token", ""))
            lps.append(e.get("logprob", 0.0))
            tops.append({t.get("token", ""): t.get("logprob", 0.0) for t in e.get("top_logprobs") or ()})
            offsets.append(at)
            at += len(e.get("token", ""))
        self.offsets[i] = at
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _choice(self, i: int, text: str, finish: str | None, entries: list[dict]) -> dict:
        choice: dict[str, Any] = {"text": text, "index": i, "finish_reason": finish}
        choice["logprobs"] = self._logprobs(i, entries) if self.opts.logprobs else None
        return choice

    def _echo(self, i: int, text: str) -> str:
        """A choice's first text starts with the prompt when the request asked for echo."""
        if self.opts.echo is None or i in self.echoed:
            return text
        self.echoed.add(i)
        return self.opts.echo[i // self.opts.n] + text

    def chunk(self, item: dict) -> bytes:
        i = int(item.get(CHOICE_KEY, 0))
        finish = None
        if item.get("done"):
            self.dones[i] = item
            finish = _finish_reason(item, False)
        out = self._base()
        out["choices"] = [self._choice(i, self._echo(i, item.get("response", "")), finish, item.get("logprobs") or [])]
        return sse(out)

    def tail(self) -> bytes:
        return _tail(self._base(), self.opts, self.dones)

    def whole(self, items: list[dict]) -> dict:
        choices, dones = [], {}
        for i, mine in (_by_choice(items) or {0: []}).items():
            done = dones[i] = mine[-1] if mine else {}
            entries = [e for m in mine for e in m.get("logprobs") or ()]
            choices.append(
                self._choice(
                    i, self._echo(i, "".join(m.get("response", "") for m in mine)), _finish_reason(done, False), entries
                )
            )
        out = self._base()
        out["choices"] = choices
        out["usage"] = usage_of(dones, self.opts.n)
        return out
