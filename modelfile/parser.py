"""Modelfile parser: the language Ollama's parser accepts, with line-numbered errors.

Rules (ollama_spec 7.2): keywords are case-insensitive; `#` starts a comment only as the first non-blank
character of a line; a keyword is separated from its argument by spaces/tabs and the argument runs to the
end of the line, trimmed. An argument that starts with `"` or `\"\"\"` continues over following lines until
a line ends (ignoring trailing blanks) with the closing quote; the quotes are removed. Single quotes are not
special. PARAMETER names and MESSAGE roles are case-sensitive and checked, and every PARAMETER value is
parsed with its Ollama type.

Differences from Ollama, all toward clearer errors: control characters other than tab/CR/LF are an error
(Ollama drops them silently); a keyword with no argument is an error (Ollama stores an empty one); the
newer Ollama-only instructions (RENDERER, PARSER, REQUIRES, DRAFT) are refused by name instead of being
accepted and ignored; a repeated TEMPLATE/SYSTEM/PARAMETER adds a warning (the last one wins, as in Ollama)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import params as P

INSTRUCTIONS = ("from", "parameter", "template", "system", "adapter", "license", "message")
UNSUPPORTED = ("renderer", "parser", "requires", "draft")
ROLES = ("system", "user", "assistant")
MAX_MODELFILE_CHARS = 64 << 20

_NEWLINE = re.compile(r"\r\n|\r|\n")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORD = re.compile(r"[A-Za-z]+")
_PARAM_NAME = re.compile(r"[A-Za-z0-9_]+")
_BLANK = " \t"
_BAD_COMMAND = 'command must be one of "from", "license", "template", "system", "adapter", "parameter", or "message"'


class ModelfileError(ValueError):
    """A Modelfile that cannot be used; `line` is 1-based (0 when the problem is not on one line)."""

    def __init__(self, line: int, msg: str):
        super().__init__(f"(line {line}): {msg}" if line > 0 else msg)
        self.line = line
        self.msg = msg


@dataclass(frozen=True)
class Command:
    """One instruction. `name` is the lower-case keyword; `param`/`role` are set for PARAMETER/MESSAGE."""

    name: str
    args: str
    line: int = 0
    param: str | None = None
    role: str | None = None
    value: object = None  # typed PARAMETER value

    @property
    def key(self) -> tuple:
        return (self.name, self.param, self.role, self.args)

    @property
    def message(self) -> tuple[str, str] | None:
        """(role, content) of a MESSAGE; None for other instructions."""
        return (self.role, self.args) if self.name == "message" else None


@dataclass
class Modelfile:
    commands: list[Command]
    warnings: list[str] = field(default_factory=list)

    @property
    def froms(self) -> list[str]:
        return [c.args for c in self.commands if c.name == "from"]

    @property
    def from_(self) -> str:
        return self.froms[0]

    @property
    def adapters(self) -> list[str]:
        return [c.args for c in self.commands if c.name == "adapter"]

    def _last(self, name: str) -> str | None:
        found = [c.args for c in self.commands if c.name == name]
        return found[-1] if found else None

    @property
    def template(self) -> str | None:
        return self._last("template")

    @property
    def system(self) -> str | None:
        return self._last("system")

    @property
    def licenses(self) -> list[str]:
        return [c.args for c in self.commands if c.name == "license"]

    @property
    def messages(self) -> list[dict]:
        return [{"role": c.role, "content": c.args} for c in self.commands if c.name == "message"]

    @property
    def parameters(self) -> dict:
        """Typed parameters: `stop` is a list (every PARAMETER stop line); for others the last line wins."""
        out: dict = {}
        for c in self.commands:
            if c.name != "parameter" or c.param in P.DEPRECATED:
                continue
            if P.TYPES[c.param] == P.STRINGS:
                out.setdefault(c.param, []).append(c.value)
            else:
                out[c.param] = c.value
        return out

    def canonical(self) -> tuple:
        """What the Modelfile means, independent of order, comments and quoting (for round-trip checks)."""
        return (
            tuple(self.froms),
            tuple(self.adapters),
            self.template,
            self.system,
            tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in self.parameters.items()),
            tuple(self.licenses),
            tuple((m["role"], m["content"]) for m in self.messages),
        )


def _unquote(text: str) -> tuple[str, bool]:
    """(value, complete): strip `\"\"\"...\"\"\"` or `"..."`; incomplete when the closing quote is missing."""
    if text.startswith('"""'):
        if len(text) >= 6 and text.endswith('"""'):
            return text[3:-3], True
        return "", False
    if text.startswith('"'):
        if len(text) >= 2 and text.endswith('"'):
            return text[1:-1], True
        return "", False
    return text, True


