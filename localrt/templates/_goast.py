"""Syntax tree of a parsed Go template. `pos` is the character offset of the node in the source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass
class Text:
    text: str
    pos: int


@dataclass
class Field:
    path: tuple[str, ...]  # .A.B -> ("A", "B")
    pos: int


@dataclass
class Variable:
    name: str  # "$" or "$x"
    path: tuple[str, ...]  # $x.A.B -> ("A", "B")
    pos: int


@dataclass
class Dot:
    pos: int


@dataclass
class Literal:
    value: Any  # str, int, float, bool or None (nil)
    pos: int


@dataclass
class Ident:
    name: str  # a function name
    pos: int


@dataclass
class Chain:
    node: "Pipe"  # (pipeline).A.B
    path: tuple[str, ...]
    pos: int


@dataclass
class Command:
    args: list["Arg"]
    pos: int


@dataclass
class Pipe:
    decl: list[str]  # variables declared or assigned by the pipeline
    assign: bool  # `=` instead of `:=`
    cmds: list[Command]
    pos: int


@dataclass
class Action:
    pipe: Pipe
    pos: int


@dataclass
class Branch:
    kind: str  # "if", "with" or "range"
    pipe: Pipe
    body: list["Node"]
    else_body: list["Node"] | None
    pos: int


@dataclass
class Break:
    pos: int


@dataclass
class Continue:
    pos: int


Arg = Union[Field, Variable, Dot, Literal, Ident, Chain, Pipe]
Node = Union[Text, Action, Branch, Break, Continue]
