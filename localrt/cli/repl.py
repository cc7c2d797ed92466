"""`localrt run MODEL` without a prompt: an interactive chat with Ollama's slash commands."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Callable

from ..api.options import resolve
from ..errors import InvalidRequest
from .cli_format import verbose_stats
from .repl_help import HELP, PARAMETERS_HELP, SET_HELP, SHORTCUTS_HELP, SHOW_HELP
from .thinking_view import ThinkingView
from .client import ApiError
from .spinner import Spinner, kernel_detail


def _parse_value(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return raw


SHOWN_ITEMS = 3  # `show -v` prints the first few entries of a metadata array (tokens, merges), as Ollama does


def _metadata_value(v, full: bool) -> str:
    if isinstance(v, list) and not full and len(v) > SHOWN_ITEMS:
        head = ", ".join(json.dumps(x, ensure_ascii=False) for x in v[:SHOWN_ITEMS])
        return f"[{head}, ...] ({len(v)} items)"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (list, str)) else str(v)


def describe(info: dict, verbose: bool = False, full: bool = False) -> str:
    """The default `show` view: Model, Capabilities, Parameters, System, License sections; with `verbose`, the
    metadata too, long arrays shortened unless `full`."""
    mi = info.get("model_info") or {}
    arch = mi.get("general.architecture", "")
    det = info.get("details") or {}
    rows = [
        ("architecture", arch),
        ("parameters", det.get("parameter_size", "")),
        ("context length", mi.get(f"{arch}.context_length", "")),
        ("embedding length", mi.get(f"{arch}.embedding_length", "")),
        ("quantization", det.get("quantization_level", "")),
    ]
    out = ["  Model"] + [f"    {k:<20}{v}" for k, v in rows if v != ""]
    if info.get("capabilities"):
        out += ["", "  Capabilities"] + [f"    {c}" for c in info["capabilities"]]
    ti = info.get("template_info")
    if ti:
        stops = ", ".join(json.dumps(x, ensure_ascii=False) for x in ti.get("stop") or [])
        stops = stops or "(end-of-generation tokens only)"
        out += [
            "",
            "  Template",
            f"    {ti.get('origin', '')} ({ti.get('kind', '')}): {ti.get('reason', '')}",
            f"    stop: {stops}",
        ]
    if info.get("parameters"):
        out += ["", "  Parameters"] + ["    " + line for line in info["parameters"].splitlines()]
    for key in ("system", "license"):
        if info.get(key):
            lines = info[key].strip().splitlines()
            out += ["", f"  {key.capitalize()}"] + ["    " + ln for ln in lines[: None if verbose else 2]]
            if len(lines) > 2 and not verbose:
                out.append("    ...")
    if verbose and mi:
        out += ["", "  Metadata"] + [f"    {k:<40}{_metadata_value(v, full)}" for k, v in mi.items()]
    return "\n".join(out) + "\n"


def _interruptible() -> None:
    """Ctrl-C at the prompt says how to leave, also when the chat was started with SIGINT ignored (from a
    non-interactive shell's background job, or nohup), which Python would otherwise keep: a person at the
    terminal pressing Ctrl-C means it."""
    if sys.stdin.isatty() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


HISTORY_LINES = 1000


def _line_editing(history: Path | None = None) -> Callable[[], None]:
    """Arrow keys, line editing and history for input(), where the platform has GNU readline or libedit; the history
    is read from `history` (the data directory's, as `ollama run` keeps ~/.ollama/history) and the returned function
    writes it back. Nothing where there is no readline or the file cannot be read or written."""
    try:
        import readline  # importing it is what hooks it into input()
    except ImportError:
        return lambda: None
    if "libedit" not in (readline.__doc__ or ""):
        # CPython turns GNU readline's bracketed paste off (for its own prompt); on, the terminal marks a paste, and
        # several pasted lines come back from input() as one message, as they do in `ollama run`
        readline.parse_and_bind("set enable-bracketed-paste on")
    if history is None:
        return lambda: None
    with contextlib.suppress(OSError):
        readline.read_history_file(history)
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        with contextlib.suppress(OSError):
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)

    return save


class Repl:
    def __init__(
        self,
        client,
        model: str,
        *,
        verbose=False,
        format=None,
        keepalive=None,
        wordwrap=True,
        think=None,
        hidethinking=False,
    ):
        self.client, self.model = client, model
        self.verbose, self.format, self.keepalive, self.wordwrap = verbose, format, keepalive, wordwrap
        self.think, self.hidethinking = think, hidethinking
        self.options: dict = {}
        self.system: str | None = None
        self.messages: list[dict] = []

    # input -------------------------------------------------------------------------------------------------
    def _read(self) -> str | None:
        try:
            line = input(">>> ")
        except EOFError:
            return None
        if not line.lstrip().startswith('"""'):
            return line
        return self._multiline(line.lstrip()[3:])

    def _multiline(self, first: str) -> str:
        """The rest of a \"\"\"-quoted block whose first line (after the opening quotes) is `first`."""
        if first.rstrip().endswith('"""'):
            return first.rstrip()[:-3]
        lines = [first]
        while True:
            try:
                more = input("... ")
            except EOFError:
                return "\n".join(lines)
            if more.rstrip().endswith('"""'):
                lines.append(more.rstrip()[:-3])
                return "\n".join(lines)
            lines.append(more)

    def loop(self) -> None:
        from localrt import config

        save_history = _line_editing(Path(config.load().data_dir) / "history")
        try:
            self._loop()
        finally:
            save_history()

    def _loop(self) -> None:
        _interruptible()
        list(self.client.generate(self.model, "", stream=False, keep_alive=self.keepalive))  # preload
        while True:
            try:
                line = self._read()
            except KeyboardInterrupt:
                print("\nUse Ctrl + d or /bye to exit.")
                continue
            if line is None or line.strip() in ("/bye", "/exit"):
                return
            if not line.strip():
                continue
            if line.startswith("/"):
                self.command(line.strip())
                continue
            self.turn(line)

    # commands ----------------------------------------------------------------------------------------------
    def command(self, line: str) -> None:
        parts = line.split(maxsplit=2)
        cmd = parts[0]
        if cmd in ("/?", "/help"):
            topic = parts[1].lstrip("/") if len(parts) > 1 else ""
            print(
                {"set": SET_HELP, "show": SHOW_HELP, "shortcuts": SHORTCUTS_HELP, "shortcut": SHORTCUTS_HELP}.get(
                    topic, HELP
                )
            )
        elif cmd == "/clear":
            self.messages = []
            print("Cleared session context")
        elif cmd == "/set":
            self._set(parts[1:])
        elif cmd == "/show":
            self._show(parts[1:])
        elif cmd == "/load":
            self._load(line.split())
        elif cmd == "/save":
            self._save(line.split())
        else:
            print(f"Unknown command '{cmd}'. Type /? for help")

    def _load(self, args: list[str]) -> None:
        if len(args) != 2:
            print("Usage:\n  /load <modelname>")
            return
        print(f"Loading model '{args[1]}'")
        try:
            self.client.show(args[1])
            list(self.client.generate(args[1], "", stream=False, keep_alive=self.keepalive))
        except ApiError as e:
            # the session stays on the model it had, as Ollama's /load does
            print(f"Couldn't find model '{args[1]}'" if e.status == 404 else f"error: {e.message}")
            return
        self.model, self.messages = args[1], []

    def _save(self, args: list[str]) -> None:
        if len(args) != 2:
            print("Usage:\n  /save <modelname>")
            return
        body = {"model": args[1], "from": self.model}
        if self.system:
            body["system"] = self.system
        if self.options:
            body["parameters"] = self.options
        if self.messages:
            body["messages"] = self.messages
        try:
            list(self.client.create(body))
        except ApiError as e:
            print(f"error: {e.message}")
            return
        print(f"Created new model '{args[1]}'")

    def _set(self, args: list[str]) -> None:
        if not args:
            print(SET_HELP)
            return
        what, rest = args[0], (args[1] if len(args) > 1 else "")
        if what == "parameter":
            self._set_parameter(rest)
        elif what == "system":
            if not rest.strip():
                print(SET_HELP)
                return
            text = rest.strip()
            if text.startswith('"""'):
                text = self._multiline(text[3:])
            self.system = text
            print("Set system message.")
        elif what == "format":
            if rest.strip() != "json":
                print("Invalid or missing format. For 'json' mode use '/set format json'")
                return
            self.format = "json"
            print("Set format to 'json' mode.")
        elif what == "noformat":
            self.format = None
            print("Disabled format.")
        elif what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            print("Set 'verbose' mode." if self.verbose else "Set 'quiet' mode.")
        elif what in ("think", "nothink"):
            level = args[1].lower() if what == "think" and len(args) > 1 else None
            if level not in (None, "low", "medium", "high"):
                print(f"Invalid think level '{args[1]}': use low, medium or high")
                return
            self.think = (level or True) if what == "think" else False
            print(f"Set 'think' mode{f' to {level}' if level else ''}." if what == "think" else "Set 'nothink' mode.")
        elif what in ("wordwrap", "nowordwrap"):
            self.wordwrap = what == "wordwrap"
            print("Set 'wordwrap' mode." if self.wordwrap else "Set 'nowordwrap' mode.")
        else:
            print(f"Unknown command '/set {what}'. Type /? for help")

    def _set_parameter(self, rest: str) -> None:
        name, _, value = rest.strip().partition(" ")
        values = value.split()
        if not name:
            print(PARAMETERS_HELP)  # what can be set, as `/set parameter` alone prints in Ollama
            return
        if not values:
            print("Usage: /set parameter <name> <value>")
            return
        parsed = values if name == "stop" else _parse_value(value.strip())
        try:
            resolve({name: parsed})  # the daemon's own checks: a bad name or value is refused here, not mid-chat
        except InvalidRequest as e:
            print(f"Couldn't set parameter: {e}")
            return
        self.options[name] = parsed
        print(f"Set parameter '{name}' to '{', '.join(values)}'")

    def _show(self, args: list[str]) -> None:
        if not args:
            print(SHOW_HELP)
            return
        what = args[0]
        if what not in ("info", "license", "modelfile", "parameters", "system", "template"):
            print(f"Unknown command '/show {what}'. Type /? for help")
            return
        info = self.client.show(self.model)
        if what == "info":
            print(describe(info))
        elif what == "parameters":
            print(self._parameters_text(info.get("parameters") or ""))
        elif what == "system":
            # the session's system message wins over the model's, as it does in the chat requests
            print(self.system or info.get("system") or "No system message was specified for this model.")
        elif what == "template":
            print(info.get("template") or "No prompt template was specified for this model.")
        else:
            print(info.get(what) or f"No {what} was specified for this model.")

    def _parameters_text(self, model_params: str) -> str:
        out = ["Model defined parameters:"]
        out += ["  " + ln for ln in model_params.splitlines()] or [
            "  No additional parameters were specified for this model."
        ]
        if self.options:
            out += ["", "User defined parameters:"]
            out += [f"  {k:<30} {json.dumps(v) if not isinstance(v, str) else v}" for k, v in self.options.items()]
        return "\n".join(out) + "\n"

    # a chat turn -------------------------------------------------------------------------------------------
    def turn(self, text: str) -> None:
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        msgs.append({"role": "user", "content": text})
        # wrapping moves the cursor with escape codes: only on a terminal, never into a pipe or file
        tty = sys.stdout.isatty()
        wrap = self.wordwrap and tty
        out = WordWrap(sys.stdout, shutil.get_terminal_size((80, 20)).columns) if wrap else _Plain(sys.stdout)
        view = ThinkingView(out, sys.stdout, hide=self.hidethinking, tty=tty)
        reply, reasoning, done = [], [], None
        try:
            with Spinner(detail=kernel_detail(self.client)) as spinner:  # until the first token
                for ev in self.client.chat(
                    self.model,
                    msgs,
                    options=self.options or None,
                    format=self.format,
                    keep_alive=self.keepalive,
                    think=self.think,
                ):
                    piece = (ev.get("message") or {}).get("content", "")
                    thinking = (ev.get("message") or {}).get("thinking", "")
                    if piece or thinking or ev.get("done"):
                        spinner.stop()
                    reply.append(piece)
                    reasoning.append(thinking)
                    view.write(thinking, piece)
                    if ev.get("done"):
                        done = ev
            view.end()
        except KeyboardInterrupt:
            print()
            return
        except ApiError as e:
            # the turn is dropped from the history; the session goes on
            print(f"\nError: {e.message}")
            return
        print("\n")
        answer = {"role": "assistant", "content": "".join(reply)}
        if "".join(reasoning):
            answer["thinking"] = "".join(reasoning)  # replayed as the template expects
        self.messages += [{"role": "user", "content": text}, answer]
        if self.verbose and done:
            print(verbose_stats(done), file=sys.stderr)


class _Plain:
    def __init__(self, out):
        self.out = out

    def write(self, piece: str) -> None:
        self.out.write(piece)
        self.out.flush()


class WordWrap:
    """Streams text to a terminal `width` columns wide, moving a word that would cross the right edge to the next
    line (the way `ollama run` wraps), so words are never split by the terminal."""

    def __init__(self, out, width: int):
        self.out, self.width = out, max(width, 2)
        self.col = 0  # cursor column on the current line
        self.word = ""  # the letters written since the last space or newline

    def write(self, piece: str) -> None:
        for ch in piece:
            if ch == "\n":
                self.col, self.word = 0, ""
            elif ch == " ":
                self.word = ""
                if self.col >= self.width - 1:
                    ch, self.col = "\n", 0  # a space at the edge becomes the line break
                else:
                    self.col += 1
            else:
                if self.col >= self.width - 1:
                    self._break()
                self.word += ch
                self.col += 1
            self.out.write(ch)
        self.out.flush()

    def _break(self) -> None:
        if self.word and len(self.word) < self.col:
            # erase the unfinished word (cursor left, clear to end of line) and start it again on a new line
            self.out.write(f"\x1b[{len(self.word)}D\x1b[K\n{self.word}")
            self.col = len(self.word)
        else:
            # a word as long as the line cannot move: break it
            self.out.write("\n")
            self.col, self.word = 0, ""
