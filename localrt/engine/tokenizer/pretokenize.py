"""BPE pre-tokenizers: the regex chain llama.cpp runs for each `tokenizer.ggml.pre` value.

Each regex splits every current fragment into its matches and the gaps between them, keeping both in order
(llama.cpp's `unicode_regex_split`, a HF `Split(behavior="Isolated")` chain). The PyPI `regex` module's
`\\s` is Unicode White_Space and its `\\p{L}`/`\\p{N}`/`\\p{P}`/`\\p{S}`/`\\p{M}` are the general categories,
which is what llama.cpp's own tables give. Regexes that llama.cpp runs through `std::wregex` without
categories and that use `\\d` or `\\b` are ASCII-only there, so they carry the ASCII flag here. Such
regexes (no `\\p{..}`) also see every non-ASCII whitespace character as U+000B in llama.cpp, which matters
when a literal character range covers one (U+3000 lies in deepseek-coder's U+0800-U+4E00), so they match
against a copy of the text with that substitution here too.

A missing `pre` key is llama.cpp's documented fallback to "default" (it warns that quality degrades); an unknown
value is a load error, never a silent wrong split.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import logging
from dataclasses import dataclass

import regex

from ...errors import ModelLoadError

log = logging.getLogger(__name__)

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
JAIS2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
    + r"|\s{1,2}(?!\S)|\s{1}"
)
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_UPPERISH = r"((?=[\p{L}])([^a-z]))"  # llama.cpp's stand-in for [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
_LOWERISH = r"((?=[\p{L}])([^A-Z]))"  # and for [\p{Ll}\p{Lm}\p{Lo}\p{M}]
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_DEEPSEEK3_MAIN = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ASCII = regex.ASCII

# Unicode cased letters (L&) as deepseek-llm's tokenizer spells them out.
_CASED = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)

# pre-tokenizer type -> ordered regexes; an entry is a pattern or (pattern, flags).
REGEXES: dict[str, tuple] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (GPT2,),
    "llama3": (LLAMA3,),
    "qwen2": (QWEN2,),
    "smollm": (r"\p{N}", GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    # std::regex's "$" is end of input only, which is Python's \\Z.
    "deepseek-llm": (
        "[\r\n]",
        r"\s?[" + _CASED + "]+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ),
    "deepseek3": (r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_MAIN),
    "spark2_5": (
        r"\p{N}{1,3}",
        _CJK_KANA,
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
        r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    ),
    "poro": (_PORO,),
    "viking": (_PORO, r"\p{N}"),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?"
        + _UPPERISH
        + "*"
        + _LOWERISH
        + r"+|[^\r\n\p{L}\p{N}]?"
        + _UPPERISH
        + "+"
        + _LOWERISH
        + r"*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "gpt4o": (
        r"[^\r\n\p{L}\p{N}]?"
        + _UPPERISH
        + "*"
        + _LOWERISH
        + "+"
        + _CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?"
        + _UPPERISH
        + "+"
        + _LOWERISH
        + "*"
        + _CONTRACTIONS
        + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "granite-multi": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
        + _CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
        + _CONTRACTIONS
        + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "chameleon": (
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2,
    ),
    "superbpe": (r"\p{N}+", (r"(?=(\d{3})+(?!\d))", ASCII)),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "qwen35": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "exaone-moe": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "laguna": (r"[^\n]+|[\n]+", QWEN2),
    "minicpm5": (
        r"\p{N}{1,3}",
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "jais2": (JAIS2,),
}


@dataclass(frozen=True)
class PreTokenizer:
    name: str  # the GGUF value
    kind: str  # key into REGEXES
    ignore_merges: bool  # a fragment that is already a token is emitted whole
    clean_spaces: bool  # llama_detokenize's clean-up of " ." / " 's" etc.
    add_bos_default: bool  # add_bos when tokenizer.ggml.add_bos_token is absent


def _entries() -> dict[str, tuple[str, bool, bool]]:
    """GGUF pre value -> (regex kind, ignore_merges, clean_spaces), as llama.cpp's vocab loader maps them."""
    table: dict[str, tuple[str, bool, bool]] = {}

    def add(names: str, kind: str, ignore_merges: bool = False, clean_spaces: bool = True) -> None:
        for name in names.split():
            table[name] = (kind, ignore_merges, clean_spaces)

    add("default", "default")
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", "llama3", True)
    add("dbrx smaug-bpe", "llama3")
    add("glm4 chatglm-bpe", "llama3")
    add("deepseek-llm", "deepseek-llm", clean_spaces=False)
    add("deepseek-coder", "deepseek-coder", clean_spaces=False)
    add("deepseek-v3 hunyuan-dense joyai-llm hy_v4", "deepseek3", clean_spaces=False)
    add("spark2_5", "spark2_5", clean_spaces=False)
    add("granite-embed-multi-97m", "granite-multi", True, False)
    add("falcon", "falcon")
    add(
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
        "jina-v2-code roberta-bpe exaone4 mpt olmo jais",
        "gpt2",
    )
    add("trillion granite-docling", "gpt2", clean_spaces=False)
    add("starcoder refact codeshell exaone minerva-7b mellum2", "smollm")
    add("smollm command-r", "smollm", clean_spaces=False)
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", "qwen2", clean_spaces=False)
    add("megrez stablelm2", "qwen2")
    add("qwen35", "qwen35", clean_spaces=False)
    add("poro-chat", "poro", clean_spaces=False)
    add("bloom gpt3-finnish", "poro")
    add("viking", "viking", clean_spaces=False)
    add("tekken", "tekken", True, False)
    add("chameleon", "chameleon", clean_spaces=False)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", "gpt4o", clean_spaces=False)
    add("superbpe", "superbpe", clean_spaces=False)
    add("bailingmoe bailingmoe2 llada-moe", "bailingmoe", clean_spaces=False)
    add("seed-coder", "seed-coder", clean_spaces=False)
    add("exaone-moe", "exaone-moe")
    add("ufakzeka", "ufakzeka", clean_spaces=False)
    add("laguna", "laguna", clean_spaces=False)
    add("minicpm5", "minicpm5", True)
    add("jais-2", "jais2")
    return table


