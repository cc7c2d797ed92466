"""JSON schema (or "json") -> byte NFA of the documents that match it.

The automaton generates a subset of what the schema accepts, chosen so that every document it finishes
validates: properties come in the order the schema declares them; properties not listed in `properties`
are never generated (additionalProperties with a schema is honoured only when `properties` is empty);
numbers have at most 16 integer and 16 fraction digits, and bounded numbers (minimum/maximum)
are integers in range or non-negative decimals without exponent; string formats date, time, date-time and
uuid are generated through fixed patterns; whitespace is bounded (grammar.ws).
Annotation keywords are ignored; every other keyword outside SUPPORTED raises UnsupportedSchema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from . import grammar as g
from . import numbers as num
from .errors import SchemaError, SchemaTooComplex, UnsupportedSchema
from .nfa import NFA
from .regex import compile_pattern, parse_pattern

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$schema",
        "$id",
        "$comment",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
    }
)
SUPPORTED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "allOf",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "$ref",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# String `format`s generated through a pattern of the subset (JSON Schema treats format as an annotation by
# default, so the stricter pattern only narrows what is generated).
_DATE = r"[1-9][0-9]{3}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {  # dates without Feb 29 and years from 1000: a subset that every date checker accepts
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
}
MAX_SCHEMA_DEPTH = 64  # nesting of schema objects, $ref expansions included
MAX_JSON_DEPTH = 128  # raw nesting of the format document before any validation
MAX_ENUM = 4096
MAX_COUNT = 4096  # minLength / maxLength / minItems / maxItems above this are refused, not approximated
MAX_STATES = 50_000


@dataclass(frozen=True)
class Framed:
    """A schema's documents between fixed text: how a forced tool call looks in a model's own output format
    (e.g. `<tool_call>\n` + the call object + `\n</tool_call>`). Internal: never an Ollama `format` value."""

    prefix: str
    schema_json: str  # the schema as JSON, its key order kept (hashable, and the cache key)
    suffix: str
    blanks: bool = False  # whitespace (grammar.ws) may follow the prefix and precede the suffix

    @classmethod
    def of(cls, prefix: str, schema: dict, suffix: str, blanks: bool = False) -> "Framed":
        return cls(prefix, json.dumps(schema), suffix, blanks)  # key order kept: properties come in that order


def build_nfa(fmt: Any) -> NFA:
    """NFA for `format`: "json" (any JSON object, as Ollama's json grammar roots at an object), a schema, or a
    Framed schema."""
    nfa = NFA(MAX_STATES)
    start = nfa.new()
    if isinstance(fmt, Framed):
        schema = json.loads(fmt.schema_json)
        check_schema(schema)
        head = nfa.lit(start, fmt.prefix.encode())
        body = _Builder(nfa, schema).value(schema, g.ws(nfa, head) if fmt.blanks else head, "#", 0)
        nfa.final = nfa.lit(g.ws(nfa, body) if fmt.blanks else body, fmt.suffix.encode())
        return nfa
    if fmt == "json":
        end = _Builder(nfa, {}).free.value(start, containers="{", scalars=False)
    elif isinstance(fmt, dict):
        check_schema(fmt)
        end = _Builder(nfa, fmt).value(fmt, start, "#", 0)
    else:
        raise SchemaError(f'invalid format: {json.dumps(fmt)[:100]}; expected "json" or a valid JSON Schema object')
    nfa.final = g.final_ws(nfa, end)
    return nfa


def check_schema(schema: dict) -> None:
    _check_depth(schema)
    _check_patterns(schema)  # before jsonschema, whose own check compiles patterns with Python's re
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SchemaError(f"invalid JSON schema in format: {e.message}") from None
    except RecursionError:
        raise SchemaTooComplex("the schema is nested too deeply to check") from None


def _check_patterns(doc: Any) -> None:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                parse_pattern(node["pattern"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _check_depth(doc: Any) -> None:
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise SchemaTooComplex(f"the schema is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


class _Builder:
    def __init__(self, nfa: NFA, root: dict) -> None:
        self.nfa = nfa
        self.root = root
        self._free: g.FreeJSON | None = None
        self.active_refs: list[str] = []

    @property
    def free(self) -> g.FreeJSON:
        if self._free is None:
            self._free = g.FreeJSON(self.nfa)
        return self._free

    def value(self, schema: Any, s: int, where: str, depth: int) -> int:
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaTooComplex(f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels at {where}")
        if schema is True or schema == {}:
            return self.free.value(s)
        if schema is False:
            raise SchemaError(f"schema at {where} is false: no value matches it")
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {where} must be an object or a boolean")
        for key in schema:
            if key not in SUPPORTED and key not in ANNOTATIONS:
                raise UnsupportedSchema(key, where)
        keys = set(schema) - ANNOTATIONS
        if "enum" in keys or "const" in keys:
            return self.literals(schema, s, where)
        if "$ref" in keys:
            self._only(schema, "$ref", where)
            return self.ref(schema["$ref"], s, where, depth)
        if "allOf" in keys:
            self._only(schema, "allOf", where)
            if len(schema["allOf"]) != 1:
                raise UnsupportedSchema("allOf", where, "only a single-schema allOf is supported")
            return self.value(schema["allOf"][0], s, f"{where}/allOf/0", depth + 1)
        if "anyOf" in keys:
            self._only(schema, "anyOf", where)
            alts = schema["anyOf"]
            return self.nfa.alt(
                s, [lambda t, i=i, a=a: self.value(a, t, f"{where}/anyOf/{i}", depth + 1) for i, a in enumerate(alts)]
            )
        types = schema.get("type")
        if types is None:
            types = [_infer_type(keys)] if _infer_type(keys) else None
        if types is None:
            return self.free.value(s)
        if isinstance(types, str):
            types = [types]
        return self.nfa.alt(s, [lambda t, k=k: self.typed(k, schema, t, where, depth) for k in dict.fromkeys(types)])

    def _only(self, schema: dict, key: str, where: str) -> None:
        others = sorted(set(schema) - ANNOTATIONS - {key})
        if others:
            raise UnsupportedSchema(others[0], where, f"cannot be combined with {key!r}")

    def typed(self, kind: str, schema: dict, s: int, where: str, depth: int) -> int:
        nfa = self.nfa
        if kind == "string":
            return self.string(schema, s, where)
        bounded = any(k in schema for k in _BOUNDS)
        if kind == "integer":
            return num.int_range(nfa, s, *num.integer_bounds(schema, where)) if bounded else g.integer(nfa, s)
        if kind == "number":
            return num.bounded_number(nfa, s, schema, where) if bounded else g.number(nfa, s)
        if kind == "boolean":
            return nfa.alt(s, [lambda t: nfa.lit(t, b"true"), lambda t: nfa.lit(t, b"false")])
        if kind == "null":
            return nfa.lit(s, b"null")
        if kind == "array":
            return self.array(schema, s, where, depth)
        return self.object(schema, s, where, depth)

    def string(self, schema: dict, s: int, where: str) -> int:
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if "format" in schema:
            if schema["format"] not in FORMATS:
                raise UnsupportedSchema("format", where, f"format {schema['format']!r} is not one of {sorted(FORMATS)}")
            if schema.keys() & {"pattern", "minLength", "maxLength"}:
                raise UnsupportedSchema("format", where, "format together with pattern/minLength/maxLength")
            q = compile_pattern(self.nfa, self.nfa.lit(s, b'"'), FORMATS[schema["format"]])
            return self.nfa.lit(q, b'"')
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise UnsupportedSchema("pattern", where, "pattern together with minLength/maxLength")
            q = compile_pattern(self.nfa, self.nfa.lit(s, b'"'), schema["pattern"])
            return self.nfa.lit(q, b'"')
        if hi is not None and hi < lo:
            raise SchemaError(f"maxLength below minLength at {where}")
        _check_count(schema, ("minLength", "maxLength"), where)
        return g.string(self.nfa, s, lo, hi)

    def array(self, schema: dict, s: int, where: str, depth: int) -> int:
        nfa = self.nfa
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        if hi is not None and hi < lo:
            raise SchemaError(f"maxItems below minItems at {where}")
        _check_count(schema, ("minItems", "maxItems"), where)
        items = schema.get("items", True)

        def item(t: int) -> int:
            return self.value(items, t, f"{where}/items", depth + 1)

        if items in (True, {}) and lo == 0 and hi is None:
            return self.free.value(s, containers="[", scalars=False)
        first = g.ws(nfa, nfa.lit(s, b"["))
        end = nfa.new()
        if lo == 0:
            nfa.byte(first, 0x5D, 0x5D, end)
        cur = first
        for i in range(1, (hi if hi is not None else max(lo, 1)) + 1):
            start = cur if i == 1 else g.ws(nfa, nfa.lit(cur, b","))
            cur = g.ws(nfa, item(start))
            if i >= lo:
                nfa.byte(cur, 0x5D, 0x5D, end)
        if hi is None:
            nfa.link(g.ws(nfa, item(g.ws(nfa, nfa.lit(cur, b",")))), cur)
        return end

    def object(self, schema: dict, s: int, where: str, depth: int) -> int:
        nfa = self.nfa
        props = schema.get("properties", {})
        required = list(schema.get("required", []))
        extra = schema.get("additionalProperties", True)
        for name in required:
            if name not in props:
                raise UnsupportedSchema("required", where, f"required property {name!r} is not in properties")
        if not props and extra is not False:
            if extra in (True, {}):
                return self.free.value(s, containers="{", scalars=False)
            return self.map_object(extra, s, where, depth)
        first = g.ws(nfa, nfa.lit(s, b"{"))
        empty, filled = first, None  # lanes: no property written yet / at least one written
        for name, sub in props.items():
            kv = nfa.new()
            if empty is not None:
                nfa.link(empty, kv)
            if filled is not None:
                nfa.link(g.ws(nfa, nfa.lit(filled, b",")), kv)
            q = g.ws(nfa, nfa.lit(g.ws(nfa, nfa.lit(kv, _json_bytes(name))), b":"))
            done = g.ws(nfa, self.value(sub, q, f"{where}/properties/{name}", depth + 1))
            if name in required:
                empty = None
            elif filled is not None:
                nfa.link(filled, done)  # skip this optional property
            filled = done
        end = nfa.new()
        for lane in (empty, filled):
            if lane is not None:
                nfa.byte(lane, 0x7D, 0x7D, end)
        return end

    def map_object(self, values: Any, s: int, where: str, depth: int) -> int:
        """{"k": v, ...} with any keys and every value matching `values`."""
        nfa = self.nfa
        first = g.ws(nfa, nfa.lit(s, b"{"))
        end = nfa.new()
        nfa.byte(first, 0x7D, 0x7D, end)
        key = nfa.new()
        nfa.link(first, key)
        q = g.ws(nfa, nfa.lit(g.ws(nfa, g.string(nfa, key)), b":"))
        after = g.ws(nfa, self.value(values, q, f"{where}/additionalProperties", depth + 1))
        nfa.link(g.ws(nfa, nfa.lit(after, b",")), key)
        nfa.byte(after, 0x7D, 0x7D, end)
        return end

    def literals(self, schema: dict, s: int, where: str) -> int:
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        if len(values) > MAX_ENUM:
            raise SchemaTooComplex(f"enum at {where} has {len(values)} values, more than {MAX_ENUM}")
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if rest.keys() & {"$ref", "anyOf", "allOf", "properties", "items", "additionalProperties"}:
            raise UnsupportedSchema(sorted(rest)[0], where, "cannot be combined with enum/const")
        check = jsonschema.Draft202012Validator(rest)
        texts = list(dict.fromkeys(_json_bytes(v) for v in values if check.is_valid(v)))
        if not texts:
            raise SchemaError(f"no enum/const value at {where} matches the rest of its schema")
        return self.nfa.alt(s, [lambda t, b=b: self.nfa.lit(t, b) for b in texts])

    def ref(self, ref: Any, s: int, where: str, depth: int) -> int:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchema("$ref", where, "only local references (#/$defs/...) are supported")
        if ref in self.active_refs:
            raise SchemaError(f"recursive $ref {ref!r} at {where} is not supported")
        target: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"$ref {ref!r} at {where} points to nothing")
            target = target[part]
        self.active_refs.append(ref)
        try:
            return self.value(target, s, ref, depth + 1)
        finally:
            self.active_refs.pop()


def _check_count(schema: dict, keys: tuple[str, str], where: str) -> None:
    for key in keys:
        if schema.get(key, 0) > MAX_COUNT:
            raise SchemaTooComplex(f"{key} {schema[key]} at {where} is above the supported {MAX_COUNT}")


def _infer_type(keys: set) -> str | None:
    if keys & {"properties", "required", "additionalProperties"}:
        return "object"
    if keys & {"items", "minItems", "maxItems"}:
        return "array"
    if keys & {"minLength", "maxLength", "pattern", "format"}:
        return "string"
    if keys & set(_BOUNDS):
        return "number"
    return None


def _json_bytes(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except ValueError as e:
        raise SchemaError(f"enum/const value cannot be written as JSON: {e}") from None
