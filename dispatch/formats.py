"""The tools an agent may call, in the shapes model vendors expect, all from one declaration.

- neutral: Toolgate's own listing, with the flags.
- openai: Chat Completions function tools: {"type": "function", "function": {...}}, with
  "strict": true where the schema is one OpenAI's strict mode accepts (openai_strict_accepts), so
  the provider itself constrains the arguments the model writes.
- responses: the Responses API's function tools: {"type": "function", "name", "description",
  "parameters", "strict"}, strict as for openai.
- anthropic: Messages API tools: {"name", "description", "input_schema"}, with "strict": true
  where Anthropic's strict tool use accepts the schema (anthropic_strict_accepts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, NamedTuple

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
        # The older version this tool stands beside (docs/tools.md), or null.
        "replaces": spec.replaces,
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


class Dialect(NamedTuple):
    """The subset of JSON Schema a provider's strict mode accepts for a tool's parameters."""

    keywords_by_type: Mapping[str, frozenset[str]]
    formats: frozenset[str]
    # Every object lists all its properties as required (OpenAI), or may leave some optional.
    all_required: bool
    max_depth: int | None = None
    max_properties: int | None = None
    # The values minItems may take, where only some are accepted (Anthropic: 0 or 1).
    min_items: frozenset[int] | None = None
    # Patterns without lookaround or backreferences only.
    plain_patterns: bool = False


_NUMBERS = frozenset({"multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})

# OpenAI's structured outputs ("Supported schemas" in its guide): these keywords per type, every
# object closed with all its properties required, the root an object, at most 10 levels of
# nesting and 5000 properties. Anything else it refuses under strict, so such a tool is offered
# without it (and Toolgate still validates every call).
OPENAI_STRICT = Dialect(
    keywords_by_type={
        "object": frozenset({"properties", "required", "additionalProperties"}),
        "array": frozenset({"items", "minItems", "maxItems"}),
        "string": frozenset({"pattern", "format"}),
        "number": _NUMBERS,
        "integer": _NUMBERS,
        "boolean": frozenset(),
        "null": frozenset(),
    },
    formats=frozenset(
        {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
    ),
    all_required=True,
    max_depth=10,
    max_properties=5000,
)

# Anthropic's strict tool use (structured outputs): closed objects, no numeric or length bounds,
# minItems only 0 or 1, patterns without lookaround or backreferences. Toolgate's own schemas
# bound most strings and amounts, so few tools qualify; the rest are offered without strict.
ANTHROPIC_STRICT = Dialect(
    keywords_by_type={
        "object": frozenset({"properties", "required", "additionalProperties"}),
        "array": frozenset({"items", "minItems"}),
        "string": frozenset({"pattern", "format"}),
        "number": frozenset(),
        "integer": frozenset(),
        "boolean": frozenset(),
        "null": frozenset(),
    },
    formats=frozenset(
        {
            "date-time",
            "time",
            "date",
            "duration",
            "email",
            "hostname",
            "uri",
            "ipv4",
            "ipv6",
            "uuid",
        }
    ),
    all_required=False,
    min_items=frozenset({0, 1}),
    plain_patterns=True,
)

_ANNOTATIONS = frozenset({"title", "description"})
# Lookahead, lookbehind and backreferences: no grammar of a provider compiles them.
_UNCOMPILABLE_PATTERN = re.compile(r"\\[1-9]|\\k<|\\[bB]|\(\?(?:=|!|<=|<!)")


def openai_strict_accepts(schema: Mapping[str, Any]) -> bool:
    """Whether OpenAI's strict mode accepts this JSON Schema of a tool's parameters as it is."""
    return strict_accepts(schema, OPENAI_STRICT)


def anthropic_strict_accepts(schema: Mapping[str, Any]) -> bool:
    """Whether Anthropic's strict tool use accepts this JSON Schema of a tool's input as it is."""
    return strict_accepts(schema, ANTHROPIC_STRICT)


def strict_accepts(schema: Mapping[str, Any], dialect: Dialect) -> bool:
    if schema.get("type") != "object":
        return False
    definitions = schema.get("$defs", {})
    if not isinstance(definitions, Mapping):
        return False
    root = {key: value for key, value in schema.items() if key != "$defs"}
    counted = [0]
    return _strict_node(root, 1, counted, dialect) and all(
        _strict_node(node, 1, counted, dialect) for node in definitions.values()
    )


def _strict_node(node: Any, depth: int, counted: list[int], dialect: Dialect) -> bool:
    if not isinstance(node, Mapping):
        return False
    if dialect.max_depth is not None and depth > dialect.max_depth:
        return False
    if "$ref" in node:
        return set(node) <= {"$ref", *_ANNOTATIONS} and str(node["$ref"]).startswith("#")
    if "anyOf" in node:
        branches = node["anyOf"]
        return (
            set(node) <= {"anyOf", *_ANNOTATIONS}
            and isinstance(branches, list)
            and all(_strict_node(branch, depth, counted, dialect) for branch in branches)
        )
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds:
        return False
    allowed = {"type", "enum", *_ANNOTATIONS}
    for kind in kinds:
        if kind not in dialect.keywords_by_type:
            return False
        allowed |= dialect.keywords_by_type[kind]
    if not set(node) <= allowed:
        return False
    if "format" in node and node["format"] not in dialect.formats:
        return False
    if dialect.plain_patterns and "pattern" in node:
        pattern = node["pattern"]
        if not isinstance(pattern, str) or _UNCOMPILABLE_PATTERN.search(pattern):
            return False
    if dialect.min_items is not None and node.get("minItems", 0) not in dialect.min_items:
        return False
    if "object" in kinds:
        properties = node.get("properties", {})
        if not isinstance(properties, Mapping) or node.get("additionalProperties") is not False:
            return False
        required = set(node.get("required", ()))
        if not required <= set(properties):
            return False
        if dialect.all_required and required != set(properties):
            return False
        counted[0] += len(properties)
        if dialect.max_properties is not None and counted[0] > dialect.max_properties:
            return False
        if not all(
            _strict_node(value, depth + 1, counted, dialect) for value in properties.values()
        ):
            return False
    if "array" in kinds:
        return _strict_node(node.get("items"), depth + 1, counted, dialect)
    return True


def responses(spec: ToolSpec[Any]) -> dict[str, Any]:
    """A function tool of OpenAI's Responses API: flat, with `strict` always stated."""
    schema = _schema(spec)
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": schema,
        "strict": openai_strict_accepts(schema),
    }


def anthropic(spec: ToolSpec[Any]) -> dict[str, Any]:
    schema = _schema(spec)
    tool: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "input_schema": schema,
    }
    if anthropic_strict_accepts(schema):
        tool["strict"] = True
    return tool


FORMATS: dict[str, Callable[[ToolSpec[Any]], dict[str, Any]]] = {
    "neutral": neutral,
    "openai": openai,
    "responses": responses,
    "anthropic": anthropic,
}


def tools_in_format(specs: Iterable[ToolSpec[Any]], name: str) -> list[dict[str, Any]]:
    render = FORMATS[name]
    return [render(spec) for spec in specs]
