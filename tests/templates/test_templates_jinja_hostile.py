"""Hostile Jinja chat templates, round 2 (issue 12): values that amplify inside one operation are sized before they
are built, the work inside one filter is bounded (linear wordwrap and striptags, the deadline checked inside),
a refused render gives its memory back, and a template Python cannot compile is a TemplateError like any other.
The payloads are in tests/_jinja_payloads.py; one subprocess renders them all and reports its peak RSS."""

from __future__ import annotations

import gc
import html
import json
import random
import subprocess
import sys
import time

import pytest
from jinja2 import Environment
from jinja2.filters import do_wordwrap
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from _jinja_payloads import BOUNDED, HOSTILE, UNCOMPILABLE
from localrt.templates import JinjaLimits, JinjaTemplate, TemplateError, choose_template
from localrt.templates._jinja_budget import Budget
from localrt.templates._jinja_text import striptags, wordwrap
from _testpaths import TESTS

MSGS = {"messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("src", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_template_is_refused_quickly(src: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError):
        JinjaTemplate(src).render(MSGS)
    assert time.monotonic() - start < 8


@pytest.mark.parametrize("src", BOUNDED, ids=range(len(BOUNDED)))
def test_formerly_quadratic_filters_finish_quickly(src: str) -> None:
    start = time.monotonic()
    JinjaTemplate(src).render(MSGS)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("src", UNCOMPILABLE, ids=range(len(UNCOMPILABLE)))
def test_template_python_cannot_compile_is_a_template_error(src: str) -> None:
    with pytest.raises(TemplateError) as e:
        JinjaTemplate(src)
    assert e.value.kind == "jinja" and e.value.__cause__ is None and e.value.__context__ is None


def test_uncompilable_gguf_template_falls_back_to_the_builtin() -> None:
    meta = {"general.architecture": "qwen2", "tokenizer.chat_template": UNCOMPILABLE[0]}
    choice = choose_template(meta)
    assert choice.origin == "builtin:chatml" and "rejected" in choice.reason
    assert "<|im_start|>user" in choice.load().render([{"role": "user", "content": "hi"}])


# the ordinary uses of the guarded operations render exactly as in a plain sandbox
ORDINARY = [
    "{{ 'a b c d e'|wordwrap(3) }}",
    "{{ 'long-hyphenated-words here'|wordwrap(6) }}",
    "{{ '%s-%05d|%.2f|%-4s|%x'|format('x', 42, 3.14159, 'ab', 255) }}",
    "{{ '%s and %s' % ('a', 'b') }}",
    "{{ '%(a)s' % {'a': 1} }}",
    "{{ '{:>5}|{:.2f}|{!r}|{:,}|{:{w}}'.format('a', 3.14159, 'q', 1234567, 'z', w=4) }}",
    "{{ '{a}-{b}'.format_map({'a': 1, 'b': 2}) }}",
    "{{ 'a\nb\n\nc'|indent(2, true) }}",
    "{{ 'a\nb'|indent('> ') }}",
    "{{ [1, 2]|join(', ') }}",
    "{{ 'x'|center(9) }}|{{ 'ab'.ljust(4) }}|{{ '7'.zfill(3) }}",
    "{{ {'a': [1, 2]}|tojson(indent=2) }}",
    "{{ {'b': 1, 'a': 'é'}|tojson(sort_keys=true) }}",
    "{{ 'a' ~ [1, 'b'] ~ none ~ 1.5 }}",
    "{{ 'hello'[1:3] }}{{ messages[-1:] }}{{ 'abc'[::-1] }}",
    "{{ 'Hi <b>x</b> <!-- c --> &amp; y'|striptags }}",
    "{{ ('ab' * 3).replace('a', 'xy') }}",
    "{{ ('ab' * 3)|replace('b', 'c', 2) }}",
    "{{ 'a,b'.split(',') }}{{ ' a  b '.split() }}{{ 'a\nb'.splitlines() }}",
    "{{ 'hello world-wide (x)'|title }}{{ 'MiXed'|lower }}{{ 'x'|upper }}",
    "{{ [3, 1, 2]|sort|list }}",
    "{{ range(3)|map('string')|join }}",
    "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) }}{{ m('y') }}",
    "{{ [1, 2, 3]|batch(2, 0)|list }}{{ [1, 2, 3]|slice(2)|list }}",
    "{{ '<a&b>'|e }}{{ 'a b'|urlencode }}",
    "{{ [[1], [2]]|sum(start=[]) }}{{ [1, 2]|sum }}",
    "{{ {'a': 1}|pprint }}{{ 'x'|string }}{{ 'ab  '|trim }}",
    "{{ 'foo bar baz'|truncate(9) }}{{ 'a b c'|wordcount }}",
    "{{ {'id': 'x', 'n': none}|xmlattr }}",
    "{{ 'a\tb'.expandtabs(4) }}{{ 'é'.encode() }}{{ 'abc'.translate({97: 'xy'}) }}",
    "{{ 'ab'.partition('a') }}",
    "{% set x %}[{{ 'a' * 3 }}]{% endset %}{{ x }}{% filter upper %}b{{ 'c' }}{% endfilter %}",
    "{% for m in messages %}{{ m.role + ':' + m['content'] }}{% endfor %}{{ messages|length }}",
    "{{ (1).to_bytes(2, 'big') }}{{ 2 ** 10 }}{{ 7 // 2 }}{{ [0] * 3 }}{{ (1, 2) + (3,) }}",
]


def _reference_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        v, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env


@pytest.mark.parametrize("src", ORDINARY, ids=range(len(ORDINARY)))
def test_ordinary_uses_render_as_in_a_plain_sandbox(src: str) -> None:
    assert JinjaTemplate(src).render(MSGS) == _reference_env().from_string(src).render(**MSGS)


def test_wordwrap_matches_jinja_on_random_text() -> None:
    env, rnd = Environment(), random.Random(7)
    for _ in range(3000):
        s = "".join(
            rnd.choice(rnd.choice(["ab -", "a- \t", "ab\u3000 -\n", "a-b c--d \n\r"]))
            for _ in range(rnd.randint(0, 50))
        )
        w, blw, boh, ws = rnd.randint(1, 10), rnd.random() < 0.8, rnd.random() < 0.7, rnd.choice(["\n", "<>"])
        assert wordwrap(s, w, blw, ws, boh, Budget(JinjaLimits())) == do_wordwrap(env, s, w, blw, ws, boh), (s, w)


def _striptags_spec(value: str) -> str:
    """What `striptags` promises, written the obvious (quadratic) way: remove the first `<!--` ... `-->` and
    search again from the start until none is complete; then the same for `<` ... `>`; collapse whitespace;
    unescape entities. This is markupsafe's own loop up to 3.0.3; 3.0.4 scans once instead, which differs only
    where a `<` is never closed."""
    while (start := value.find("<!--")) != -1 and (end := value.find("-->", start)) != -1:
        value = value[:start] + value[end + 3 :]
    while (start := value.find("<")) != -1 and (end := value.find(">", start)) != -1:
        value = value[:start] + value[end + 1 :]
    return html.unescape(" ".join(value.split()))


def test_striptags_keeps_its_promise_on_random_text() -> None:
    rnd = random.Random(7)
    for _ in range(20000):
        s = "".join(rnd.choice("<!->a &amp;") for _ in range(rnd.randint(0, 30)))
        assert striptags(s, Budget(JinjaLimits())) == _striptags_spec(s), s


def test_striptags_matches_markupsafe_on_well_formed_markup() -> None:
    """Where every `<` is closed, every markupsafe version strips alike: so does ours, whichever is installed."""
    rnd = random.Random(7)
    pieces = [
        "a",
        " ",
        "\n\t",
        "&amp;",
        "&lt;",
        "-",
        ">",
        "!",
        "<b>",
        "</b>",
        "<a href='x'>",
        "<!-- c -->",
        "<!-- <x> -->",
        "<!---->",
        "<br/>",
    ]
    for _ in range(5000):
        s = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 20)))
        assert striptags(s, Budget(JinjaLimits())) == Markup(s).striptags() == _striptags_spec(s), s


