"""The one place that turns a schema failure into words a model can act on.

Each failing field gets one part, `field: what was sent and what is wrong (what to send instead)`,
and the parts are joined by "; ". Everything is derived from pydantic's error and the field's own
declaration (its type, bounds, pattern, allowed values and the examples its description gives),
never from the names of one domain's fields. What the model sent is echoed bounded and escaped:
ASCII-only JSON, so a look-alike character shows as its escape and nothing it sent can break the
text it is shown.
"""

from __future__ import annotations

import difflib
import enum
import json
import re
import typing
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from dispatch.pipeline.strictjson import WrittenFloat

# A model that sends a thousand unknown fields is told about the first few.
MAX_PARTS = 8
# How much of a value the message repeats back.
ECHO_CHARS = 40

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DECIMAL = re.compile(r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?")
# "25.90 is 2590": a description's worked example of the unit a number is counted in.
_SCALE_EXAMPLE = re.compile(r"(-?[0-9]+)\.([0-9]+) is (-?[0-9]+)\b")
_UNIT = re.compile(r"\bin (?:[a-z]+ )?units\b")
_TOKEN_EDGES = "\"'`.,;:()[]{}<>"
# Characters that show nothing (zero-width spaces, joiners, direction marks): a model that wrote one
# cannot see it. A visible space is not one of them: "CUS 1" is not "CUS1".
_INVISIBLE = "Cf"
_EXPECTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def describe_validation_error(model: type[BaseModel], error: ValidationError) -> str:
    items = error.errors(include_url=False)
    fields = _fields_by_name(model)
    missing = [
        str(item["loc"][0])
        for item in items
        if item["type"] == "missing" and len(item["loc"]) == 1 and isinstance(item["loc"][0], str)
    ]
    unknown = [item["loc"][0] for item in items if _is_unknown_field(item)]
    parts: list[str] = []
    for item in items:
        if not _is_unknown_field(item):
            parts.append(_describe(item, fields, missing))
        elif item["loc"][0] == unknown[0]:
            # All the unknown fields in one part: a model that invents ten gets one answer.
            parts.append(_unknown_fields(unknown, fields, missing))
    if len(parts) > MAX_PARTS:
        parts[MAX_PARTS:] = [f"arguments: {len(parts) - MAX_PARTS} more problems not listed"]
    return "; ".join(parts)


def _is_unknown_field(item: ErrorDetails) -> bool:
    return item["type"] == "extra_forbidden" and len(item["loc"]) == 1


def _fields_by_name(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _describe(item: ErrorDetails, fields: Mapping[str, FieldInfo], missing: list[str]) -> str:
    location = item["loc"]
    name = _location(location)
    top = location[0] if len(location) == 1 else None
    field = fields.get(top) if isinstance(top, str) else None
    kind = item["type"]
    value = item.get("input")
    context: Mapping[str, Any] = item.get("ctx") or {}
    description = field.description if field is not None else None

    if kind == "missing":
        return f"{name}: required but not sent" + _hint(description)
    if kind == "extra_forbidden":
        return f"{name}: unknown field"
    if kind == "int_type":
        return f"{name}: {_integer_problem(value, field, description)}"
    if kind in ("literal_error", "enum"):
        return f"{name}: {_choice_problem(value, field, context, description)}"
    if kind == "string_pattern_mismatch":
        pattern = str(context.get("pattern", ""))
        return f"{name}: {_echo(value)} does not match {pattern[:80]}" + _string_fix(
            value, field, description
        )
    if kind in ("string_too_long", "string_too_short"):
        limit = context.get("max_length", context.get("min_length"))
        comparison = "more than" if kind == "string_too_long" else "fewer than"
        length = len(value) if isinstance(value, str) else 0
        return (
            f"{name}: {_echo(value)} has {length} characters, {comparison} {limit}"
            + _string_fix(value, field, description)
        )
    if kind in _BOUNDS:
        return f"{name}: {_bound_problem(kind, value, context, field)}"
    if kind in _EXPECTED_TYPES:
        expected = _EXPECTED_TYPES[kind]
        return f"{name}: {_not_a(value, expected)}" + _type_fix(kind, value, field, description)
    return f"{name}: {item['msg']}, got {_echo(value)}" + _hint(description)


def _hint(description: str | None) -> str:
    return f" ({description})" if description else ""


def _not_a(value: object, expected: str) -> str:
    if value is None:
        return f"null is not {expected}"
    return f"{_echo(value)} is {_json_kind(value)}, not {expected}"


def _unknown_fields(
    names: Sequence[int | str], fields: Mapping[str, FieldInfo], missing: Sequence[str]
) -> str:
    known = f"the only fields are: {', '.join(fields)}"
    shown = ", ".join(_location([name]) for name in names[:5])
    if len(names) > 5:
        return f"{shown} and {len(names) - 5} more: unknown fields ({known})"
    if len(names) > 1:
        return f"{shown}: unknown fields ({known})"
    name = str(names[0])
    # A required field that was not sent, under a name close to this one: the model's own name
    # for it.
    meant = difflib.get_close_matches(name, missing, n=1, cutoff=0.6) or [
        field for field in missing if field.startswith(name) or name.startswith(field)
    ]
    if len(meant) == 1:
        return f"{shown}: unknown field (did you mean {meant[0]}? {known})"
    return f"{shown}: unknown field ({known})"


# Locations and echoes ------------------------------------------------------------------------


def _location(location: Sequence[int | str]) -> str:
    parts = [
        str(part) if isinstance(part, int) or _NAME.fullmatch(part) else _echo(part)
        for part in location
    ]
    return ".".join(parts) or "arguments"


def _echo(value: object) -> str:
    """The value as ASCII-only JSON, cut to about ECHO_CHARS characters."""
    if isinstance(value, str):
        if len(value) <= ECHO_CHARS:
            return json.dumps(value)
        return f"{json.dumps(value[:ECHO_CHARS])}..."
    if isinstance(value, WrittenFloat) and len(value.written) <= ECHO_CHARS:
        return value.written
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # Too long to repeat (and Python refuses to print an int of more than 4300 digits).
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = ""
    try:
        for chunk in _ECHO_ENCODER.iterencode(value):
            text += chunk
            if len(text) > ECHO_CHARS:
                return _cut(text) + "..."
    except (TypeError, ValueError):
        return type(value).__name__
    return text


_ECHO_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=repr)


def _cut(text: str) -> str:
    # Never end inside an escape such as \u00e9: the rest of the message must read as written.
    return re.sub(r"\\(?:u[0-9a-fA-F]{0,3})?$", "", text[:ECHO_CHARS])


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=True)