PRE_TYPES = _entries()
_ADD_BOS = frozenset(
    {
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "tekken",
        "chameleon",
    }
)
_compiled: dict[str, list[tuple[regex.Pattern, bool]]] = {}
# Non-ASCII White_Space -> U+000B, as llama.cpp feeds std::wregex (its `\s` is ASCII-only there).
_WIDE_WS = str.maketrans(
    {c: "\x0b" for c in "\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"}
    | {chr(c): "\x0b" for c in range(0x2000, 0x200B)}
)


def pre_tokenizer(pre: str) -> PreTokenizer:
    if not pre:
        log.warning(
            "tokenizer.ggml.pre is missing: using llama.cpp's 'default' pre-tokenizer "
            "(generation quality may be degraded; consider regenerating the model file)"
        )
        pre = "default"
    entry = PRE_TYPES.get(pre)
    if entry is None:
        raise ModelLoadError(
            f"unknown pre-tokenizer type {pre!r} (tokenizer.ggml.pre); supported: {', '.join(sorted(PRE_TYPES))}"
        )
    kind, ignore_merges, clean_spaces = entry
    return PreTokenizer(pre, kind, ignore_merges, clean_spaces, pre in _ADD_BOS)


class _DigitGroups:
    """superbpe's `(?=(\\d{3})+(?!\\d))` (ASCII digits) without the regex: an empty match where the rest of the digit
    run is a whole number of groups of three. The regex tries a lookahead to the run's end at every position, which
    is quadratic in the run's length; this finds each run once and steps back from its end by three."""

    _RUNS = regex.compile(r"[0-9]+")

    def finditer(self, text: str) -> Iterator["_Empty"]:
        for run in self._RUNS.finditer(text):
            start, end = run.span()
            first = start + (end - start) % 3  # the leftmost cut at or after start
            for at in range(first, end - 2, 3):
                yield _Empty(at)


