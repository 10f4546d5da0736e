"""Validation messages that fit what was sent: each names the field, the value the model sent, the
problem and what to send instead, derived from the field's declaration alone."""

from __future__ import annotations

import enum
import json
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dispatch.pipeline.messages import ECHO_CHARS, MAX_PARTS, describe_validation_error
from dispatch.pipeline.strictjson import loads
from orders.tools import GetOrderArguments, RefundOrderArguments

VALID = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def message_for(model: type[BaseModel], document: Any, *, strict: bool = True) -> str:
    try:
        model.__pydantic_validator__.validate_python(document, strict=strict)
    except ValidationError as exc:
        return describe_validation_error(model, exc)
    raise AssertionError(f"{document!r} is valid")


def refund_message(**changes: Any) -> str:
    return message_for(RefundOrderArguments, {**VALID, **changes})


# Numbers -------------------------------------------------------------------------------------


def test_it_tells_a_whole_float_to_be_sent_as_the_integer() -> None:
    message = refund_message(amount_cents=2590.0)

    assert message == "amount_cents: 2590.0 is not an integer (send the number 2590)"


def test_it_turns_a_fraction_into_minor_units_from_the_descriptions_example() -> None:
    message = refund_message(amount_cents=25.9)

    assert message == (
        "amount_cents: 25.9 is not an integer "
        "(send an integer in minor units, such as 2590 for 25.90)"
    )


def test_it_converts_the_value_sent_not_only_the_example() -> None:
    message = refund_message(amount_cents=12.5)

    assert message.endswith("(send an integer in minor units, such as 1250 for 12.50)")


def test_a_fraction_finer_than_the_minor_unit_gets_the_descriptions_example() -> None:
    message = refund_message(amount_cents=25.999)

    assert message.endswith("(send an integer in minor units, such as 2590 for 25.90)")


def test_it_tells_a_numeric_string_to_be_sent_as_a_number() -> None:
    message = refund_message(amount_cents="2590")

    assert message == (
        'amount_cents: "2590" is a string, not an integer (send the number 2590, not a string)'
    )


def test_a_string_in_major_units_gets_the_minor_units_to_send() -> None:
    fraction = refund_message(amount_cents="25.90")
    whole = refund_message(amount_cents="1.00")

    assert fraction == (
        'amount_cents: "25.90" is a string, not an integer '
        "(send an integer in minor units, such as 2590 for 25.90, not a string)"
    )
    # Written with the minor unit's two decimals: one unit, 100 in minor units.
    assert whole.endswith("(send an integer in minor units, such as 100 for 1.00, not a string)")


def test_a_whole_float_outside_the_bounds_gets_the_bounds_not_the_integer() -> None:
    message = refund_message(amount_cents=1e12)

    assert message == (
        "amount_cents: 1000000000000.0 is not an integer "
        "(send a whole number from 1 up to 100000000)"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "true is a boolean"), (None, "null is"), ({"value": 1}, '{"value":1} is an object')],
)
def test_a_value_of_another_type_gets_the_fields_description(value: Any, shown: str) -> None:
    message = refund_message(amount_cents=value)

    assert message.startswith(f"amount_cents: {shown}")
    assert message.endswith(
        "not an integer (amount in minor units of the order's currency, as an integer: "
        "25.90 is 2590 (in JPY, which has no minor unit, ¥500 is sent as 500, and in KWD, which "
        "has three decimals, 1.250 KWD as 1250))"
    )


def test_it_gives_the_bound_of_a_number_out_of_range() -> None:
    zero = refund_message(amount_cents=0)
    too_large = refund_message(amount_cents=100_000_001)

    assert zero == "amount_cents: 0 is below the minimum of 1 (send at least 1)"
    assert too_large == (
        "amount_cents: 100000001 is above the maximum of 100000000 (send at most 100000000)"
    )


def test_a_negative_amount_is_told_the_positive_one() -> None:
    message = refund_message(amount_cents=-2590)

    assert (
        message == "amount_cents: -2590 is below the minimum of 1 (send at least 1, such as 2590)"
    )


def test_a_number_too_long_to_print_is_described_not_echoed() -> None:
    message = refund_message(amount_cents=10**5000)

    assert message == (
        "amount_cents: a number of about 5001 digits is above the maximum of 100000000 "
        "(send at most 100000000)"
    )


# Allowed values ------------------------------------------------------------------------------


def test_it_names_the_allowed_values_and_the_one_meant() -> None:
    message = refund_message(currency="brl")

    assert message == (
        'currency: "brl" is not one of "BRL", "USD", "EUR", "JPY", "KWD" (send "BRL")'
    )


@pytest.mark.parametrize(
    ("sent", "meant"),
    [
        ("not delivered", "not_delivered"),
        ("Customer-Request", "customer_request"),
        ("damage", "damaged"),
    ],
)
def test_the_one_meant_is_the_same_up_to_case_separators_or_a_letter(sent: str, meant: str) -> None:
    message = refund_message(reason=sent)

    assert message.endswith(f'(send "{meant}")')


