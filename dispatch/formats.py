"""The tools an agent may call, in the shapes model vendors expect, all from one declaration.

- neutral: Toolgate's own listing, with the flags.
- openai: Chat Completions / Responses function tools: {"type": "function", "function": {...}}.
- anthropic: Messages API tools: {"name", "description", "input_schema"}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": _schema(spec),
        },
    }


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
