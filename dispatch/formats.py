"""The tools an agent may call, in the shapes model vendors expect, all from one declaration.

- neutral: Toolgate's own listing, with the flags.
- openai: Chat Completions function tools: {"type": "function", "function": {...}}, with
  "strict": true where the schema is one OpenAI's strict mode accepts (openai_strict_accepts), so
  the provider itself constrains the arguments the model writes.
- anthropic: Messages API tools: {"name", "description", "input_schema"}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from dispatch.pipeline.tools import ToolSpec


@cache
def _schema(spec: ToolSpec[Any]) -> dict[str, Any]:
    return spec.json_schema()


def neutral(spec: ToolSpec[Any]) -> dict[str, Any]:
    return {
        "name": spec.name,
        "label": spec.label or spec.name,
        "description": spec.description,
        "writes": spec.writes,
        "risk": spec.risk.value,
        "amount_field": spec.amount_field,
        "input_schema": _schema(spec),
        "codes": [code.name for code in spec.codes],
    }


def openai(spec: ToolSpec[Any]) -> dict[str, Any]:
    schema = _schema(spec)
    function: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "parameters": schema,
    }
    if openai_strict_accepts(schema):
        function["strict"] = True
    return {"type": "function", "function": function}


# OpenAI's structured outputs accept a subset of JSON Schema ("Supported schemas" in its guide):
# these keywords per type, every object closed with all its properties required, the root an
# object, at most 10 levels of nesting and 5000 properties. Anything else it refuses under
# strict, so such a tool is offered without it (and Toolgate still validates every call).
_OPENAI_KEYWORDS_BY_TYPE: dict[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"pattern", "format"}),
    "number": frozenset(
        {"multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    ),
    "integer": frozenset(
        {"multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    ),
    "boolean": frozenset(),
    "null": frozenset(),
}
_OPENAI_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
_ANNOTATIONS = frozenset({"title", "description"})
_OPENAI_MAX_DEPTH = 10
_OPENAI_MAX_PROPERTIES = 5000


def openai_strict_accepts(schema: Mapping[str, Any]) -> bool:
    """Whether OpenAI's strict mode accepts this JSON Schema of a tool's parameters as it is."""
    if schema.get("type") != "object":
        return False
    definitions = schema.get("$defs", {})
    if not isinstance(definitions, Mapping):
        return False
    root = {key: value for key, value in schema.items() if key != "$defs"}
    counted = [0]
    return _strict_node(root, 1, counted) and all(
        _strict_node(node, 1, counted) for node in definitions.values()
    )


def _strict_node(node: Any, depth: int, counted: list[int]) -> bool:
    if not isinstance(node, Mapping) or depth > _OPENAI_MAX_DEPTH:
        return False
    if "$ref" in node:
        return set(node) <= {"$ref", *_ANNOTATIONS} and str(node["$ref"]).startswith("#")
    if "anyOf" in node:
        branches = node["anyOf"]
        return (
            set(node) <= {"anyOf", *_ANNOTATIONS}
            and isinstance(branches, list)
            and all(_strict_node(branch, depth, counted) for branch in branches)
        )
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds:
        return False
    allowed = {"type", "enum", *_ANNOTATIONS}
    for kind in kinds:
        if kind not in _OPENAI_KEYWORDS_BY_TYPE:
            return False
        allowed |= _OPENAI_KEYWORDS_BY_TYPE[kind]
    if not set(node) <= allowed:
        return False
    if "format" in node and node["format"] not in _OPENAI_FORMATS:
        return False
    if "object" in kinds:
        properties = node.get("properties", {})
        if not isinstance(properties, Mapping) or node.get("additionalProperties") is not False:
            return False
        if set(node.get("required", ())) != set(properties):
            return False
        counted[0] += len(properties)
        if counted[0] > _OPENAI_MAX_PROPERTIES:
            return False
        if not all(_strict_node(value, depth + 1, counted) for value in properties.values()):
            return False
    if "array" in kinds:
        return _strict_node(node.get("items"), depth + 1, counted)
    return True


def anthropic(spec: ToolSpec[Any]) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": _schema(spec)}


FORMATS: dict[str, Callable[[ToolSpec[Any]], dict[str, Any]]] = {
    "neutral": neutral,
    "openai": openai,
    "anthropic": anthropic,
}


def tools_in_format(specs: Iterable[ToolSpec[Any]], name: str) -> list[dict[str, Any]]:
    render = FORMATS[name]
    return [render(spec) for spec in specs]
