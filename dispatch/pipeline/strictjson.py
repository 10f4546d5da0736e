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


class UnstorableText(StrictJSONError):
    """A string holds what no database stores: an unpaired surrogate (no encoding writes one), or
    a NUL character where it is refused (PostgreSQL keeps none in text)."""


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON; numbers must be finite")


class WrittenFloat(float):
    """A float that remembers how the model wrote it: 80.00 and 80.0 are the same number, but
    the first was written as money (messages.py tells the two apart)."""

    __slots__ = ("written",)
    written: str

    def __new__(cls, text: str) -> WrittenFloat:
        value = super().__new__(cls, text)
        value.written = text
        return value


def _finite_float(text: str) -> float:
    # Called by the scanner for each number with a fraction or an exponent, and only for those.
    value = WrittenFloat(text)
    if not math.isfinite(value):
        raise StrictJSONError("a number is out of range")
    return value


# Objects come out of the scanner as tuples of (key, value) pairs, built by the C type itself
# rather than by a Python hook on every object; _thaw turns them into dicts, refusing duplicates.
# Arrays come out as lists, so the two never mix.
_decoder = json.JSONDecoder(
    object_pairs_hook=tuple,
    parse_float=_finite_float,
    parse_constant=_refuse_constant,
)
# The C scanner the decoder built for itself (the type stubs do not declare it).
_scan_once: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]
_WHITESPACE = " \t\n\r"


def _pairs_to_dict(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        _refuse_duplicates(pairs)
    return obj


def _refuse_duplicates(pairs: tuple[tuple[str, Any], ...]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise StrictJSONError(f"key {key!r} appears more than once")
        seen.add(key)


def _thaw(value: Any, depth: int, refuse_nul: bool) -> Any:
    """The scanner's value as JSON values (objects as dicts), with check_value's rules."""
    if isinstance(value, (tuple, list)) and depth > MAX_DEPTH:
        raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, tuple):
        obj = _pairs_to_dict(value)
        for key, item in obj.items():
            _check_text(key, refuse_nul)
            obj[key] = _thaw(item, depth + 1, refuse_nul)
        return obj
    if isinstance(value, list):
        return [_thaw(item, depth + 1, refuse_nul) for item in value]
    if isinstance(value, str):
        _check_text(value, refuse_nul)
    return value


def check_value(value: Any, depth: int = 1, *, refuse_nul: bool = False) -> None:
    """Refuse what JSON cannot say exactly: deep nesting, non-finite numbers, lone surrogates.

    Depth counts objects and arrays: MAX_DEPTH of them may nest, holding any value. With
    refuse_nul, also a NUL character in any string: no tool takes one, and PostgreSQL can store
    none in text or JSON, so arguments holding one are refused before anything keeps them.
    """
    if isinstance(value, dict):
        if depth > MAX_DEPTH:
            raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels")
        # Strings and integers, the common items, are checked in place rather than by a call.
        for key, item in value.items():
            if not isinstance(key, str):
                raise StrictJSONError("object keys must be strings")
            if not key.isascii() or (refuse_nul and "\x00" in key):
                _check_text(key, refuse_nul)
            if isinstance(item, str):
                if not item.isascii() or (refuse_nul and "\x00" in item):
                    _check_text(item, refuse_nul)
            elif not (item is None or isinstance(item, int)):
                _check_other(item, depth, refuse_nul)
    elif isinstance(value, list):
        if depth > MAX_DEPTH:
            raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels")
        for item in value:
            if isinstance(item, str):
                if not item.isascii() or (refuse_nul and "\x00" in item):
                    _check_text(item, refuse_nul)
            elif not (item is None or isinstance(item, int)):
                _check_other(item, depth, refuse_nul)
    elif isinstance(value, str):
        _check_text(value, refuse_nul)
    elif not (value is None or isinstance(value, int)):
        _check_other(value, depth, refuse_nul)


def _check_other(item: Any, depth: int, refuse_nul: bool) -> None:
    """A value held at depth that is not a string, an integer, a boolean or null."""
    if isinstance(item, float):
        if not math.isfinite(item):
            raise StrictJSONError("a number is out of range")
    elif isinstance(item, (dict, list)):
        check_value(item, depth + 1, refuse_nul=refuse_nul)
    else:
        raise StrictJSONError(f"{type(item).__name__} is not a JSON value")


def _check_text(text: str, refuse_nul: bool) -> None:
    if refuse_nul and "\x00" in text:
        raise UnstorableText("a string holds a NUL character (\\u0000)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UnstorableText("a string holds an unpaired surrogate") from None


def loads(text: str, *, refuse_nul: bool = False) -> Any:
    """Parse one strict JSON value."""
    # What JSONDecoder.decode does, calling its scanner directly.
    try:
        start = len(text) - len(text.lstrip(_WHITESPACE)) if text[:1] in _WHITESPACE else 0
        try:
            value, end = _scan_once(text, start)
        except StopIteration as exc:
            raise json.JSONDecodeError("Expecting value", text, exc.value) from None
        if end != len(text):
            end = len(text) - len(text[end:].lstrip(_WHITESPACE))
            if end != len(text):
                raise json.JSONDecodeError("Extra data", text, end)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise StrictJSONError(str(exc)) from None
    if type(value) is tuple and text.count("{") == 1 and "[" not in text:
        # One flat object, as a model writes arguments: its values are strings, numbers, booleans
        # and nulls, its numbers were checked as they were read, and only an escape or a
        # character beyond ASCII can make a NUL or a lone surrogate. Anything else is walked.
        obj = _pairs_to_dict(value)
        if "\\" in text or not text.isascii():
            for key, item in obj.items():
                _check_text(key, refuse_nul)
                if isinstance(item, str):
                    _check_text(item, refuse_nul)
        return obj
    return _thaw(value, 1, refuse_nul)


def loads_object(text: str, *, max_bytes: int) -> dict[str, Any]:
    """Parse text that must hold exactly one JSON object of at most max_bytes (UTF-8)."""
    # A lone surrogate is measured as UTF-8 would write it, and refused by loads.
    if len(text) > max_bytes or (
        not text.isascii() and len(text.encode("utf-8", "surrogatepass")) > max_bytes
    ):
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
