"""Go text/template, the subset Ollama's chat templates use: parse once, execute many times.

`GoTemplate(source)` parses, raising TemplateError with line:col. With `add_response` it also does what
Ollama's `template.Parse` does: a template that mentions neither `.Messages` nor `.Response` gets
`{{ .Response }}` appended."""

from __future__ import annotations

from typing import Any

from ._goast import Action, Arg, Branch, Command, Field, Node, Pipe, Variable
from ._goexec import Executor, Limits
from ._gofuncs import NAMES
from ._goparse import parse_tree
from .errors import TemplateError

MAX_SOURCE = 1 << 20  # characters; real chat templates are a few KiB


class GoTemplate:
    def __init__(self, source: str, *, add_response: bool = False, max_source: int = MAX_SOURCE):
        if not isinstance(source, str):
            raise TemplateError(f"template must be a string, not {type(source).__name__}")
        if len(source) > max_source:
            raise TemplateError(f"template is {len(source)} characters, more than the limit of {max_source}")
        self.source = source
        try:
            self.nodes: list[Node] = parse_tree(source, NAMES)
        except RecursionError:
            raise TemplateError("template nesting too deep") from None
        self.vars: frozenset[str] = frozenset(n.lower() for n in _identifiers(self.nodes))
        if add_response and "messages" not in self.vars and "response" not in self.vars:
            end = len(source)
            self.nodes.append(Action(Pipe([], False, [Command([Field(("Response",), end)], end)], end), end))
            self.vars |= {"response"}
        self._cut: list[Node] | None = None

    def uses(self, name: str) -> bool:
        """Whether the template mentions a field or variable (case-insensitive, as Ollama's Vars)."""
        return name.lower() in self.vars

    def execute(self, data: Any, limits: Limits = Limits()) -> str:
        return Executor(self.source, limits).run(self.nodes, data)

    def execute_cut(self, data: Any, limits: Limits = Limits()) -> str:
        """Execute with everything after the first `.Response` removed (Ollama's last legacy turn, so that
        the prompt ends where the model's answer starts)."""
        if self._cut is None:
            self._cut = _cut_after_response(self.nodes)
        return Executor(self.source, limits).run(self._cut, data)


def _identifiers(nodes: list[Node]) -> list[str]:
    """Field and variable names the template mentions, walked the way Ollama's `Identifiers` walks."""
    names: list[str] = []

    def pipe(p: Pipe) -> None:
        for cmd in p.cmds:
            for a in cmd.args:
                arg(a)

    def arg(a: Arg) -> None:
        if isinstance(a, Field):
            names.extend(a.path)
        elif isinstance(a, Variable):
            names.append(a.name)
            names.extend(a.path)
        elif isinstance(a, Pipe):
            pipe(a)

    def walk(ns: list[Node]) -> None:
        for n in ns:
            if isinstance(n, Action):
                pipe(n.pipe)
            elif isinstance(n, Branch):
                pipe(n.pipe)
                walk(n.body)
                walk(n.else_body or [])

    walk(nodes)
    return names


def _cut_after_response(nodes: list[Node]) -> list[Node]:
    """A copy of the tree in which every node after the first `.Response` field (in document order) is
    dropped; a command left with no arguments drops its whole pipeline, as Ollama's deleteNode does."""
    state = {"cut": False}

    def walk_list(ns: list[Node] | None) -> list[Node] | None:
        if ns is None:
            return None
        out = []
        for n in ns:
            kept = walk(n)
            if kept is not None:
                out.append(kept)
        return out

    def walk(n: Node) -> Node | None:
        if state["cut"]:
            return None
        if isinstance(n, Action):
            p = walk_pipe(n.pipe)
            return None if p is None else Action(p, n.pos)
        if isinstance(n, Branch):
            body = walk_list(n.body) or []
            else_body = walk_list(n.else_body) if not state["cut"] else ([] if n.else_body is not None else None)
            return Branch(n.kind, n.pipe, body, else_body, n.pos)
        return n

    def walk_pipe(p: Pipe) -> Pipe | None:
        cmds = []
        for cmd in p.cmds:
            args = []
            for a in cmd.args:
                if state["cut"]:
                    continue
                if isinstance(a, Field) and "Response" in a.path:
                    state["cut"] = True
                args.append(a)
            if not args:
                return None
            cmds.append(Command(args, cmd.pos))
        return Pipe(p.decl, p.assign, cmds, p.pos)

    return walk_list(nodes) or []


__all__ = ["GoTemplate", "Limits", "TemplateError"]
