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
        if n.kind == "if" and any(
            isinstance(a, Field) and "ToolCalls" in a.path for cmd in n.pipe.cmds for a in cmd.args
        ):
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


def thinking_tags(t: GoTemplate) -> tuple[str, str] | None:
    """The tags around a message's reasoning, inferred as Ollama infers them: the block that prints `.Thinking`
    inside `{{ range .Messages }}`; its first and last literal texts, stripped, are the opening and closing tags.
    None when there is no such block (the model does not think)."""
    found = _thinking_block(t.nodes, in_messages=False)
    if found is None:
        return None
    texts = [n.text.strip() for n in found if isinstance(n, Text) and n.text.strip()]
    return (texts[0], texts[-1]) if len(texts) >= 2 else None


def _thinking_block(nodes: list[Node], in_messages: bool) -> list[Node] | None:
    for n in nodes:
        if isinstance(n, Action) and in_messages and _prints_thinking(n):
            return nodes
        if isinstance(n, Branch):
            inside = in_messages or (n.kind == "range" and _mentions(n, "Messages"))
            found = _thinking_block(n.body, inside) or _thinking_block(n.else_body or [], inside)
            if found is not None:
                return found
    return None


def _prints_thinking(action: Action) -> bool:
    return any(isinstance(a, Field) and a.path[:1] == ("Thinking",) for cmd in action.pipe.cmds for a in cmd.args)


def _mentions(branch: Branch, name: str) -> bool:
    return any(getattr(a, "path", ())[:1] == (name,) for cmd in branch.pipe.cmds for a in cmd.args)
