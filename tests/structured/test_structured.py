"""Schema -> automaton: accepted documents, random documents validated by jsonschema, typed errors and
bounds on hostile schemas. No model needed (token masks: test_structured_masks.py)."""

from __future__ import annotations

import json
import random
import time

import jsonschema
import pytest

from localrt.errors import InvalidRequest
from localrt.structured import PatternError, SchemaError, SchemaTooComplex, UnsupportedSchema, compile_dfa

from _structured_helpers import accepts, random_document

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
}

SCHEMAS = [
    PERSON,
    {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "b": {"type": ["string", "null"], "minLength": 2},
            "c": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/P"}]},
        },
        "required": ["c"],
        "$defs": {
            "P": {
                "type": "object",
                "properties": {"x": {"const": [1, "é"]}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "alt": {"type": "string", "pattern": "^(ab+c|x[yz]?)"},
            "q": {"type": "string", "pattern": '^[^"\\\\]x.\\.$'},
            "esc": {"type": "string", "pattern": '^["\\\\\\n]{1,3}$'},
        },
        "required": ["code", "alt", "q", "esc"],
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {
        "type": "object",
        "properties": {
            "l": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object"}},
            "m": {},
            "n": {"type": "array"},
        },
        "required": ["l", "m", "n"],
    },
    {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "minItems": 1},
    {
        "type": "object",
        "properties": {"e": {"enum": ["x", 1, None, True, {"k": [1]}]}, "s": {"type": "string"}},
        "required": ["e", "s"],
        "additionalProperties": False,
        "title": "T",
        "description": "annotations are fine",
    },
    {"type": "integer"},
    {
        "type": "object",
        "properties": {f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid")},
        "required": ["date", "time", "date-time", "uuid"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_random_documents_validate(schema):
    d = compile_dfa(schema)
    rng = random.Random(1)
    for _ in range(100):
        doc = random_document(d, rng)
        jsonschema.validate(json.loads(doc.decode("utf-8")), schema)


def test_json_format_is_any_object():
    d = compile_dfa("json")
    good = [
        b"{}",
        b'{"a":1}',
        b'{"a": [1, {"b": null}], "c": "x\\u00e9"}',
        '{"é": "ü"}'.encode(),
        b'{\n  "a": [[[[[[[[[[[]]]]]]]]]]]\n}\n',
        b'{"n": -0.5e+10, "t": true, "f": false}',
    ]
    bad = [
        b"[]",
        b'"x"',
        b"1",
        b'{"a":}',
        b'{"a":1,}',
        b'{"a":[1}',
        b'{"a":"\\ud800"}',
        b'{"a":"\x01"}',
        b'{"a":01}',
        b'{"a":1.}',
        b"{\xff}",
        b'{"a":"\xc3"}',
        b"  {}",
    ]
    assert all(accepts(d, x) for x in good)
    assert not any(accepts(d, x) for x in bad)
    rng = random.Random(2)
    for _ in range(200):
        assert isinstance(json.loads(random_document(d, rng).decode("utf-8")), dict)


def test_exact_language_examples():
    d = compile_dfa(PERSON)
    assert accepts(d, b'{"name": "Al", "age": 3}')
    assert accepts(d, b'{"name":"Al","age":3,"tags":["a","b"]}')
    assert not accepts(d, b'{"age": 3, "name": "Al"}')  # declared order only
    assert not accepts(d, b'{"name": "Al"}')  # required
    assert not accepts(d, b'{"name": "Al", "age": 3.5}')
    assert not accepts(d, b'{"name": "Al", "age": 3, "tags": ["a","b","a","b"]}')  # maxItems
    assert not accepts(d, b'{"name": "' + b"x" * 21 + b'", "age": 3}')  # maxLength
    assert not accepts(d, b'{"name": "Al", "age": 3, "zip": 1}')  # no extra properties generated
    opt = compile_dfa({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}})
    assert all(accepts(opt, x) for x in [b"{}", b'{"a":null}', b'{"b":null}', b'{"a":null,"b":null}'])
    assert not accepts(opt, b'{,"b":null}') and not accepts(opt, b'{"a":null,}')


def test_whitespace_is_bounded():
    d = compile_dfa({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})
    assert accepts(d, b'{\n\t\t"a" : true }')
    assert not accepts(d, b"{" + b" " * 2 + b'"a":true}')  # one space at most, or a newline + indent
    assert not accepts(d, b"{\n" + b" " * 21 + b'"a":true}')


def test_string_lengths_count_characters():
    d = compile_dfa({"type": "string", "minLength": 2, "maxLength": 2})
    assert accepts(d, '"éü"'.encode()) and accepts(d, b'"\\n\\u00e9"')
    assert not accepts(d, '"é"'.encode()) and not accepts(d, b'"abc"')


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}}, "multipleOf"),
        ({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}]}}}, "oneOf"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"type": "string", "format": "email"}, "format"),
        ({"type": "string", "format": "date", "maxLength": 3}, "format"),
        ({"type": "array", "prefixItems": [{}]}, "prefixItems"),
        ({"type": "object", "not": {}}, "not"),
        ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "allOf"),
        ({"$ref": "http://example.com/s.json"}, "$ref"),
        ({"anyOf": [{"type": "string"}], "type": "string"}, "type"),
    ],
)
def test_unsupported_keywords_are_named(schema, keyword):
    with pytest.raises(UnsupportedSchema) as e:
        compile_dfa(schema)
    assert keyword in str(e.value) and isinstance(e.value, InvalidRequest)


