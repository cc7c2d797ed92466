"""Chat messages and tools (Ollama wire shape: dicts) turned into the Go values Ollama's templates see.

Field names and types follow Ollama's template structs: `.Role .Content .Thinking .Images .ToolCalls
.ToolName .ToolCallID` on messages; `.ID .Function.Index/.Name/.Arguments` on tool calls;
`.Type .Items .Function.Name/.Description/.Parameters.{Type,Defs,Items,Required,Properties}` on tools."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from ._govalues import GoStruct, JSONList, JSONMap, PropertyType

_MESSAGE_KEYS = frozenset({"role", "content", "thinking", "images", "tool_calls", "tool_name", "tool_call_id"})


def _str(d: dict, key: str, where: str) -> str:
    v = d.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise InvalidRequest(f"{where}.{key} must be a string")
    return v


def check_message(m: Any, i: int) -> dict:
    """A wire message as Ollama reads it: known keys only, role lower-cased, strings where strings go."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise InvalidRequest(f"{where} must be an object")
    unknown = set(m) - _MESSAGE_KEYS
    if unknown:
        raise InvalidRequest(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    out = {k: _str(m, k, where) for k in ("role", "content", "thinking", "tool_name", "tool_call_id")}
    out["role"] = out["role"].lower()
    images = m.get("images") or []
    if not isinstance(images, list):
        raise InvalidRequest(f"{where}.images must be a list")
    out["images"] = images
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls must be a list")
    out["tool_calls"] = [_check_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def _check_call(c: Any, where: str) -> dict:
    if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
        raise InvalidRequest(f"{where} must be an object with a 'function' object")
    fn = c["function"]
    args = fn.get("arguments") if fn.get("arguments") is not None else {}
    if not isinstance(args, dict):
        raise InvalidRequest(f"{where}.function.arguments must be an object")
    index = fn.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidRequest(f"{where}.function.index must be an integer")
    return {
        "id": _str(c, "id", where),
        "function": {"index": index, "name": _str(fn, "name", where), "arguments": args},
    }


def go_message(m: dict) -> GoStruct:
    calls = [
        GoStruct(
            "template.templateToolCall",
            {
                "ID": c["id"],
                "Function": GoStruct(
                    "template.templateToolCallFunction",
                    {
                        "Index": c["function"]["index"],
                        "Name": c["function"]["name"],
                        "Arguments": JSONMap(c["function"]["arguments"]),
                    },
                ),
            },
        )
        for c in m["tool_calls"]
    ]
    return GoStruct(
        "*template.templateMessage",
        {
            "Role": m["role"],
            "Content": m["content"],
            "Thinking": m["thinking"],
            "Images": m["images"],
            "ToolCalls": calls,
            "ToolName": m["tool_name"],
            "ToolCallID": m["tool_call_id"],
        },
    )


def go_tools(tools: Any) -> JSONList | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list")
    return JSONList(_go_tool(t, f"tools[{i}]") for i, t in enumerate(tools))


def _go_tool(t: Any, where: str) -> GoStruct:
    if not isinstance(t, dict) or not isinstance(t.get("function", {}), dict):
        raise InvalidRequest(f"{where} must be an object with a 'function' object")
    fn = t.get("function") or {}
    params = fn.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where}.function.parameters must be an object")
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise InvalidRequest(f"{where}.function.parameters.properties must be an object")
    parameters = GoStruct(
        "template.templateToolFunctionParameters",
        {
            "Type": _str(params, "type", where),
            "Defs": params.get("$defs"),
            "Items": params.get("items"),
            "Required": params.get("required") or [],
            # absent properties marshal as null in Ollama (nil map), present-but-empty as {}
            "Properties": JSONMap({k: go_property(v, f"{where}.properties.{k}") for k, v in props.items()})
            if params.get("properties") is not None
            else None,
        },
        json_names={
            "Type": "type",
            "Defs": "$defs",
            "Items": "items",
            "Required": "required",
            "Properties": "properties",
        },
        omitempty=frozenset({"Defs", "Items", "Required"}),
    )
    function = GoStruct(
        "template.templateToolFunction",
        {
            "Name": _str(fn, "name", where),
            "Description": _str(fn, "description", where),
            "Parameters": parameters,
        },
        json_names={"Name": "name", "Description": "description", "Parameters": "parameters"},
        stringer=True,
    )
    return GoStruct(
        "template.templateTool",
        {
            "Type": _str(t, "type", where) or "function",
            "Items": t.get("items"),
            "Function": function,
        },
        json_names={"Type": "type", "Items": "items", "Function": "function"},
        omitempty=frozenset({"Items"}),
        stringer=True,
    )


def go_property(p: Any, where: str) -> GoStruct:
    if not isinstance(p, dict):
        raise InvalidRequest(f"{where} must be an object")
    ptype = p.get("type")
    types = PropertyType([ptype] if isinstance(ptype, str) else (ptype or []))
    if not all(isinstance(x, str) for x in types):
        raise InvalidRequest(f"{where}.type must be a string or a list of strings")
    sub = p.get("properties")
    return GoStruct(
        "api.ToolProperty",
        {
            "AnyOf": [go_property(a, f"{where}.anyOf") for a in (p.get("anyOf") or [])],
            "Type": types,
            "Items": p.get("items"),
            "Description": _str(p, "description", where),
            "Enum": p.get("enum") or [],
            "Properties": JSONMap({k: go_property(v, f"{where}.{k}") for k, v in sub.items()})
            if isinstance(sub, dict)
            else None,
            "Required": p.get("required") or [],
        },
        json_names={
            "AnyOf": "anyOf",
            "Type": "type",
            "Items": "items",
            "Description": "description",
            "Enum": "enum",
            "Properties": "properties",
            "Required": "required",
        },
        omitempty=frozenset({"AnyOf", "Type", "Items", "Description", "Enum", "Properties", "Required"}),
    )
