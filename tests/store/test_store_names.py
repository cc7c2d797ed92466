"""Model-name and digest grammar (ollama_spec 9.4), including the hostile inputs of pain_points 8.16."""

from __future__ import annotations

import pytest

import store
from store import digest as dg
from store import names

HEX = "a" * 64


@pytest.mark.parametrize(
    "text, parts, display",
    [
        ("llama3", ("registry.ollama.ai", "library", "llama3", "latest"), "llama3:latest"),
        ("llama3:8b", ("registry.ollama.ai", "library", "llama3", "8b"), "llama3:8b"),
        ("user/m", ("registry.ollama.ai", "user", "m", "latest"), "user/m:latest"),
        ("example.com/ns/m:t", ("example.com", "ns", "m", "t"), "example.com/ns/m:t"),
        ("localhost:5000/ns/m", ("localhost:5000", "ns", "m", "latest"), "localhost:5000/ns/m:latest"),
        ("localhost:5000/ns/m:v1.2", ("localhost:5000", "ns", "m", "v1.2"), "localhost:5000/ns/m:v1.2"),
        ("https://example.com/ns/m:t", ("example.com", "ns", "m", "t"), "example.com/ns/m:t"),
        ("http://example.com/ns/m", ("example.com", "ns", "m", "latest"), "example.com/ns/m:latest"),
        ("registry.ollama.ai/library/x:y", ("registry.ollama.ai", "library", "x", "y"), "x:y"),
        (
            "Registry.Ollama.AI/Library/Mistral:Latest",
            ("Registry.Ollama.AI", "Library", "Mistral", "Latest"),
            "Mistral:Latest",
        ),
        ("_m-1.2_x:_T-1.0", ("registry.ollama.ai", "library", "_m-1.2_x", "_T-1.0"), "_m-1.2_x:_T-1.0"),
        ("m" * 80, ("registry.ollama.ai", "library", "m" * 80, "latest"), "m" * 80 + ":latest"),
    ],
)
def test_parse_valid(text, parts, display):
    n = names.parse(text)
    assert n.path_parts == parts
    assert n.display == display


@pytest.mark.parametrize(
    "text",
    [
        "",
        ":",
        ":tag",
        "m:",
        "/m",
        "ns/",
        "a//b",
        "a/b/c/d",
        "../x",
        "..",
        "a/../b",
        "./m",
        "m/..",
        "/etc/passwd",
        "C:\\Windows\\x",
        "a\\b",
        "%2e%2e/x",
        "%2e%2e%2fx",
        "m\x00x",
        "m\n",
        " m",
        "m ",
        "CON",
        "con:latest",
        "ns/NUL",
        "aux.txt",
        "com1",
        "LPT9:x",
        "m@sha256:" + HEX,
        "m+q4",
        "ns.x/m",
        "-m",
        ".m",
        "m:.t",
        "m:-t",
        "m" * 81,
        "m:" + "t" * 81,
        "n" * 81 + "/m",
        "h" * 351 + "/n/m",
        "C:/w/m",
        "c:1/n/m",
        "h:x/n/m",
        "h:1:2/n/m",
        "a..b",
        "m:t..u",
        "m/é",
        "mé",
        "m;rm",
        "m*",
        "m?",
        "m#1",
        "x" * 5000,
    ],
)
def test_parse_hostile_or_invalid(text):
    with pytest.raises(store.InvalidName):
        names.parse(text)
    assert not names.is_valid(text)


def test_invalid_name_is_value_error_and_says_which_part():
    with pytest.raises(ValueError, match="namespace"):
        names.parse("%2e%2e/x")


def test_non_string_name():
    with pytest.raises(store.InvalidName):
        names.parse(None)  # type: ignore[arg-type]


def test_case_insensitive_identity():
    a, b = names.parse("Mistral:Latest"), names.parse("mistral")
    assert a.equal_fold(b) and a.key == b.key
    assert a != b  # case is preserved


def test_from_path_parts_rejects_strays():
    assert names.from_path_parts(("registry.ollama.ai", "library", "m", "latest")).display == "m:latest"
    for parts in [("h", "n", "m"), ("h", "n", "m", ".tmp-123"), ("h", "n", "..", "t")]:
        with pytest.raises(store.InvalidName):
            names.from_path_parts(parts)


@pytest.mark.parametrize(
    "d",
    [
        "",
        "sha256:",
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "sha256:" + "A" * 64,
        "SHA256:" + HEX,
        "sha512:" + HEX,
        "sha256-" + HEX,
        "sha256:" + "g" * 64,
        "sha256:../../etc/passwd",
        "../" + HEX,
        "sha256:" + HEX + "\x00",
        "sha256:" + HEX + "/",
        " sha256:" + HEX,
        None,
        123,
    ],
)
def test_digest_validate_rejects(d):
    with pytest.raises(store.InvalidDigest):
        dg.validate(d)


def test_digest_forms():
    assert dg.validate("sha256:" + HEX) == "sha256:" + HEX
    assert dg.normalize("sha256-" + HEX) == "sha256:" + HEX
    assert dg.to_filename("sha256:" + HEX) == "sha256-" + HEX
    assert dg.from_filename("sha256-" + HEX) == "sha256:" + HEX
    for stray in ["sha256:" + HEX, "sha256-" + HEX + "-partial", ".tmp-x.partial", "sha256-" + "A" * 64]:
        assert dg.from_filename(stray) is None
    with pytest.raises(store.InvalidDigest):
        dg.normalize("sha256-" + "A" * 64)


def test_digest_of_bytes_matches_hashlib():
    import hashlib

    assert dg.of_bytes(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


def test_display_and_full_round_trip_property():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as s

    first = "abcXYZ019_"
    part = (
        s.text(alphabet=first, min_size=1, max_size=3)
        .flatmap(lambda a: s.text(alphabet=first + "-.", max_size=12).map(lambda b: a + b))
        .filter(lambda p: ".." not in p and names.is_valid(p))
    )
    ns = part.filter(lambda p: "." not in p)

    @hypothesis.given(part, ns, part, part)
    @hypothesis.settings(max_examples=300, deadline=None)
    def check(host, namespace, model, tag):
        try:
            n = names.parse(f"{host}/{namespace}/{model}:{tag}")
        except store.InvalidName:
            return  # e.g. a Windows device name or a drive-like host: refused, never mis-parsed
        assert n.path_parts == (host, namespace, model, tag)
        assert names.parse(n.display) == n and names.parse(n.full) == n

    check()
