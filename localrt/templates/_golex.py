"""Lexer for the Go text/template subset: text, `{{ }}` actions, trim markers, comments, literals."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import TemplateError, line_col

SPACE = " \t\r\n"
KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+"
    r"|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?)"
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


@dataclass(frozen=True)
class Token:
    kind: str  # text ldelim rdelim field var dot ident keyword string number bool nil pipe lparen rparen
    #              comma declare assign eof
    value: Any
    start: int  # offset of the token's first character in the source
    end: int  # offset just past it


def lex(src: str) -> list[Token]:
    """All tokens of `src`; trim markers are applied to the neighbouring text tokens here."""
    return _Lexer(src).run()


class _Lexer:
    def __init__(self, src: str):
        self.src = src
        self.tokens: list[Token] = []

    def error(self, msg: str, offset: int) -> TemplateError:
        line, col = line_col(self.src, offset)
        return TemplateError(msg, line=line, col=col)

    def run(self) -> list[Token]:
        src, pos, trim_next = self.src, 0, False
        while True:
            i = src.find("{{", pos)
            text = src[pos:] if i < 0 else src[pos:i]
            text_start = pos
            if trim_next:
                stripped = text.lstrip(SPACE)
                text_start += len(text) - len(stripped)
                text = stripped
            left_trim = i >= 0 and src.startswith("-", i + 2) and i + 3 < len(src) and src[i + 3] in SPACE
            if left_trim:
                text = text.rstrip(SPACE)
            if text:
                self.tokens.append(Token("text", text, text_start, text_start + len(text)))
            if i < 0:
                break
            pos, trim_next = self.action(i, i + (4 if left_trim else 2))
        self.tokens.append(Token("eof", None, len(src), len(src)))
        return self.tokens

    def action(self, start: int, p: int) -> tuple[int, bool]:
        """Lex one action starting after its `{{` (and trim marker); returns (offset after `}}`, trim right)."""
        src = self.src
        if src.startswith("/*", p):
            return self.comment(start, p)
        self.tokens.append(Token("ldelim", None, start, p))
        while True:
            if p >= len(src):
                raise self.error("unclosed action", start)
            c = src[p]
            if src.startswith("}}", p):
                self.tokens.append(Token("rdelim", False, p, p + 2))
                return p + 2, False
            if c in SPACE:
                if src.startswith("-}}", p + 1):
                    self.tokens.append(Token("rdelim", True, p, p + 4))
                    return p + 4, True
                p += 1
                continue
            p = self.item(p)

    def comment(self, start: int, p: int) -> tuple[int, bool]:
        src = self.src
        end = src.find("*/", p + 2)
        if end < 0:
            raise self.error("unclosed comment", start)
        q = end + 2
        if src.startswith("}}", q):
            return q + 2, False
        if q < len(src) and src[q] in SPACE and src.startswith("-}}", q + 1):
            return q + 4, True
        raise self.error("comment ends before closing delimiter", start)

    def item(self, p: int) -> int:
        """Lex one token inside an action at `p`; returns the offset after it."""
        src, c = self.src, self.src[p]
        simple = {"|": "pipe", "(": "lparen", ")": "rparen", ",": "comma"}
        if c in simple:
            return self.push(simple[c], c, p, p + 1)
        if src.startswith(":=", p):
            return self.push("declare", ":=", p, p + 2)
        if c == "=":
            return self.push("assign", "=", p, p + 1)
        if c == '"':
            return self.quoted(p)
        if c == "`":
            end = src.find("`", p + 1)
            if end < 0:
                raise self.error("unterminated raw quoted string", p)
            return self.push("string", src[p + 1 : end], p, end + 1)
        if c == "'":
            return self.char(p)
        if c == "$":
            end = self.word_end(p + 1)
            return self.push("var", src[p:end], p, end)
        if c == "." and p + 1 < len(src) and (src[p + 1].isalpha() or src[p + 1] == "_"):
            end = self.word_end(p + 1)
            return self.push("field", src[p + 1 : end], p, end)
        if c.isdigit() or (c in "+-." and p + 1 < len(src) and (src[p + 1].isdigit() or src[p + 1] == ".")):
            return self.number(p)
        if c == ".":
            return self.push("dot", ".", p, p + 1)
        if c.isalpha() or c == "_":
            end = self.word_end(p)
            word = src[p:end]
            if word in ("true", "false"):
                return self.push("bool", word == "true", p, end)
            if word == "nil":
                return self.push("nil", None, p, end)
            return self.push("keyword" if word in KEYWORDS else "ident", word, p, end)
        raise self.error(f"unexpected {c!r} in command", p)

    def push(self, kind: str, value: Any, start: int, end: int) -> int:
        self.tokens.append(Token(kind, value, start, end))
        return end

    def word_end(self, p: int) -> int:
        src = self.src
        while p < len(src) and (src[p].isalnum() or src[p] == "_"):
            p += 1
        return p

    def number(self, p: int) -> int:
        m = _NUMBER.match(self.src, p)
        end = m.end() if m else p
        if not m or (end < len(self.src) and (self.src[end].isalnum() or self.src[end] in "._")):
            raise self.error(f"bad number syntax: {self.src[p : self.word_end(end) + 1]!r}", p)
        text = m.group().replace("_", "")
        body = text.lstrip("+-")
        try:
            if body[:2].lower() in ("0x", "0b", "0o"):
                value: Any = int(text, 0)
            elif "." in body or "e" in body.lower():
                value = float(text)
            elif len(body) > 1 and body.startswith("0"):
                value = int(text, 8)  # Go reads a leading 0 as octal
            else:
                value = int(text)
        except ValueError:
            raise self.error(f"bad number syntax: {m.group()!r}", p) from None
        return self.push("number", value, p, end)

    def quoted(self, p: int) -> int:
        src, q, out = self.src, p + 1, []
        while True:
            if q >= len(src) or src[q] == "\n":
                raise self.error("unterminated quoted string", p)
            c = src[q]
            if c == '"':
                return self.push("string", "".join(out), p, q + 1)
            if c != "\\":
                out.append(c)
                q += 1
                continue
            ch, q = self.escape(q + 1, p)
            out.append(ch)

    def escape(self, q: int, start: int) -> tuple[str, int]:
        """Decode the escape whose letter is at `q`; returns (character, offset after it)."""
        src = self.src
        e = src[q : q + 1]
        if e in _ESCAPES:
            return _ESCAPES[e], q + 1
        widths = {"x": 2, "u": 4, "U": 8}
        if e in widths:
            digits = src[q + 1 : q + 1 + widths[e]]
            if len(digits) == widths[e] and all(d in "0123456789abcdefABCDEF" for d in digits):
                code = int(digits, 16)
                if code <= 0x10FFFF:
                    return chr(code), q + 1 + widths[e]
        if e.isdigit():
            digits = src[q : q + 3]
            if len(digits) == 3 and all(d in "01234567" for d in digits) and int(digits, 8) < 256:
                return chr(int(digits, 8)), q + 3
        raise self.error("invalid escape sequence in quoted string", start)

    def char(self, p: int) -> int:
        src = self.src
        if src[p + 1 : p + 2] == "\\":
            ch, q = self.escape(p + 2, p)
        elif p + 1 < len(src) and src[p + 1] not in "'\n":
            ch, q = src[p + 1], p + 2
        else:
            raise self.error("malformed character constant", p)
        if src[q : q + 1] != "'":
            raise self.error("unterminated character constant", p)
        return self.push("number", ord(ch), p, q + 1)