def test_with_no_obvious_value_it_lists_them_and_says_what_the_field_is() -> None:
    message = refund_message(currency="GBP")

    assert message == (
        'currency: "GBP" is not one of "BRL", "USD", "EUR", "JPY", "KWD" '
        "(the order's own currency, one of BRL, USD, EUR, JPY, KWD (never converted))"
    )


# Strings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order_id", "shown"),
    [
        ("ORD-\uff11\uff10\uff10\uff11", '"ORD-\\uff11\\uff10\\uff10\\uff11"'),
        ("ORD-\u0661\u0660\u0660\u0661", '"ORD-\\u0661\\u0660\\u0660\\u0661"'),
        ("ORD-10\u200b01", '"ORD-10\\u200b01"'),
        ("ORD-1001\n", '"ORD-1001\\n"'),
        ("ord-1001", '"ord-1001"'),
        ("ORD 1001", '"ORD 1001"'),
        ("#1001", '"#1001"'),
    ],
    ids=[
        "full-width digits",
        "Arabic-Indic digits",
        "a zero-width space",
        "a newline",
        "lower case",
        "a space",
        "a hash",
    ],
)
def test_a_mistyped_id_shows_its_escapes_and_the_id_to_send(order_id: str, shown: str) -> None:
    message = refund_message(order_id=order_id)

    assert message == f'order_id: {shown} does not match ^ORD-[0-9]{{1,12}}$ (send "ORD-1001")'


def test_a_look_alike_letter_is_shown_with_the_pattern_and_its_example() -> None:
    message = refund_message(order_id="\u041eRD-1001")

    assert message == (
        'order_id: "\\u041eRD-1001" does not match ^ORD-[0-9]{1,12}$ '
        "(the order's id as the user gave it: ORD- and ASCII digits, such as ORD-1001)"
    )


def test_an_id_with_other_letters_is_not_made_into_one() -> None:
    message = refund_message(order_id="CUS-1001")

    assert "send" not in message
    assert message.endswith("such as ORD-1001)")


def test_an_id_sent_as_a_number_is_told_the_string_to_send() -> None:
    message = refund_message(order_id=1001)

    assert message == 'order_id: 1001 is a number, not a string (send "ORD-1001", in quotes)'


class Parcel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parcel_id: str = Field(max_length=16, description="the carrier's parcel id")


def test_a_string_too_long_is_told_its_length_and_the_limit() -> None:
    message = message_for(Parcel, {"parcel_id": "P" * 24})

    assert message.startswith(f'parcel_id: "{"P" * 24}" has 24 characters, more than 16 (')


def test_an_order_id_too_long_is_told_its_pattern() -> None:
    message = refund_message(order_id="ORD-" + "1" * 20)

    assert message.startswith(
        'order_id: "ORD-11111111111111111111" does not match ^ORD-[0-9]{1,12}$'
    )


# Missing and unknown fields ------------------------------------------------------------------


def test_a_missing_field_is_named_with_what_it_is() -> None:
    message = message_for(RefundOrderArguments, {"order_id": "ORD-1001", "amount_cents": 100})

    assert message == (
        "currency: required but not sent (the order's own currency, one of BRL, USD, EUR, JPY, "
        "KWD (never converted)); reason: required but not sent (why the customer is refunded: "
        "damaged, not_delivered or customer_request)"
    )


def test_an_unknown_field_lists_the_fields_there_are() -> None:
    message = message_for(GetOrderArguments, {"order_id": "ORD-1001", "customer_id": "CUS-2"})

    assert message == "customer_id: unknown field (the only fields are: order_id)"


def test_a_field_sent_under_a_name_of_its_own_is_told_the_declared_name() -> None:
    sent = {key: value for key, value in VALID.items() if key != "amount_cents"}

    message = message_for(RefundOrderArguments, {**sent, "amount": 2590})

    assert message.endswith(
        "amount: unknown field (did you mean amount_cents? "
        "the only fields are: order_id, amount_cents, currency, reason)"
    )


def test_many_unknown_fields_get_one_part() -> None:
    invented = {f"extra_{number}": number for number in range(20)}

    message = message_for(RefundOrderArguments, {**VALID, **invented})

    assert message == (
        "extra_0, extra_1, extra_2, extra_3, extra_4 and 15 more: unknown fields "
        "(the only fields are: order_id, amount_cents, currency, reason)"
    )


# Bounded and escaped -------------------------------------------------------------------------


def test_a_huge_value_is_echoed_cut_short() -> None:
    message = message_for(Parcel, {"parcel_id": "x" * 1_000_000})

    assert message.startswith(f'parcel_id: "{"x" * ECHO_CHARS}"... has 1000000 characters')
    assert len(message) < 300


