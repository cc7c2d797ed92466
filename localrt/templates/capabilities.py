"""What a Go chat template tells about its model, read from the parsed tree as Ollama reads it:
tools and insert support, and the text that opens a tool call in the model's output."""
from __future__ import annotations

from ._goast import Action, Branch, Field, Node, Text
from .gotemplate import GoTemplate


def capabilities(t: GoTemplate) -> frozenset[str]:
    """`tools` when the template uses `.Tools`, `insert` when it uses `.Suffix` (plus `completion`)."""
    caps = {"completion"}
    if t.uses("tools"):
        caps.add("tools")
    if t.uses("suffix"):
        caps.add("insert")
    return frozenset(caps)


def tool_call_tag(t: GoTemplate) -> str:
    """The literal that starts a tool call: the first non-blank text inside the first `{{ if .ToolCalls }}`
    block, cut before any `{` and stripped (`<tool_call>`, `[TOOL_CALLS]`, ...). "{" when there is none,
    meaning output that starts as a JSON object should be tried as a tool call."""
    block = _tool_calls_if(t.nodes)
    text = _first_text(block.body) if block is not None else None
    if text is None:
        return "{"
    tag = text.replace("\r\n", "\n").split("{", 1)[0].strip()
    return tag or "{"


def _tool_calls_if(nodes: list[Node]) -> Branch | None:
    for n in nodes:
        if not isinstance(n, Branch):
            continue
        if n.kind == "if" and any(isinstance(a, Field) and "ToolCalls" in a.path
                                  for cmd in n.pipe.cmds for a in cmd.args):
            return n
        found = _tool_calls_if(n.body) or _tool_calls_if(n.else_body or [])
        if found is not None:
            return found
    return None


def _first_text(nodes: list[Node]) -> str | None:
    """Depth-first first non-blank text, stopping at the first action (a value printed before any tag)."""
    for n in nodes:
        if isinstance(n, Text):
            if n.text.strip():
                return n.text
        elif isinstance(n, Branch):
            return _first_text(n.body) or _first_text(n.else_body or [])
        elif isinstance(n, Action):
            return None
    return None
