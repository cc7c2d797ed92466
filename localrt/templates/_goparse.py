"""Parser for the Go text/template subset: tokens -> syntax tree, with Go's parse-time checks
(undefined variables and functions, break/continue outside range, unbalanced end/else)."""

from __future__ import annotations

from typing import Collection

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
from ._golex import Token, lex
from .errors import TemplateError, line_col

MAX_NESTING = 100  # control structures plus parentheses; keeps parse and exec recursion shallow


def parse_tree(src: str, functions: Collection[str]) -> list[Node]:
    return _Parser(src, functions).parse()


class _Parser:
    def __init__(self, src: str, functions: Collection[str]):
        self.src = src
        self.tokens = lex(src)
        self.i = 0
        self.functions = functions
        self.vars: list[str] = ["$"]
        self.range_depth = 0
        self.depth = 0

    def error(self, msg: str, offset: int) -> TemplateError:
        line, col = line_col(self.src, offset)
        return TemplateError(msg, line=line, col=col)

    def peek(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, context: str) -> Token:
        tok = self.next()
        if tok.kind != kind:
            raise self.error(f"unexpected {self.describe(tok)} in {context}", tok.start)
        return tok

    @staticmethod
    def describe(tok: Token) -> str:
        if tok.kind == "eof":
            return "EOF"
        if tok.kind == "rdelim":
            return '"}}"'
        return f"<{tok.value}>" if tok.value is not None else tok.kind

    def parse(self) -> list[Node]:
        nodes, term = self.parse_list()
        if term is not None:
            raise self.error(f"unexpected {{{{{term.value}}}}}", term.start)
        return nodes

    def parse_list(self) -> tuple[list[Node], Token | None]:
        """Nodes up to EOF (terminator None) or up to an `end`/`else` keyword (returned, `}}` not consumed)."""
        nodes: list[Node] = []
        while True:
            tok = self.next()
            if tok.kind == "eof":
                return nodes, None
            if tok.kind == "text":
                nodes.append(Text(tok.value, tok.start))
                continue
            head = self.peek()
            if head.kind == "keyword" and head.value in ("end", "else"):
                self.next()
                return nodes, head
            nodes.append(self.action(tok, head))

    def action(self, ldelim: Token, head: Token) -> Node:
        if head.kind == "keyword":
            self.next()
            if head.value in ("if", "with", "range"):
                return self.branch(head)
            if head.value in ("break", "continue"):
                if self.range_depth == 0:
                    raise self.error(f"{{{{{head.value}}}}} outside {{{{range}}}}", head.start)
                self.expect("rdelim", head.value)
                return Break(head.start) if head.value == "break" else Continue(head.start)
            raise self.error(f"{{{{{head.value}}}}} is not supported", head.start)
        pipe = self.pipeline("command", allow_decl=True, max_decl=1)
        self.expect("rdelim", "command")
        return Action(pipe, ldelim.start)

    def branch(self, kw: Token) -> Branch:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error("template nesting too deep", kw.start)
        mark = len(self.vars)
        is_range = kw.value == "range"
        pipe = self.pipeline(kw.value, allow_decl=True, max_decl=2 if is_range else 1)
        self.expect("rdelim", kw.value)
        self.range_depth += is_range
        body, term = self.parse_list()
        self.range_depth -= is_range
        if term is None:
            raise self.error(f"unexpected EOF: {{{{{kw.value}}}}} has no {{{{end}}}}", kw.start)
        else_body = None
        if term.value == "else":
            else_body = self.else_part(kw)
        else:
            self.expect("rdelim", "end")
        del self.vars[mark:]
        self.depth -= 1
        return Branch(kw.value, pipe, body, else_body, kw.start)

    def else_part(self, kw: Token) -> list[Node]:
        """After `{{else`: either `if`/`with` chaining (shares the outer {{end}}) or a plain else list."""
        head = self.peek()
        if head.kind == "keyword" and head.value in ("if", "with") and kw.value != "range":
            if head.value != kw.value:
                raise self.error(f"{{{{else {head.value}}}}} inside {{{{{kw.value}}}}}", head.start)
            self.next()
            return [self.branch(head)]
        self.expect("rdelim", "else")
        else_body, term = self.parse_list()
        if term is None or term.value != "end":
            where = term.start if term is not None else len(self.src)
            raise self.error(f"expected {{{{end}}}} for {{{{{kw.value}}}}}", where)
        self.expect("rdelim", "end")
        return else_body

    def pipeline(self, context: str, allow_decl: bool, max_decl: int, closer: str = "rdelim") -> Pipe:
        start = self.peek().start
        decl, assign = self.declarations(context, max_decl) if allow_decl else ([], False)
        cmds: list[Command] = []
        while True:
            cmds.append(self.command(context))
            tok = self.peek()
            if tok.kind == "pipe":
                self.next()
                continue
            if tok.kind != closer:
                raise self.error(f"unexpected {self.describe(tok)} in {context}", tok.start)
            break
        for cmd in cmds[1:]:
            if isinstance(cmd.args[0], (Literal, Dot)):
                raise self.error("non executable command in pipeline stage", cmd.pos)
        if not assign:
            self.vars.extend(decl)
        return Pipe(decl, assign, cmds, start)

    def declarations(self, context: str, max_decl: int) -> tuple[list[str], bool]:
        """`$x :=`, `$x =` or (in range) `$i, $v :=`; leaves the cursor unchanged when there is none."""
        t0, t1 = self.tokens[self.i], self.tokens[self.i + 1]
        if t0.kind != "var" or t1.kind not in ("declare", "assign", "comma"):
            return [], False
        names = [t0.value]
        self.i += 1
        if t1.kind == "comma":
            if max_decl < 2:
                raise self.error(f"too many declarations in {context}", t1.start)
            self.i += 1
            t2 = self.expect("var", context)
            names.append(t2.value)
            t1 = self.next()
            if t1.kind not in ("declare", "assign"):
                raise self.error(f"unexpected {self.describe(t1)} in {context}", t1.start)
        else:
            self.i += 1
        assign = t1.kind == "assign"
        if assign:
            for name in names:
                if name not in self.vars:
                    raise self.error(f'undefined variable "{name}"', t0.start)
        return names, assign

    def command(self, context: str) -> Command:
        args: list[Arg] = []
        start = self.peek().start
        while True:
            tok = self.peek()
            if tok.kind in ("pipe", "rdelim", "rparen", "eof"):
                break
            args.append(self.operand(context))
        if not args:
            raise self.error(f"missing value for {context}", start)
        if isinstance(args[0], Literal) and args[0].value is None:
            raise self.error("nil is not a command", args[0].pos)
        return Command(args, start)

    def operand(self, context: str) -> Arg:
        tok = self.next()
        node: Arg
        if tok.kind == "field":
            path = [tok.value]
            path.extend(self.field_chain(tok))
            return Field(tuple(path), tok.start)
        if tok.kind == "var":
            if tok.value not in self.vars:
                raise self.error(f'undefined variable "{tok.value}"', tok.start)
            return Variable(tok.value, tuple(self.field_chain(tok)), tok.start)
        if tok.kind == "dot":
            node = Dot(tok.start)
        elif tok.kind in ("string", "number", "bool", "nil"):
            node = Literal(tok.value, tok.start)
        elif tok.kind == "ident":
            if tok.value not in self.functions:
                raise self.error(f'function "{tok.value}" not defined', tok.start)
            node = Ident(tok.value, tok.start)
        elif tok.kind == "lparen":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.error("template nesting too deep", tok.start)
            node = self.pipeline("parenthesized pipeline", allow_decl=False, max_decl=0, closer="rparen")
            close = self.next()
            self.depth -= 1
            path = self.field_chain(close)
            if path:
                return Chain(node, tuple(path), tok.start)
        else:
            raise self.error(f"unexpected {self.describe(tok)} in {context}", tok.start)
        if self.peek().kind == "field" and self.peek().start == tok.end:
            raise self.error(f"unexpected . after term {self.src[tok.start : tok.end]!r}", self.peek().start)
        return node

    def field_chain(self, prev: Token) -> list[str]:
        """Field tokens that follow `prev` with no space in between (`.A.B`, `$x.A`, `(p).A`)."""
        path = []
        end = prev.end
        while self.peek().kind == "field" and self.peek().start == end:
            tok = self.next()
            path.append(tok.value)
            end = tok.end
        return path
