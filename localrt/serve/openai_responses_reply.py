"""Native /api/chat items -> OpenAI's Responses replies: the typed SSE events of a streamed response, or one
`response` object (the fold of the same events, so both always agree).

Output items: text goes into a `message` item (one `output_text` part), opened when the first non-blank text
arrives; each tool call is a `function_call` item (`call_id`, `name`, `arguments` as a JSON string), and closes
the message before it. A reply that ends at max_output_tokens (or the context) has status "incomplete" with
`incomplete_details.reason` "max_output_tokens", and a stream then ends with `response.incomplete` (OpenAI's
rule) instead of `response.completed`. Every event carries `type` and a `sequence_number` from 0; SSE frames name
the event (`event: ...`) and there is no `[DONE]`. A failure after the first byte is `response.failed`.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from ..api.types import PROMPT_CACHED_KEY
from .openai_responses import ResponsesOpts


def _logprobs(entries: list[dict]) -> list[dict]:
    """Native logprob entries -> the Responses' shape (bytes as a list of ints, never null)."""

    def one(t: dict) -> dict:
        return {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": list(t.get("bytes") or [])}

    return [{**one(e), "top_logprobs": [one(t) for t in e.get("top_logprobs") or ()]} for e in entries]


def _text_part(text: str, lps: list[dict]) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}