# Numbers -------------------------------------------------------------------------------------


class _Bounds(NamedTuple):
    low: int | float | None = None
    high: int | float | None = None
    low_strict: bool = False
    high_strict: bool = False

    def admit(self, number: int | float) -> bool:
        if self.low is not None and (number <= self.low if self.low_strict else number < self.low):
            return False
        return not (
            self.high is not None
            and (number >= self.high if self.high_strict else number > self.high)
        )

    def words(self) -> str:
        low = None if self.low is None else f"{'above' if self.low_strict else 'from'} {self.low}"
        high = (
            None if self.high is None else f"{'below' if self.high_strict else 'up to'} {self.high}"
        )
        return " ".join(part for part in (low, high) if part)


def _bounds(field: FieldInfo | None) -> _Bounds:
    """The numeric bounds a field declares (Field(ge=..., le=...))."""
    found: dict[str, int | float] = {}
    for item in field.metadata if field is not None else ():
        for name in ("ge", "gt", "le", "lt"):
            bound = getattr(item, name, None)
            if isinstance(bound, int | float) and not isinstance(bound, bool):
                found[name] = bound
    return _Bounds(
        found.get("gt", found.get("ge")),
        found.get("lt", found.get("le")),
        "gt" in found,
        "lt" in found,
    )


class _Scale(NamedTuple):
    """A description's worked example of a unit: "25.90 is 2590" is a scale of 100."""

    decimals: int
    factor: int
    example: str
    unit: str

    def major(self, number: Decimal) -> str:
        return f"{number:.{self.decimals}f}"


def _scale(description: str | None) -> _Scale | None:
    if not description:
        return None
    found = _SCALE_EXAMPLE.search(description)
    if found is None:
        return None
    whole, fraction, scaled = found.groups()
    factor = 10 ** len(fraction)
    if int(whole + fraction) != int(scaled):
        return None
    unit = _UNIT.search(description)
    example = f"{scaled} for {whole}.{fraction}"
    return _Scale(len(fraction), factor, example, unit[0] if unit else "")


