"""Ollama's `Template.Execute`: which data a Go template sees for fill-in-middle, for `.Messages`
templates, and for legacy `.System/.Prompt/.Response` templates (rendered once per turn)."""

from __future__ import annotations

from typing import Any

from ._goexec import Limits
from ._ollama_data import go_message, go_tools
from .gotemplate import GoTemplate


def think_values(think: bool | str | None) -> dict[str, Any]:
    """`.Think`, `.ThinkLevel`, `.IsThinkSet` from a request's `think` (None = not set); true is level "medium", as
    Ollama's ThinkValue.String() gives it."""
    level = think if isinstance(think, str) else ("medium" if think is True else "")
    return {"Think": bool(think) if think is not None else False, "ThinkLevel": level, "IsThinkSet": think is not None}


def collate(messages: list[dict]) -> tuple[str, list[dict]]:
    """All system contents joined by a blank line, and the messages with consecutive same-role messages
    (except tool results) merged into one, contents joined by a blank line."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    merged: list[dict] = []
    for m in messages:
        if merged and merged[-1]["role"] == m["role"] and m["role"] != "tool":
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n\n" + m["content"]}
        else:
            merged.append(m)
    return "\n\n".join(system), merged


def execute(
    t: GoTemplate,
    messages: list[dict],
    *,
    tools: list | None = None,
    think: bool | str | None = None,
    prompt: str = "",
    suffix: str = "",
    limits: Limits = Limits(),
) -> str:
    """Render `messages` (checked wire dicts) through `t` exactly as Ollama's Execute does."""
    tv = think_values(think)
    if prompt and suffix:
        return t.execute({"Prompt": prompt, "Suffix": suffix, "Response": "", **tv}, limits)
    system, merged = collate(messages)
    if t.uses("messages"):
        return t.execute(
            {
                "System": system,
                "Messages": [go_message(m) for m in merged],
                "Tools": go_tools(tools),
                "Response": "",
                **tv,
            },
            limits,
        )
    return _legacy(t, merged, tv, limits)


def _legacy(t: GoTemplate, messages: list[dict], tv: dict, limits: Limits) -> str:
    """One render per (system, user, assistant) turn; the last turn is cut after `.Response` so the prompt
    ends where the answer begins (an assistant message last is continued, not closed)."""
    out: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(t.execute({**turn, **tv}, limits))
        turn.update(System="", Prompt="", Response="")

    for m in messages:
        if m["role"] == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = m["content"]
        elif m["role"] == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = m["content"]
        elif m["role"] == "assistant":
            turn["Response"] = m["content"]
    out.append(t.execute_cut({**turn, **tv}, limits))
    return "".join(out)