def test_deadline_is_checked_inside_one_filter() -> None:
    """A wordwrap that is within the size caps but slow stops at the deadline, not after the filter."""
    t = JinjaTemplate("{{ ('a' * 400000)|wordwrap(1) }}")
    start = time.monotonic()
    with pytest.raises(TemplateError, match="exceeds 0.2 s"):
        t.render({}, JinjaLimits(timeout_s=0.2, max_steps=10**9, max_built=10**9))
    assert time.monotonic() - start < 1.5


@pytest.mark.parametrize("fail", ["{{ raise_exception('no') }}", "{{ 1/0 }}", "{{ a.foo() }}", "{{ a * 100000000 }}"])
def test_a_refused_render_leaves_no_cycles_behind(fail: str) -> None:
    """What a failed render built is freed by reference counting when the error is raised: no cycle waits for
    the collector (a full collection of a daemon's heap stalls every request for seconds)."""
    t = JinjaTemplate("{% for i in range(3) %}{% set a = 'x' * 100000 %}{% endfor %}{% set a = 'y' * 100000 %}" + fail)
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(TemplateError):
            t.render({})
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_total_allowance_counts_values_that_are_dropped() -> None:
    """Values bound in a loop are each under the cap; together they are not (the allowance is never given back)."""
    t = JinjaTemplate("{% for i in range(100) %}{% set x = 'a' * 1000 %}{% endfor %}ok")
    assert t.render({}, JinjaLimits(max_output=2000, max_built=200_000)) == "ok"
    with pytest.raises(TemplateError, match="in all"):
        t.render({}, JinjaLimits(max_output=2000, max_built=50_000))


_MEASURE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from _jinja_payloads import BOUNDED, HOSTILE, UNCOMPILABLE
from localrt.templates import JinjaTemplate, TemplateError

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

def hwm():  # this process's own peak (ru_maxrss would carry the parent's over fork + exec)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

refused, start = 0, time.monotonic()
for src in HOSTILE + UNCOMPILABLE:
    try:
        JinjaTemplate(src).render({"messages": [{"role": "user", "content": "x"}]})
    except TemplateError:
        refused += 1
for src in BOUNDED:
    JinjaTemplate(src).render({})
base = rss()
keep = "{% set a = 'x' * 8000000 %}" + "".join("{%% set b%d = a[%d:] %%}" % (i, i) for i in range(6))
for _ in range(5):  # builds ~56 MB, then fails: nothing of it may stay behind
    try:
        JinjaTemplate(keep + "{{ raise_exception('no') }}").render({})
    except TemplateError:
        refused += 1
print(json.dumps({"cases": len(HOSTILE) + len(UNCOMPILABLE) + 5, "refused": refused, "bounded": len(BOUNDED),
                  "peak_rss": hwm(),
                  "growth": rss() - base, "seconds": time.monotonic() - start}))
"""


def test_peak_rss_across_all_template_cases() -> None:
    """Every case in one fresh process: all refused, the peak RSS stays small (before: 1.5-3 GB for single
    payloads, 9.5 GB after 5 chats), and five refused renders that each built ~56 MB leave nothing behind."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(TESTS)], capture_output=True, text=True, timeout=300, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\njinja hostile cases: {got}")
    assert got["refused"] == got["cases"]
    assert got["peak_rss"] < 400 << 20, got
    assert got["growth"] < 40 << 20, got