def test_a_huge_array_is_echoed_cut_short() -> None:
    message = refund_message(amount_cents=list(range(100_000)))

    assert message.startswith(
        "amount_cents: [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,1... is an array"
    )
    assert len(message) < 300


def test_a_field_name_that_is_not_a_plain_name_is_escaped() -> None:
    name = "x\n\u202e\u0000" * 100

    message = message_for(GetOrderArguments, {"order_id": "ORD-1001", name: 1})

    assert message.startswith('"x\\n\\u202e\\u0000x\\n\\u202e\\u0000')
    assert message.endswith('"...: unknown field (the only fields are: order_id)')
    assert message.isascii() and message.isprintable()


def test_it_never_cuts_an_echo_inside_an_escape() -> None:
    message = refund_message(amount_cents={"note": "é" * 100})

    echoed = message.split(": ", 1)[1].split(" is an object")[0]
    assert echoed == '{"note":"\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9...'


def test_it_lists_a_bounded_number_of_problems() -> None:
    class Wide(BaseModel):
        model_config = ConfigDict(strict=True)

        fields: dict[str, int]

    message = message_for(Wide, {"fields": {f"k{number}": "x" for number in range(50)}})

    assert message.count("; ") == MAX_PARTS
    assert message.endswith("arguments: 42 more problems not listed")
    assert message.startswith('fields.k0: "x" is a string, not an integer; fields.k1: ')


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=30), JSON_VALUES, max_size=12))
def test_whatever_is_sent_the_message_is_short_and_printable(document: dict[str, Any]) -> None:
    try:
        RefundOrderArguments.__pydantic_validator__.validate_python(document, strict=True)
    except ValidationError as exc:
        message = describe_validation_error(RefundOrderArguments, exc)
    else:
        return

    assert message.isprintable()
    assert len(message) < 3000
    json.dumps(message)


# Any declaration, not one domain's -----------------------------------------------------------


class Cabin(enum.Enum):
    ECONOMY = "economy"
    BUSINESS = "business"


class Booking(BaseModel):
    """Another domain's arguments: every hint comes from these declarations."""

    model_config = ConfigDict(extra="forbid")

    seats: int = Field(gt=0, lt=10, description="how many seats")
    fare_cents: int = Field(ge=0, description="the fare in cents: 12.50 is 1250")
    flight: str = Field(pattern=r"^[A-Z]{2}[0-9]{1,4}$", description="the flight, e.g. LH400")
    cabin: Cabin = Cabin.ECONOMY
    meal: Literal["vegetarian", "standard"] = "standard"
    window: bool = False


BOOKING = {"seats": 1, "fare_cents": 1250, "flight": "LH400"}

OTHER_DOMAIN = {
    "an open lower bound": ({"seats": 0}, "seats: 0 is not above 0 (send more than 0)"),
    "an open upper bound": ({"seats": 10}, "seats: 10 is not below 10 (send less than 10)"),
    "its own worked example": (
        {"fare_cents": 12.75},
        "fare_cents: 12.75 is not an integer (send an integer, such as 1275 for 12.75)",
    ),
    "a pattern's case": (
        {"flight": "lh400"},
        'flight: "lh400" does not match ^[A-Z]{2}[0-9]{1,4}$ (send "LH400")',
    ),
    "letters the pattern does not fix": (
        {"flight": "400"},
        'flight: "400" does not match ^[A-Z]{2}[0-9]{1,4}$ (the flight, e.g. LH400)',
    ),
    "an enum's value": (
        {"cabin": "Business"},
        'cabin: "Business" is not one of "economy", "business" (send "business")',
    ),
    "a literal's value": (
        {"meal": "vegan"},
        'meal: "vegan" is not one of "vegetarian", "standard" (send one of them)',
    ),
    "a boolean as a string": (
        {"window": "yes"},
        'window: "yes" is a string, not a boolean',
    ),
}


@pytest.mark.parametrize(("changes", "expected"), OTHER_DOMAIN.values(), ids=OTHER_DOMAIN.keys())
def test_the_hints_of_another_domain_come_from_its_declarations(
    changes: dict[str, Any], expected: str
) -> None:
    # Lax, as a tool with an enum must be: strict mode takes only an instance of the enum.
    message = message_for(Booking, {**BOOKING, **changes}, strict=changes.get("cabin") is None)

    assert message == expected


# What the model wrote, where it arrived as text ----------------------------------------------


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        (
            "80.00",
            "80.00 is not an integer (send an integer in minor units, such as 8000 for 80.00)",
        ),
        ("2590.0", "2590.0 is not an integer (send the number 2590)"),
        ("25.9", "25.9 is not an integer (send an integer in minor units, such as 2590 for 25.90)"),
    ],
)
def test_a_number_written_as_money_is_told_in_minor_units(written: str, hint: str) -> None:
    arguments = loads(
        json.dumps(VALID).replace('"amount_cents": 1000', f'"amount_cents": {written}')
    )

    message = message_for(RefundOrderArguments, arguments)

    assert message == f"amount_cents: {hint}"
