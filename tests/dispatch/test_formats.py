"""The vendor formats of a tool declaration, and when the OpenAI and Anthropic ones may say
strict."""

from __future__ import annotations

import copy
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from dispatch.formats import (
    anthropic,
    anthropic_strict_accepts,
    openai,
    openai_strict_accepts,
    responses,
)
from dispatch.pipeline.tools import ToolSpec

ACCEPTED: dict[str, Any] = {
    "title": "ship_parcel",
    "type": "object",
    "additionalProperties": False,
    "required": ["parcel_id", "weight_grams", "express", "note", "items", "address"],
    "properties": {
        "parcel_id": {"type": "string", "pattern": "^P-[0-9]{1,8}$", "description": "the id"},
        "weight_grams": {"type": "integer", "minimum": 1, "maximum": 30000},
        "express": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "items": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 5},
        "address": {"$ref": "#/$defs/Address"},
    },
    "$defs": {
        "Address": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "title": "City"}},
        }
    },
}


def changed(path: tuple[str, ...], value: Any = None, *, remove: bool = False) -> dict[str, Any]:
    schema = copy.deepcopy(ACCEPTED)
    node = schema
    for key in path[:-1]:
        node = node[key]
    if remove:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return schema


def test_openai_strict_accepts_a_closed_schema_of_supported_keywords() -> None:
    assert openai_strict_accepts(ACCEPTED) is True


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(changed(("required",), ["parcel_id"]), id="an optional property"),
        pytest.param(changed(("additionalProperties",), remove=True), id="an open root object"),
        pytest.param(
            changed(("$defs", "Address", "additionalProperties"), True), id="an open nested object"
        ),
        pytest.param(
            changed(("properties", "parcel_id", "maxLength"), 16), id="maxLength on a string"
        ),
        pytest.param(changed(("properties", "items", "uniqueItems"), True), id="uniqueItems"),
        pytest.param(changed(("properties", "note"), {"oneOf": [{"type": "string"}]}), id="oneOf"),
        pytest.param(changed(("properties", "note", "default"), None), id="a default"),
        pytest.param(changed(("properties", "parcel_id", "format"), "iban"), id="unknown format"),
        pytest.param(changed(("properties", "express"), {}), id="a property of any type"),
        pytest.param({"anyOf": [ACCEPTED]}, id="a root that is not an object"),
    ],
)
def test_openai_strict_refuses_what_strict_mode_does_not_support(schema: dict[str, Any]) -> None:
    assert openai_strict_accepts(schema) is False


def test_openai_strict_refuses_objects_nested_deeper_than_ten_levels() -> None:
    leaf: dict[str, Any] = {"type": "string"}
    for _ in range(10):
        leaf = {
            "type": "object",
            "additionalProperties": False,
            "required": ["inner"],
            "properties": {"inner": leaf},
        }

    assert openai_strict_accepts(leaf) is False
    assert openai_strict_accepts(leaf["properties"]["inner"]) is True


class ParcelArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="ship_parcel")

    parcel_id: str = Field(pattern=r"^P-[0-9]{1,8}$", description="the parcel's id")
    speed: Literal["standard", "express"] = Field(description="how fast")


class LabelArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="print_label")

    text: str = Field(max_length=40, description="the label's text")
    copies: int = Field(default=1, ge=1, description="how many")


def spec_of(arguments: type[BaseModel]) -> ToolSpec[Any]:
    return ToolSpec(
        name=str(arguments.model_config.get("title")),
        description="a tool",
        arguments=arguments,
        handler=lambda args, context: {},
    )


def test_the_openai_format_says_strict_for_a_declaration_strict_mode_accepts() -> None:
    spec = spec_of(ParcelArguments)

    tool = openai(spec)

    assert tool == {
        "type": "function",
        "function": {
            "name": "ship_parcel",
            "description": "a tool",
            "parameters": spec.json_schema(),
            "strict": True,
        },
    }


def test_the_openai_format_leaves_strict_out_for_a_declaration_it_would_refuse() -> None:
    spec = spec_of(LabelArguments)

    tool = openai(spec)

    assert "strict" not in tool["function"]
    assert tool["function"]["parameters"] == spec.json_schema()


def test_the_anthropic_format_is_name_description_and_input_schema_strict_where_accepted() -> None:
    spec = spec_of(ParcelArguments)

    assert anthropic(spec) == {
        "name": "ship_parcel",
        "description": "a tool",
        "input_schema": spec.json_schema(),
        "strict": True,
    }


def test_the_anthropic_format_leaves_strict_out_for_bounds_anthropic_does_not_take() -> None:
    spec = spec_of(LabelArguments)

    tool = anthropic(spec)

    assert "strict" not in tool
    assert tool["input_schema"] == spec.json_schema()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("properties", "weight_grams", "minimum"), 1),
        (("properties", "parcel_id", "maxLength"), 8),
        (("properties", "items", "maxItems"), 5),
        (("properties", "items", "minItems"), 2),
        (("properties", "parcel_id", "pattern"), "^(?=P)P-[0-9]+$"),
        (("properties", "parcel_id", "pattern"), "^(a)\\1$"),
        (("additionalProperties",), True),
    ],
    ids=["minimum", "maxLength", "maxItems", "minItems 2", "lookahead", "backreference", "open"],
)
def test_anthropic_strict_refuses_what_its_grammar_does_not_take(
    path: tuple[str, ...], value: Any
) -> None:
    plain = changed(("properties", "weight_grams"), {"type": "integer"})
    plain["properties"]["items"].pop("maxItems")

    assert anthropic_strict_accepts(plain) is True
    bent = copy.deepcopy(plain)
    node = bent
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert anthropic_strict_accepts(bent) is False


def test_anthropic_strict_lets_a_property_be_optional() -> None:
    schema = changed(("properties", "weight_grams"), {"type": "integer"})
    schema["properties"]["items"].pop("maxItems")
    schema["required"] = ["parcel_id"]

    assert anthropic_strict_accepts(schema) is True
    assert openai_strict_accepts(schema) is False


@pytest.mark.parametrize("arguments", [ParcelArguments, LabelArguments])
def test_the_formats_are_what_the_vendors_own_types_take(arguments: type[BaseModel]) -> None:
    from anthropic.types import ToolParam
    from openai.types.chat import ChatCompletionToolParam
    from openai.types.responses import FunctionToolParam

    spec = spec_of(arguments)

    vendor_types: list[tuple[dict[str, Any], Any]] = [
        (openai(spec), ChatCompletionToolParam),
        (responses(spec), FunctionToolParam),
        (anthropic(spec), ToolParam),
    ]
    for shape, param in vendor_types:
        # The vendor's type keeps every key it knows: nothing of ours is dropped or unknown.
        checked: dict[str, Any] = TypeAdapter(param).validate_python(shape, strict=True)
        assert checked == shape


def test_the_responses_format_is_flat_and_always_says_strict() -> None:
    strict, loose = spec_of(ParcelArguments), spec_of(LabelArguments)

    assert responses(strict) == {
        "type": "function",
        "name": "ship_parcel",
        "description": "a tool",
        "parameters": strict.json_schema(),
        "strict": True,
    }
    assert responses(loose)["strict"] is False