@pytest.mark.parametrize(
    "fmt",
    [
        "yaml",
        5,
        ["json"],
        {"type": "nope"},
        {"type": "string", "minLength": -1},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
        {"enum": [1, 2], "type": "string"},
    ],
)
def test_invalid_formats(fmt):
    with pytest.raises(SchemaError):
        compile_dfa(fmt)


BOMBS = [
    ({"type": "string", "pattern": "(" * 60000 + "a" + ")" * 60000}, PatternError),
    ({"type": "string", "pattern": "a" * 5000}, PatternError),
    ({"type": "string", "pattern": "^+x$"}, PatternError),
    ({"type": "string", "pattern": "(?<=x)*"}, PatternError),
    ({"type": "string", "pattern": "(a)\\1"}, PatternError),
    ({"type": "string", "pattern": "a{5000}"}, PatternError),
    ({"type": "string", "pattern": "[z-a]"}, PatternError),
    ({"type": "string", "maxLength": 100000}, SchemaTooComplex),
    ({"enum": list(range(100000))}, SchemaTooComplex),
    (
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}}},
        SchemaError,
    ),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}, SchemaError),
    ({"$ref": "#/$defs/missing"}, SchemaError),
    (
        {
            "type": "array",
            "minItems": 40,
            "items": {"type": "array", "minItems": 40, "items": {"type": "string", "maxLength": 40}},
        },
        SchemaTooComplex,
    ),
]


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def _ref_fanout(levels: int) -> dict:
    defs = {f"d{i}": {"type": "array", "prefixItems": []} for i in range(0)}
    for i in range(levels):
        defs[f"d{i}"] = {
            "type": "object",
            "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}, "y": {"$ref": f"#/$defs/d{i + 1}"}},
        }
    defs[f"d{levels}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


@pytest.mark.parametrize(
    "schema, error",
    BOMBS
    + [(_nested(200), SchemaTooComplex), (_ref_chain(500), SchemaTooComplex), (_ref_fanout(30), SchemaTooComplex)],
)
def test_bombs_rejected_in_bounded_time(schema, error):
    t0 = time.monotonic()
    with pytest.raises(error):
        compile_dfa(schema)
    assert time.monotonic() - t0 < 30


def test_nesting_within_bounds_compiles():
    d = compile_dfa(_nested(40))
    doc = b'{"a":' * 40 + b"7" + b"}" * 40
    assert accepts(d, doc)


def test_string_formats_generate_checked_values():
    schema = SCHEMAS[-1]
    d = compile_dfa(schema)
    rng = random.Random(5)
    for _ in range(30):
        jsonschema.validate(
            json.loads(random_document(d, rng)), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )


@pytest.mark.parametrize("lo, hi", [(7, 123), (0, 9), (-15, 4), (-130, -7), (19, 21), (0, 0), (995, 1003), (-1, 1)])
def test_integer_ranges_exact(lo, hi):
    d = compile_dfa({"type": "integer", "minimum": lo, "maximum": hi})
    for v in range(lo - 30, hi + 31):
        assert accepts(d, str(v).encode()) == (lo <= v <= hi), v
    assert not accepts(d, b"-0") and not accepts(d, b"007")


def test_exclusive_and_float_bounds():
    d = compile_dfa({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 5.5})
    assert [v for v in range(-3, 9) if accepts(d, str(v).encode())] == [3, 4, 5]
    n = {"type": "number", "minimum": -2, "maximum": 3}
    dn = compile_dfa(n)
    assert accepts(dn, b"2.75") and accepts(dn, b"-2") and accepts(dn, b"3")
    assert not accepts(dn, b"3.5") and not accepts(dn, b"-3") and not accepts(dn, b"4")
    rng = random.Random(3)
    for _ in range(100):
        jsonschema.validate(json.loads(random_document(dn, rng)), n)
    with pytest.raises(SchemaError):
        compile_dfa({"type": "integer", "minimum": 5, "maximum": 4})
    with pytest.raises(SchemaError):
        compile_dfa({"type": "integer", "minimum": 1e20})


def test_large_realistic_schema_compiles():
    props = {}
    for i in range(60):
        props[f"p{i}"] = (
            {"type": "string", "maxLength": 50}
            if i % 3 == 0
            else {"enum": [f"v{j}" for j in range(20)]}
            if i % 3 == 1
            else {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1000}, "maxItems": 5}
        )
    schema = {"type": "object", "properties": props, "required": list(props)[::2]}
    d = compile_dfa(schema)
    rng = random.Random(4)
    for _ in range(5):
        jsonschema.validate(json.loads(random_document(d, rng, soft_limit=2000)), schema)


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    """Small random patterns; groups get only bounded quantifiers and no wide classes, so that the DFA stays
    small (nested unbounded repeats of `.` are the classic subset-construction blow-up, rejected by bound)."""
    wide = ["\\w", "\\s", ".", "[^ab]", "[^\\d]"]
    narrow = ["a", "b", "\\d", "[a-c]", "[\\d_x]", "é", '"', "\\\\", "\\.", "\\n"]
    parts = []
    for _ in range(rng.randint(1, 3)):
        if depth == 0 and rng.random() < 0.3:
            group = "|".join(_random_pattern(rng, 1) for _ in range(rng.randint(1, 2)))
            parts.append("(" + group + ")" + rng.choice(["", "?", "{2}", "{0,2}"]))
        else:
            atom = rng.choice(narrow + (wide if depth == 0 else []))
            parts.append(atom + rng.choice(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}"]))
    return "".join(parts)


def test_random_patterns_match_python_re():
    """Strings generated for a pattern always satisfy re.search, as jsonschema checks them."""
    import re

    rng = random.Random(7)
    for _ in range(30):
        body = _random_pattern(rng)
        pattern = rng.choice(["^{}$", "^{}", "{}$", "{}"]).format(body)
        schema = {"type": "string", "pattern": pattern}
        d = compile_dfa(schema)
        for _ in range(10):
            value = json.loads(random_document(d, rng, soft_limit=60))
            assert re.search(pattern, value), (pattern, value)