@dataclass(frozen=True)
class _Empty:
    at: int

    def span(self) -> tuple[int, int]:
        return self.at, self.at


class _Jais2:
    """jais2's regex with its long blank runs cut without it. At each 512-blank chunk of a run the regex first tries
    `\\s*[\\r\\n]+`, a scan to the run's end that fails where no newline ends the run: quadratic in the run's length
    (17 s at 1 MB). In a run of blanks other than newlines, followed by neither a newline nor another blank, and at
    a point with more than 1024 of its blanks still ahead, no alternative before `\\s{512}(?!\\S)` can match, and
    that one takes the next 512: those chunks are cut here, the rest (and everything else) is the regex's. Its
    matches depend only on the text from their start on (no look-behind), and a run starts where a match ends, so the
    matches are the regex's own (tests/engine/tokenizer/test_pretokenize_growth.py compares them on random text)."""

    _RUNS = regex.compile(r"[^\S\r\n]{2048,}", regex.V0)
    CHUNK, KEEP = 512, 1024

    def __init__(self) -> None:
        self._pat = regex.compile(JAIS2, regex.V0)

    def finditer(self, text: str) -> Iterator:
        pos = 0
        for run in self._RUNS.finditer(text):
            start, end = run.span()
            if end < len(text) and text[end] in "\r\n":
                continue  # `\s*[\r\n]+` takes the run with its newline, in one linear match
            yield from self._pat.finditer(text, pos, start)  # the text before the run: its matches end at start
            at = start
            while end - at > self.KEEP:
                yield _Span(at, at + self.CHUNK)
                at += self.CHUNK
            pos = at
        yield from self._pat.finditer(text, pos)


@dataclass(frozen=True)
class _Span:
    start: int
    end: int

    def span(self) -> tuple[int, int]:
        return self.start, self.end


# regexes whose direct form is superlinear, by a linear splitter
_LINEAR = {r"(?=(\d{3})+(?!\d))": _DigitGroups, JAIS2: _Jais2}


def compiled(kind: str) -> list[tuple[regex.Pattern, bool]]:
    """The regex chain of a pre-tokenizer kind, each with whether it runs on the whitespace-substituted text."""
    pats = _compiled.get(kind)
    if pats is None:
        pats = []
        for entry in REGEXES[kind]:
            pattern, flags = entry if isinstance(entry, tuple) else (entry, 0)
            linear = _LINEAR.get(pattern)
            pats.append((linear() if linear else regex.compile(pattern, flags | regex.V0), "\\p{" not in pattern))
        _compiled[kind] = pats
    return pats


def split(text: str, patterns: list[tuple[regex.Pattern, bool]]) -> list[str]:
    """Apply the regex chain; every match and every gap between matches becomes its own fragment."""
    return list(iter_split(text, patterns))


def iter_split(text: str, patterns: list[tuple[regex.Pattern, bool]]) -> Iterator[str]:
    """`split`'s fragments one at a time: each pattern's pass reads the previous one's fragments as they come, so
    a caller that stops early (a prompt past the context) does not split the rest of a long text."""
    frags: Iterable[str] = (text,)
    for pat, wide in patterns:
        frags = _split_one(frags, pat, wide)
    return iter(frags)


def _split_one(frags: Iterable[str], pat: regex.Pattern, wide: bool) -> Iterator[str]:
    for frag in frags:
        pos = 0
        subject = frag.translate(_WIDE_WS) if wide else frag  # same length: offsets stay valid
        for m in pat.finditer(subject):
            start, end = m.span()
            if start > pos:
                yield frag[pos:start]
            if end > start:
                yield frag[start:end]
            pos = end  # an empty match still closes the gap before it
        if pos < len(frag):
            yield frag[pos:]
