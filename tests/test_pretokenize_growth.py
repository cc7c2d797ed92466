"""Every pre-tokenizer is linear on adversarial text (issue 48, class 4): the time on 4x the input is compared with
the time on the input (a ratio, not an absolute time: linear is about 4, quadratic 16). superbpe's digit-group
regex was quadratic on a run of digits (10 s at 100 KB) and is now split without the regex."""
from __future__ import annotations

import random
import time

import pytest
import regex

from localrt.engine.tokenizer.pretokenize import REGEXES, _DigitGroups, _split_one, compiled, split

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


# jais2 tries `\s*[\r\n]+` (a scan to the end of the run) before each of its 512-space chunks: quadratic on a long
# run of spaces (0.27 s at 128 KB, ~17 s at 1 MB). Not fixed yet; its own test below fails when it is.
KNOWN = {("jais2", "spaces")}


def _ratio_ok(kind: str, name: str) -> tuple[bool, tuple]:
    small, large = _best(kind, INPUTS[name](8000)), _best(kind, INPUTS[name](32000))
    return large < 10 * small + 0.01, (kind, name, small, large)


@pytest.mark.parametrize("kind", sorted(REGEXES))
def test_linear_on_adversarial_text(kind):
    for name in INPUTS:
        if (kind, name) not in KNOWN:
            ok, seen = _ratio_ok(kind, name)
            assert ok, seen


@pytest.mark.xfail(strict=True, reason="jais2 is quadratic on long runs of spaces (see KNOWN)")
def test_jais2_on_space_runs():
    # larger runs than above, where the quadratic term dominates clearly (about 12-16x for 4x the input)
    small, large = _best("jais2", INPUTS["spaces"](32000)), _best("jais2", INPUTS["spaces"](128000))
    assert large < 6 * small + 0.01, (small, large)


def test_digit_groups_split_as_the_regex_does():
    pat = regex.compile(r"(?=(\d{3})+(?!\d))", regex.ASCII | regex.V0)
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("0123456789ab ٣²") for _ in range(rng.randint(0, 24)))
        assert list(_split_one([text], _DigitGroups(), True)) == list(_split_one([text], pat, True)), text
