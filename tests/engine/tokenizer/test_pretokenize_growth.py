"""Every pre-tokenizer is linear on adversarial text (issue 48, class 4): the time on 4x the input is compared with
the time on the input (a ratio, not an absolute time: linear is about 4, quadratic 16). superbpe's digit-group
regex was quadratic on a run of digits (10 s at 100 KB), jais2's on a run of spaces (17 s at 1 MB): both are now
split without the regex where it was."""

from __future__ import annotations

import random
import time

import pytest
import regex

from localrt.engine.tokenizer.pretokenize import JAIS2, REGEXES, _DigitGroups, _Jais2, _split_one, compiled, split

INPUTS = {
    "digits": lambda n: "1234567890" * (n // 10),
    "spaces": lambda n: " " * n + "x",
    "newlines": lambda n: "\n" * n + "x",
    "word": lambda n: "a" * n,
    "scripts": lambda n: ("abcПриветこんにちは漢字١٢٣" * (n // 20 + 1))[:n],
    "sentinels": lambda n: "<|x|>1" * (n // 6),
}


def _best(kind: str, text: str) -> float:
    pats = compiled(kind)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        split(text, pats)
        best = min(best, time.perf_counter() - t0)
    return best


KNOWN: set[tuple[str, str]] = set()  # (kind, input) pairs known to grow faster than linear: none left


def _ratio_ok(kind: str, name: str) -> tuple[bool, tuple]:
    small, large = _best(kind, INPUTS[name](8000)), _best(kind, INPUTS[name](32000))
    return large < 10 * small + 0.01, (kind, name, small, large)


@pytest.mark.parametrize("kind", sorted(REGEXES))
def test_linear_on_adversarial_text(kind):
    for name in INPUTS:
        if (kind, name) not in KNOWN:
            ok, seen = _ratio_ok(kind, name)
            assert ok, seen


def test_jais2_on_space_runs():
    # jais2's regex alone was quadratic here (12-16x for 4x the input: 17 s at 1 MB); the runs are now cut without it
    small, large = _best("jais2", INPUTS["spaces"](32000)), _best("jais2", INPUTS["spaces"](128000))
    assert large < 6 * small + 0.01, (small, large)


def test_jais2_long_blank_runs_split_as_the_regex_does():
    pat = regex.compile(JAIS2, regex.V0)
    rng = random.Random(0)
    blanks = [" ", " ", " ", "\t", "\x0b", "\xa0", "\u3000"]
    pieces = ["x", "ab", "7", "!", "'s", "\n", "\r\n", " \n", "é", ""]
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(pieces))
            n = rng.choice([rng.randint(2040, 3300), rng.randint(0, 40)])
            parts.append("".join(rng.choice(blanks) for _ in range(n)) if rng.random() < 0.3 else " " * n)
        parts.append(rng.choice(pieces))
        text = "".join(parts)
        assert list(_split_one([text], _Jais2(), False)) == list(_split_one([text], pat, False)), repr(text[:80])


def test_digit_groups_split_as_the_regex_does():
    pat = regex.compile(r"(?=(\d{3})+(?!\d))", regex.ASCII | regex.V0)
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("0123456789ab ٣²") for _ in range(rng.randint(0, 24)))
        assert list(_split_one([text], _DigitGroups(), True)) == list(_split_one([text], pat, True)), text
