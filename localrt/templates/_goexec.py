"""Executor for a parsed Go template, with the limits an untrusted template needs: output size, range
iterations, total steps and wall-clock time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ._goast import (
    Action,
    Arg,
    Branch,
    Break,
    Chain,
    Command,
    Continue,
    Dot,
    Field,
    Ident,
    Literal,
    Node,
    Pipe,
    Text,
    Variable,
)
from ._gofmt import FormatError
from ._gofuncs import ARITY, FUNCTIONS, FuncError
from ._govalues import SEQUENCE_TYPES, GoStruct, format_v, sorted_keys, truth, type_name
from .errors import TemplateError, line_col

_NO_ARG = object()  # no value piped in from the previous command


@dataclass(frozen=True)
class Limits:
    max_output: int = 8 << 20  # characters of rendered text (and of any one intermediate string)
    max_iterations: int = 1_000_000  # range iterations over the whole execution
    max_steps: int = 20_000_000  # nodes and commands evaluated over the whole execution
    timeout_s: float = 10.0  # wall-clock limit of one execution


class _BreakLoop(Exception):
    pass


class _ContinueLoop(Exception):
    pass


class Executor:
    def __init__(self, src: str, limits: Limits):
        self.src = src
        self.limits = limits
        self.out: list[str] = []
        self.size = 0
        self.iterations = 0
        self.steps = 0
        self.deadline = time.monotonic() + limits.timeout_s

    def error(self, msg: str, pos: int) -> TemplateError:
        line, col = line_col(self.src, pos)
        return TemplateError(msg, line=line, col=col)

    def run(self, nodes: list[Node], data: Any) -> str:
        scope: list[tuple[str, Any]] = [("$", data)]
        try:
            self.walk(nodes, data, scope)
        except RecursionError:
            raise TemplateError("template too deeply nested to execute") from None
        return "".join(self.out)

    def tick(self, pos: int) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise self.error(f"template execution exceeds {self.limits.max_steps} steps", pos)
        if self.steps & 1023 == 0 and time.monotonic() > self.deadline:
            raise self.error(f"template execution exceeds {self.limits.timeout_s:g} s", pos)

    def write(self, text: str, pos: int) -> None:
        self.size += len(text)
        if self.size > self.limits.max_output:
            raise self.error(f"template output exceeds {self.limits.max_output} characters", pos)
        self.out.append(text)

    def walk(self, nodes: list[Node], dot: Any, scope: list) -> None:
        for node in nodes:
            self.tick(node.pos)
            if isinstance(node, Text):
                self.write(node.text, node.pos)
            elif isinstance(node, Action):
                value = self.pipeline(node.pipe, dot, scope)
                if not node.pipe.decl:
                    self.write("<no value>" if value is None else self.show(value, node.pos), node.pos)
            elif isinstance(node, Branch):
                self.branch(node, dot, scope)
            elif isinstance(node, Break):
                raise _BreakLoop()
            elif isinstance(node, Continue):
                raise _ContinueLoop()

    def show(self, value: Any, pos: int) -> str:
        try:
            return format_v(value)
        except TypeError as e:
            raise self.error(str(e), pos) from None

    def branch(self, node: Branch, dot: Any, scope: list) -> None:
        mark = len(scope)
        try:
            if node.kind == "range":
                self.range(node, dot, scope)
                return
            value = self.pipeline(node.pipe, dot, scope)
            if truth(value):
                self.walk(node.body, value if node.kind == "with" else dot, scope)
            elif node.else_body is not None:
                self.walk(node.else_body, dot, scope)
        finally:
            del scope[mark:]

    def range(self, node: Branch, dot: Any, scope: list) -> None:
        value = self.pipeline(node.pipe, dot, scope, declare=False)
        items = self.range_items(value, node.pos)
        mark = len(scope)
        ran = False
        for key, elem in items:
            ran = True
            self.iterations += 1
            if self.iterations > self.limits.max_iterations:
                raise self.error(f"template exceeds {self.limits.max_iterations} range iterations", node.pos)
            del scope[mark:]
            decl = node.pipe.decl
            if len(decl) == 1:
                self.set_var(scope, decl[0], elem, node.pipe.assign)
            elif len(decl) == 2:
                self.set_var(scope, decl[0], key, node.pipe.assign)
                self.set_var(scope, decl[1], elem, node.pipe.assign)
            try:
                self.walk(node.body, elem, scope)
            except _BreakLoop:
                break
            except _ContinueLoop:
                continue
        del scope[mark:]
        if not ran and node.else_body is not None:
            self.walk(node.else_body, dot, scope)

    def range_items(self, value: Any, pos: int):
        if value is None:
            return iter(())
        if isinstance(value, dict):
            return ((k, value[k]) for k in sorted_keys(value))
        if isinstance(value, SEQUENCE_TYPES):
            return enumerate(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if value > self.limits.max_iterations:
                raise self.error(f"template exceeds {self.limits.max_iterations} range iterations", pos)
            return ((i, i) for i in range(value))
        raise self.error(f"range can't iterate over {self.show(value, pos)}", pos)

    @staticmethod
    def set_var(scope: list, name: str, value: Any, assign: bool) -> None:
        if not assign:
            scope.append((name, value))
            return
        for i in range(len(scope) - 1, -1, -1):
            if scope[i][0] == name:
                scope[i] = (name, value)
                return

    def pipeline(self, pipe: Pipe, dot: Any, scope: list, declare: bool = True) -> Any:
        value: Any = _NO_ARG
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, scope, value)
        if declare and pipe.decl:
            self.set_var(scope, pipe.decl[0], value, pipe.assign)
        return value

    def command(self, cmd: Command, dot: Any, scope: list, final: Any) -> Any:
        self.tick(cmd.pos)
        first, rest = cmd.args[0], cmd.args[1:]
        if isinstance(first, Ident):
            return self.call(first, rest, dot, scope, final)
        if rest or final is not _NO_ARG:
            what = ".".join(first.path) if isinstance(first, Field) else self.src[first.pos : first.pos + 20]
            raise self.error(f"can't give argument to non-function {what}", first.pos)
        return self.arg(first, dot, scope)

    def arg(self, node: Arg, dot: Any, scope: list) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self.fields(dot, node.path, node.pos)
        if isinstance(node, Variable):
            return self.fields(self.lookup(scope, node), node.path, node.pos)
        if isinstance(node, Pipe):
            return self.pipeline(node, dot, scope, declare=False)
        if isinstance(node, Chain):
            return self.fields(self.pipeline(node.node, dot, scope, declare=False), node.path, node.pos)
        if isinstance(node, Ident):
            return self.call(node, [], dot, scope, _NO_ARG)
        raise self.error("unsupported operand", node.pos)

    def lookup(self, scope: list, node: Variable) -> Any:
        for name, value in reversed(scope):
            if name == node.name:
                return value
        raise self.error(f'undefined variable "{node.name}"', node.pos)

    def fields(self, value: Any, path: tuple[str, ...], pos: int) -> Any:
        for name in path:
            if isinstance(value, GoStruct):
                if name not in value.fields:
                    raise self.error(f"can't evaluate field {name} in type {value.type_name}", pos)
                value = value.fields[name]
            elif isinstance(value, dict):
                value = value.get(name)  # missingkey=zero: an absent key reads as nil
            elif value is None:
                raise self.error(f"nil pointer evaluating interface {{}}.{name}", pos)
            else:
                raise self.error(f"can't evaluate field {name} in type {type_name(value)}", pos)
        return value

    def call(self, ident: Ident, arg_nodes: list[Arg], dot: Any, scope: list, final: Any) -> Any:
        name = ident.name
        n_args = len(arg_nodes) + (final is not _NO_ARG)
        lo, hi = ARITY.get(name, (0, None))
        if n_args < lo or (hi is not None and n_args > hi):
            raise self.error(
                f"wrong number of args for {name}: want {lo}{'' if hi == lo else '+'} got {n_args}", ident.pos
            )
        if name in ("and", "or"):
            return self.and_or(name, arg_nodes, dot, scope, final)
        args = [self.arg(a, dot, scope) for a in arg_nodes]
        if final is not _NO_ARG:
            args.append(final)
        try:
            result = FUNCTIONS[name](*args)
        except (FuncError, FormatError, TypeError, ValueError) as e:
            raise self.error(f"error calling {name}: {e}", ident.pos) from None
        if isinstance(result, str) and len(result) > self.limits.max_output:
            raise self.error(f"{name} result exceeds {self.limits.max_output} characters", ident.pos)
        return result

    def and_or(self, name: str, arg_nodes: list[Arg], dot: Any, scope: list, final: Any) -> Any:
        """Short-circuit: `and` returns the first false argument or the last; `or` the first true or the last."""
        value: Any = None
        thunks = [lambda a=a: self.arg(a, dot, scope) for a in arg_nodes]
        if final is not _NO_ARG:
            thunks.append(lambda: final)
        for thunk in thunks:
            value = thunk()
            if truth(value) != (name == "and"):
                return value
        return value
