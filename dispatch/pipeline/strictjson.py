"""Strict JSON (RFC 8259) for the arguments a model produced.

Python's json module is lenient where a model's output must not be: it accepts NaN and Infinity,
keeps the last of duplicate keys, and turns 1e400 into infinity. Each of those would let two
readers disagree about what the model asked for, so each is refused here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_DEPTH = 32


class StrictJSONError(ValueError):
    """The text is not one unambiguous JSON value within the limits."""


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON; numbers must be finite")


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError(f"key {key!r} appears more than once")
            seen.add(key)
    return obj


_decoder = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicates,
    parse_constant=_refuse_constant,
)
# The C scanner the decoder built for itself (the type stubs do not declare it).
_scan_once: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]
_WHITESPACE = " \t\n\r"


def _decode(text: str) -> Any:
    """JSONDecoder.decode without its two Python frames, and without its two regular-expression
    matches when no whitespace surrounds the value (as a model writes arguments)."""
    start = len(text) - len(text.lstrip(_WHITESPACE)) if text[:1] in _WHITESPACE else 0
    try:
        value, end = _scan_once(text, start)
    except StopIteration as exc:
        raise json.JSONDecodeError("Expecting value", text, exc.value) from None
    if end != len(text):
        end = len(text) - len(text[end:].lstrip(_WHITESPACE))
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return value


def check_value(value: Any, depth: int = 1, *, refuse_nul: bool = False) -> None:
    """Refuse what JSON cannot say exactly: deep nesting, non-finite numbers, lone surrogates.

    With refuse_nul, also a NUL character in any string: no tool takes one, and PostgreSQL can
    store none in text or JSON, so arguments holding one are refused before anything keeps them.
    """
    if depth > MAX_DEPTH:
        raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        _check_text(value, refuse_nul)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise StrictJSONError("a number is out of range")
    elif isinstance(value, dict):
        # Strings and integers, the common items, are checked in place rather than by a call.
        for key, item in value.items():
            if not isinstance(key, str):
                raise StrictJSONError("object keys must be strings")
            if not key.isascii() or (refuse_nul and "\x00" in key):
                _check_text(key, refuse_nul)
            if isinstance(item, str) and depth < MAX_DEPTH:
                if not item.isascii() or (refuse_nul and "\x00" in item):
                    _check_text(item, refuse_nul)
            elif item is None or isinstance(item, int):
                pass
            elif isinstance(item, (dict, list, str, float)):
                check_value(item, depth + 1, refuse_nul=refuse_nul)
            else:
                raise StrictJSONError(f"value of {key!r} is not a JSON value")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str) and depth < MAX_DEPTH:
                if not item.isascii() or (refuse_nul and "\x00" in item):
                    _check_text(item, refuse_nul)
            elif item is None or isinstance(item, int):
                pass
            elif isinstance(item, (dict, list, str, float)):
                check_value(item, depth + 1, refuse_nul=refuse_nul)
            else:
                raise StrictJSONError("an array item is not a JSON value")
    elif not (value is None or isinstance(value, (bool, int))):
        raise StrictJSONError("not a JSON value")


def _check_text(text: str, refuse_nul: bool) -> None:
    if refuse_nul and "\x00" in text:
        raise StrictJSONError("a string holds a NUL character (\\u0000)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise StrictJSONError("a string holds an unpaired surrogate") from None


def loads(text: str, *, refuse_nul: bool = False) -> Any:
    """Parse one strict JSON value."""
    try:
        value = _decode(text)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise StrictJSONError(str(exc)) from None
    check_value(value, refuse_nul=refuse_nul)
    return value


def loads_object(text: str, *, max_bytes: int) -> dict[str, Any]:
    """Parse text that must hold exactly one JSON object of at most max_bytes (UTF-8)."""
    if len(text) > max_bytes or (not text.isascii() and len(text.encode("utf-8")) > max_bytes):
        raise StrictJSONError(f"larger than {max_bytes} bytes")
    value = loads(text, refuse_nul=True)
    if not isinstance(value, dict):
        raise StrictJSONError(f"must be a JSON object, not {_json_type(value)}")
    return value


def check_object(value: object, *, max_bytes: int) -> dict[str, Any]:
    """The same rules for arguments that arrived already parsed (an object in the envelope)."""
    if not isinstance(value, Mapping):
        raise StrictJSONError(f"must be a JSON object, not {_json_type(value)}")
    obj = dict(value)
    check_value(obj, refuse_nul=True)
    try:
        size = len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise StrictJSONError(str(exc)) from None
    if size > max_bytes:
        raise StrictJSONError(f"larger than {max_bytes} bytes")
    return obj


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
