"""Strict JSON: what it refuses, and that its quick path for flat objects agrees with a plain
reading of the rules on any text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatch.pipeline.strictjson import (
    MAX_DEPTH,
    StrictJSONError,
    check_object,
    check_value,
    loads,
    loads_object,
)


def reference(text: str, *, refuse_nul: bool) -> Any:
    """The rules read plainly: json.loads with a hook per object, then one walk of everything."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise StrictJSONError("duplicate")
        return dict(items)

    def constant(name: str) -> Any:
        raise StrictJSONError(name)

    def walk(value: Any, containers: int) -> None:
        if isinstance(value, (dict, list)):
            if containers + 1 > MAX_DEPTH:
                raise StrictJSONError("deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    walk(key, containers + 1)
                walk(item, containers + 1)
        elif isinstance(value, float) and not math.isfinite(value):
            raise StrictJSONError("range")
        elif isinstance(value, str):
            if refuse_nul and "\x00" in value:
                raise StrictJSONError("nul")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise StrictJSONError("surrogate") from None

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError(str(exc)) from None
    walk(value, 0)
    return value


def outcome(parse: Any, text: str, refuse_nul: bool) -> tuple[str, Any]:
    try:
        return "value", parse(text, refuse_nul=refuse_nul)
    except StrictJSONError:
        return "refused", None


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(alphabet=st.characters(codec=None), max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
flat_objects = st.dictionaries(st.text(max_size=6), scalars, max_size=5)


def texts() -> st.SearchStrategy[str]:
    encoded = st.one_of(json_values, flat_objects).flatmap(
        lambda value: st.sampled_from(
            [json.dumps(value), json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
        )
    )
    # Duplicate keys, which json.dumps never writes, spliced into flat objects.
    duplicated = flat_objects.filter(bool).map(
        lambda value: json.dumps(value)[:-1] + ", " + json.dumps(value)[1:]
    )
    return st.one_of(encoded, duplicated, st.text(max_size=40))


@settings(max_examples=600, deadline=None)
@given(text=texts(), refuse_nul=st.booleans())
@example(text='{"a": "x\\u0000"}', refuse_nul=True)
@example(text='{"a": "x\\ud800"}', refuse_nul=False)
@example(text='{"a\\ud800": 1}', refuse_nul=False)
@example(text='{"a": 1e400}', refuse_nul=False)
@example(text='{"a": "{", "a": 2}', refuse_nul=False)
@example(text='{"a": -0.0, "b": 1.5e3}', refuse_nul=False)
def test_it_agrees_with_a_plain_reading_of_the_rules(text: str, refuse_nul: bool) -> None:
    assert outcome(loads, text, refuse_nul) == outcome(reference, text, refuse_nul)


@pytest.mark.parametrize(
    "text",
    [
        '{"order_id": "ORD-1001\\u0000"}',  # an escape makes the NUL
        '{"order_id\\u0000": "ORD-1001"}',
        '{"order_id": "ORD-1001\x00"}',  # a raw control character is not JSON at all
        '{"order_id": "\\udc00"}',
        '{"order_id": "ORD-1001", "order_id": "ORD-1002"}',
        '{"amount_cents": 1e400}',
        '{"amount_cents": -1E999}',
        '{"amount_cents": NaN}',
    ],
)
def test_a_flat_object_is_held_to_every_rule(text: str) -> None:
    with pytest.raises(StrictJSONError):
        loads_object(text, max_bytes=8192)


def test_a_lone_surrogate_written_as_such_is_refused() -> None:
    with pytest.raises(StrictJSONError, match="surrogate"):
        loads_object('{"order_id": "ORD-1001' + "\ud800" + '"}', max_bytes=8192)


def test_objects_come_back_as_dicts_at_every_depth() -> None:
    value = loads('{"a": [{"b": {"c": []}}, 1.5], "d": {}}')

    assert value == {"a": [{"b": {"c": []}}, 1.5], "d": {}}
    assert type(value["a"][0]) is dict and type(value["d"]) is dict


def test_depth_counts_objects_and_arrays() -> None:
    deepest = "[" * (MAX_DEPTH - 1) + '{"a": "x", "b": 1}' + "]" * (MAX_DEPTH - 1)
    too_deep = "[" * MAX_DEPTH + "{}" + "]" * MAX_DEPTH

    assert loads(deepest)
    with pytest.raises(StrictJSONError, match="nested deeper"):
        loads(too_deep)
    check_value(json.loads(deepest))
    with pytest.raises(StrictJSONError, match="nested deeper"):
        check_value(json.loads(too_deep))


def test_an_object_the_host_parsed_is_held_to_the_same_rules() -> None:
    assert check_object({"a": [1, "x", None, 2.5]}, max_bytes=100) == {"a": [1, "x", None, 2.5]}
    for refused in ({"a": float("inf")}, {"a": "\x00"}, {1: "a"}, {"a": object()}, {"a": [b"x"]}):
        with pytest.raises(StrictJSONError):
            check_object(refused, max_bytes=100)