class ResponsesStream:
    """One response: feed it the native items in order (`chunk`, SSE bytes out); `whole` folds them instead."""

    def __init__(self, model: str, opts: ResponsesOpts):
        self.model, self.opts = model, opts
        self.id = "resp_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.seq = 0
        self.started = False
        self.output: list[dict] = []  # finished output items, in output_index order
        self.msg: dict | None = None  # the open message item
        self.reasoning: dict | None = None  # the open reasoning item (a thinking model's reasoning, before the answer)
        self.reasoning_text = ""
        self.text = ""  # the open message's text so far
        self.lps: list[dict] = []  # its logprobs so far
        self.blank = ""  # whitespace that waits for text (dropped if a call or the end comes first)
        self.blank_lps: list[dict] = []
        self.done: dict = {}
        self.status = "in_progress"

    # ---- events ------------------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return (
            b"event: "
            + kind.encode()
            + b"\ndata: "
            + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
            + b"\n\n"
        )

    def _open_message(self) -> bytes:
        self.msg = {
            "id": "msg_" + secrets.token_hex(12),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.text, self.lps = "", []
        at = len(self.output)
        return self._event("response.output_item.added", output_index=at, item=self.msg) + self._event(
            "response.content_part.added",
            item_id=self.msg["id"],
            output_index=at,
            content_index=0,
            part=_text_part("", []),
        )

    def _text(self, text: str, lps: list[dict], force: bool = False) -> bytes:
        """A text delta; blank text waits for what follows it (text: sent with it; a call: dropped)."""
        if not text.strip() and not force:
            self.blank += text
            self.blank_lps += lps
            return b""
        out = self._open_message() if self.msg is None else b""
        text, lps = self.blank + text, self.blank_lps + lps
        self.blank, self.blank_lps = "", []
        self.text += text
        self.lps += lps
        return out + self._event(
            "response.output_text.delta",
            item_id=self.msg["id"],
            output_index=len(self.output),
            content_index=0,
            delta=text,
            logprobs=lps,
        )

    def _close_message(self, status: str) -> bytes:
        msg, at = self.msg, len(self.output)
        if msg is None:
            return b""
        part = _text_part(self.text, self.lps)
        item = {**msg, "status": status, "content": [part]}
        self.msg = None
        self.output.append(item)
        return (
            self._event(
                "response.output_text.done",
                item_id=msg["id"],
                output_index=at,
                content_index=0,
                text=self.text,
                logprobs=self.lps,
            )
            + self._event("response.content_part.done", item_id=msg["id"], output_index=at, content_index=0, part=part)
            + self._event("response.output_item.done", output_index=at, item=item)
        )

    def _reason(self, text: str) -> bytes:
        """A reasoning delta, in a reasoning item of its own (opened on the first one)."""
        out = b""
        if self.reasoning is None:
            self.reasoning = {
                "id": "rs_" + secrets.token_hex(12),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            self.reasoning_text = ""
            out = self._event("response.output_item.added", output_index=len(self.output), item=self.reasoning)
        self.reasoning_text += text
        return out + self._event(
            "response.reasoning_text.delta",
            item_id=self.reasoning["id"],
            output_index=len(self.output),
            content_index=0,
            delta=text,
        )

    def _close_reasoning(self) -> bytes:
        item, at = self.reasoning, len(self.output)
        if item is None:
            return b""
        self.reasoning = None
        done = {**item, "status": "completed", "content": [{"type": "reasoning_text", "text": self.reasoning_text}]}
        self.output.append(done)
        return self._event(
            "response.reasoning_text.done",
            item_id=item["id"],
            output_index=at,
            content_index=0,
            text=self.reasoning_text,
        ) + self._event("response.output_item.done", output_index=at, item=done)

    def _call(self, call: dict) -> bytes:
        limit = self.opts.max_tool_calls
        if limit is not None and sum(o["type"] == "function_call" for o in self.output) >= limit:
            return b""  # as OpenAI: calls past max_tool_calls are ignored
        out = self._close_message("completed")
        self.blank, self.blank_lps = "", []  # blanks between text and a call belong to neither
        fn = call.get("function") or {}
        args = json.dumps(fn.get("arguments", {}), ensure_ascii=False)
        item = {
            "id": "fc_" + secrets.token_hex(12),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.get("id") or "call_" + secrets.token_hex(4),
            "name": fn.get("name", ""),
            "arguments": "",
        }
        at = len(self.output)
        done = {**item, "status": "completed", "arguments": args}
        self.output.append(done)
        return (
            out
            + self._event("response.output_item.added", output_index=at, item=item)
            + self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=args)
            + self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=at,
                name=item["name"],
                arguments=args,
            )
            + self._event("response.output_item.done", output_index=at, item=done)
        )

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        snap = self.response()
        return self._event("response.created", response=snap) + self._event("response.in_progress", response=snap)

    def chunk(self, item: dict) -> bytes:
        out = self._start()
        msg = item.get("message") or {}
        lps = _logprobs(item.get("logprobs") or [])
        if msg.get("thinking"):
            out += self._reason(msg["thinking"])
        if msg.get("content") or msg.get("tool_calls") or item.get("done"):
            out += self._close_reasoning()  # the answer begins: the reasoning item is complete
        if msg.get("content") or (lps and not msg.get("thinking")):
            out += self._text(msg.get("content", ""), lps)
        for call in msg.get("tool_calls") or ():
            out += self._call(call)
        if not item.get("done"):
            return out
        self.done = item
        cut = item.get("done_reason") == "length"
        if self.msg is None and not any(o["type"] == "function_call" for o in self.output):
            out += self._open_message()  # a text reply always has its message item, even an empty or blank one
        if self.msg is not None and (self.blank or self.blank_lps):
            out += self._text("", [], force=True)  # a text reply's trailing blanks, as the model wrote them
        out += self._close_message("incomplete" if cut else "completed")
        self.status = "incomplete" if cut else "completed"
        return out + self._event("response.incomplete" if cut else "response.completed", response=self.response())

    def tail(self) -> bytes:
        return b""

    def error(self, message: str) -> bytes:
        """After the first byte: the response failed (its items so far, and the error)."""
        self.status = "failed"
        out = self._start()
        return out + self._event(
            "response.failed", response=self.response(error={"code": "server_error", "message": message})
        )

    def whole(self, items: list[dict]) -> dict:
        for item in items:
            self.chunk(item)
        if not self.done:
            self.chunk({"done": True, "done_reason": "stop"})
        return self.response()

    # ---- the response object -------------------------------------------------------------------------

    def _usage(self) -> dict | None:
        if not self.done:
            return None
        p, c = int(self.done.get("prompt_eval_count", 0)), int(self.done.get("eval_count", 0))
        return {
            "input_tokens": p,
            "input_tokens_details": {
                "cached_tokens": int(self.done.get(PROMPT_CACHED_KEY, 0)),
                "cache_write_tokens": 0,
            },
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }

    def response(self, error: dict | None = None) -> dict:
        o = self.opts
        finished = self.status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if finished else None,
            "status": self.status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": o.instructions,
            "max_output_tokens": o.max_output_tokens,
            "max_tool_calls": o.max_tool_calls,
            "model": self.model,
            "output": [dict(x) for x in self.output] if finished or error else [],
            "parallel_tool_calls": o.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "background": False,
            "service_tier": "default",
            "temperature": o.temperature,
            "text": {"format": o.text_format},
            "tool_choice": o.tool_choice,
            "tools": o.tools,
            "top_logprobs": o.top_logprobs,
            "top_p": o.top_p,
            "truncation": o.truncation,
            "usage": self._usage(),
            "metadata": o.metadata,
            "safety_identifier": None,
            "prompt_cache_key": None,
        }