def _lines(text: str) -> list[tuple[str, str]]:
    """Split into (line, line ending) pairs; CRLF, CR and LF each end one line."""
    out = []
    pos = 0
    for m in _NEWLINE.finditer(text):
        out.append((text[pos : m.start()], m.group()))
        pos = m.end()
    out.append((text[pos:], ""))
    return out


class _Reader:
    def __init__(self, text: str):
        self.lines = _lines(text)
        self.i = 0

    def value(self, first: str, start_line: int) -> str:
        """The argument starting with `first` on line `start_line`, continued over lines while quoted."""
        buf = first
        while True:
            value, complete = _unquote(buf.strip())
            if complete:
                return value
            if self.i >= len(self.lines):
                raise ModelfileError(start_line, "unterminated quoted string (unexpected end of file)")
            line, _ = self.lines[self.i]
            buf += self.lines[self.i - 1][1] + line
            self.i += 1


def _split_word(rest: str, pattern: re.Pattern, line_no: int, what: str) -> tuple[str, str]:
    m = pattern.match(rest)
    word = m.group() if m else ""
    after = rest[len(word) :]
    if not word:
        raise ModelfileError(line_no, f"{what} is missing")
    if after and after[0] not in _BLANK:
        raise ModelfileError(line_no, f"{what} {word!r} must be followed by a space")
    if not after.strip(_BLANK):
        raise ModelfileError(line_no, f"{what} {word!r} has no value")
    return word, after.lstrip(_BLANK)


def _command(keyword: str, rest: str, line_no: int, reader: _Reader) -> Command:
    if keyword == "parameter":
        name, rest = _split_word(rest, _PARAM_NAME, line_no, "PARAMETER name")
        value = reader.value(rest, line_no)
        if name in P.DEPRECATED:
            return Command("parameter", value, line_no, param=name)
        try:
            typed = P.parse_value(name, value)
        except P.ParamError as e:
            raise ModelfileError(line_no, str(e)) from None
        return Command("parameter", value, line_no, param=name, value=typed)
    if keyword == "message":
        role, rest = _split_word(rest, _WORD, line_no, "MESSAGE role")
        if role not in ROLES:
            raise ModelfileError(line_no, f'message role must be one of "system", "user", or "assistant", not {role!r}')
        return Command("message", reader.value(rest, line_no), line_no, role=role)
    value = reader.value(rest, line_no)
    if keyword in ("from", "adapter") and not value.strip():
        raise ModelfileError(line_no, f"{keyword.upper()} needs a model name or a file path")
    return Command(keyword, value, line_no)


def parse(text: str) -> Modelfile:
    """Parse Modelfile text. Raises ModelfileError(line, msg); warnings go to `Modelfile.warnings`."""
    if not isinstance(text, str):
        raise ModelfileError(0, "a Modelfile must be text")
    if len(text) > MAX_MODELFILE_CHARS:
        raise ModelfileError(0, f"the Modelfile is larger than {MAX_MODELFILE_CHARS} characters")
    text = text.removeprefix("\ufeff")
    bad = _CONTROL.search(text)
    if bad:
        line_no = len(_NEWLINE.findall(text[: bad.start()])) + 1
        raise ModelfileError(line_no, f"control character U+{ord(bad.group()):04X} is not allowed")
    reader = _Reader(text)
    commands: list[Command] = []
    while reader.i < len(reader.lines):
        line_no = reader.i + 1
        line = reader.lines[reader.i][0].lstrip(_BLANK)
        reader.i += 1
        if not line.strip() or line.startswith("#"):
            continue
        m = _WORD.match(line)
        keyword = m.group().lower() if m else ""
        if keyword in UNSUPPORTED:
            raise ModelfileError(line_no, f"{keyword.upper()} is an Ollama instruction that localrt does not support")
        if keyword not in INSTRUCTIONS:
            raise ModelfileError(line_no, _BAD_COMMAND)
        _, rest = _split_word(line, _WORD, line_no, "instruction")
        commands.append(_command(keyword, rest, line_no, reader))
    if not any(c.name == "from" for c in commands):
        raise ModelfileError(0, "no FROM line")
    return Modelfile(commands, _warnings(commands))


def _warnings(commands: list[Command]) -> list[str]:
    out = []
    seen: dict[tuple, int] = {}
    for c in commands:
        if c.name == "parameter" and c.param in P.DEPRECATED:
            out.append(f"(line {c.line}): parameter {c.param} is deprecated and is ignored")
            continue
        if c.name in ("template", "system") or (c.name == "parameter" and P.TYPES[c.param] != P.STRINGS):
            key = (c.name, c.param)
            if key in seen:
                what = f"PARAMETER {c.param}" if c.param else c.name.upper()
                out.append(f"(line {c.line}): {what} is set again (first on line {seen[key]}); the last one is used")
            seen.setdefault(key, c.line)
    return out