def _number_of(value: object) -> Decimal | None:
    """What a model meant as a number: a float, or a string that holds a plain decimal."""
    if isinstance(value, WrittenFloat):
        text = value.written
    elif isinstance(value, float):
        # The shortest text that reads back as the float: 25.9, not 25.899999999999998578.
        text = repr(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        text = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    else:
        return None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _integer_problem(value: object, field: FieldInfo | None, description: str | None) -> str:
    number = _number_of(value)
    bounds = _bounds(field)
    if number is None:
        return _not_a(value, "an integer") + _hint(description)
    as_string = isinstance(value, str)
    problem = (
        f"{_echo(value)} is a string, not an integer"
        if as_string
        else f"{_echo(value)} is not an integer"
    )
    not_a_string = ", not a string" if as_string else ""
    scale = _scale(description)
    exponent = number.as_tuple().exponent
    written_decimals = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    whole = number == number.to_integral_value()
    # "1.00" is written in the larger unit, though it is whole; 2590.0 is not.
    if whole and (scale is None or written_decimals != scale.decimals):
        if bounds.admit(int(number)):
            return f"{problem} (send the number {int(number)}{not_a_string})"
        return f"{problem} (send a whole number {bounds.words()}{not_a_string})".replace("  ", " ")
    if scale is not None:
        scaled = number * scale.factor
        integer = f"an integer {scale.unit}".rstrip()
        if scaled == scaled.to_integral_value() and bounds.admit(int(scaled)):
            return (
                f"{problem} (send {integer}, such as {int(scaled)} for "
                f"{scale.major(number)}{not_a_string})"
            )
        return f"{problem} (send {integer}, such as {scale.example}{not_a_string})"
    return f"{problem} (send a whole number{not_a_string})"


_BOUNDS = {
    "greater_than_equal": ("below the minimum of", "ge", "at least"),
    "greater_than": ("not above", "gt", "more than"),
    "less_than_equal": ("above the maximum of", "le", "at most"),
    "less_than": ("not below", "lt", "less than"),
}


def _bound_problem(
    kind: str, value: object, context: Mapping[str, Any], field: FieldInfo | None
) -> str:
    relation, key, fix = _BOUNDS[kind]
    bound = context.get(key)
    problem = f"{_echo(value)} is {relation} {bound} (send {fix} {bound}"
    # A negative amount where only positive ones are taken: most likely its sign is the mistake.
    if (
        kind.startswith("greater")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and value < 0
        and _bounds(field).admit(-value)
    ):
        return f"{problem}, such as {_echo(-value)})"
    return problem + ")"


# Choices -------------------------------------------------------------------------------------


def _allowed(field: FieldInfo | None, context: Mapping[str, Any]) -> list[Any]:
    annotation = field.annotation if field is not None else None
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [member.value for member in annotation]
    return [match.replace("\\'", "'") for match in _EXPECTED.findall(str(context.get("expected")))]


def _normal(text: str) -> str:
    return re.sub(r"[\s\-]+", "_", text.strip().casefold())


def _closest(value: object, allowed: Iterable[Any]) -> Any | None:
    """The one allowed value the model obviously meant: the same up to case and separators, or
    all but a letter or two the same."""
    if not isinstance(value, str):
        return None
    texts = {_normal(choice): choice for choice in allowed if isinstance(choice, str)}
    wanted = _normal(value)
    if wanted in texts:
        return texts[wanted]
    close = difflib.get_close_matches(wanted, texts, n=2, cutoff=0.8)
    return texts[close[0]] if len(close) == 1 else None


def _choice_problem(
    value: object, field: FieldInfo | None, context: Mapping[str, Any], description: str | None
) -> str:
    allowed = _allowed(field, context)
    listed = ", ".join(_json(choice) for choice in allowed)
    problem = f"{_echo(value)} is not one of {listed}"
    closest = _closest(value, allowed)
    if closest is not None:
        return f"{problem} (send {_json(closest)})"
    return problem + (_hint(description) or " (send one of them)")


# Strings -------------------------------------------------------------------------------------


def _string_rules(field: FieldInfo | None) -> tuple[re.Pattern[str] | None, int | None, int | None]:
    """The pattern and the bounds of length a string field declares."""
    pattern = None
    shortest = longest = None
    for item in field.metadata if field is not None else ():
        declared = getattr(item, "pattern", None)
        if isinstance(declared, str):
            pattern = re.compile(declared)
        longest = getattr(item, "max_length", longest)
        shortest = getattr(item, "min_length", shortest)
    return pattern, shortest, longest


def _fits(text: str, field: FieldInfo | None) -> bool:
    pattern, shortest, longest = _string_rules(field)
    if pattern is not None and pattern.search(text) is None:
        return False
    if shortest is not None and len(text) < shortest:
        return False
    return longest is None or len(text) <= longest


def _ascii_digits(text: str) -> str:
    return "".join(
        str(unicodedata.decimal(char)) if not char.isascii() and char.isdecimal() else char
        for char in text
    )


def _visible(text: str) -> str:
    return "".join(char for char in text if unicodedata.category(char) != _INVISIBLE)


def _repaired(value: object, field: FieldInfo | None, description: str | None) -> str | None:
    """The value with only its form mended (case, width, invisible characters, digits of another
    script, the separators of the description's example), if that is what the field takes: the
    model meant that value, and wrote it wrongly."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 128:
        value = str(value)
    if not isinstance(value, str) or field is None or len(value) > 256:
        return None
    normal = _ascii_digits(unicodedata.normalize("NFKC", value))
    for candidate in (normal, normal.strip(), _visible(normal)):
        for form in (candidate, candidate.upper(), candidate.lower()):
            if form != value and _fits(form, field):
                return form
    return _in_shape_of_example(_visible(normal), field, description)


def _in_shape_of_example(text: str, field: FieldInfo | None, description: str | None) -> str | None:
    """ "ORD 1001", "#1001" or 1001 as the example ORD-1001 writes it: the same number, with the
    example's separators, and its letters where the value has the same ones or the pattern
    requires them (ORD- is in the pattern, so 1001 is ORD-1001); never other letters than the
    value's ("CUS-1001" is not an order id)."""
    example = _example(field, description)
    shape = re.fullmatch(r"([^0-9]*)[0-9]+([^0-9]*)", example) if example else None
    numbers = re.findall(r"[0-9]+", text)
    if shape is None or len(numbers) != 1:
        return None
    prefix, suffix = shape.groups()
    letters = re.sub(r"[^A-Za-z]", "", text).upper()
    if letters and letters != re.sub(r"[^A-Za-z]", "", prefix + suffix).upper():
        return None
    pattern, _, _ = _string_rules(field)
    if (
        not letters
        and pattern is not None
        and not (prefix in pattern.pattern and suffix in pattern.pattern)
    ):
        return None
    shaped = f"{prefix}{numbers[0]}{suffix}"
    return shaped if shaped != text and _fits(shaped, field) else None


def _example(field: FieldInfo | None, description: str | None) -> str | None:
    """The first word of the description that the field itself would take."""
    if field is None or not description:
        return None
    for word in description.split():
        token = word.strip(_TOKEN_EDGES)
        if token and _fits(token, field):
            return token
    return None


def _string_fix(value: object, field: FieldInfo | None, description: str | None) -> str:
    """What to send instead of a string the field's pattern or length refuses."""
    repaired = _repaired(value, field, description)
    if repaired is not None:
        return f" (send {_json(repaired)})"
    # The description says what the value is, and gives the pattern's example.
    return _hint(description)


# Other types ---------------------------------------------------------------------------------

_EXPECTED_TYPES = {
    "string_type": "a string",
    "bool_type": "a boolean",
    "float_type": "a number",
    "dict_type": "an object",
    "model_type": "an object",
    "list_type": "an array",
}


def _type_fix(kind: str, value: object, field: FieldInfo | None, description: str | None) -> str:
    if kind == "string_type" and isinstance(value, int | float) and not isinstance(value, bool):
        text = _json(value)
        if _fits(text, field):
            return f" (send {_json(text)}, in quotes)"
        repaired = _repaired(value, field, description)
        if repaired is not None:
            return f" (send {_json(repaired)}, in quotes)"
    written = value.strip().lower() if isinstance(value, str) else None
    if kind == "bool_type" and written in ("true", "false"):
        return f" (send {written}, without quotes)"
    if kind == "float_type":
        number = _number_of(value)
        if number is not None and isinstance(value, str):
            return f" (send the number {number}, not a string)"
    return _hint(description)
