"""Invalid arguments of every kind, through real HTTP: each gets its code, a 200 with the result
contract (never a 500), and moves no money."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatch.models import AuditRecord
from tests.conftest import AgentClient, Ledger

pytestmark = pytest.mark.usefixtures("orders")

VALID = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}
VALID_TEXT = json.dumps(VALID)


def refund_with(**changes: Any) -> dict[str, Any]:
    return {**VALID, **changes}


def without(name: str) -> dict[str, Any]:
    return {key: value for key, value in VALID.items() if key != name}


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# (case, arguments as sent, code, a phrase the message must hold)
CASES: list[tuple[str, Any, str, str]] = [
    # Not JSON at all.
    ("prose", "please refund ORD-1001", "INVALID_JSON", "Expecting value"),
    ("empty text", "", "INVALID_JSON", "Expecting value"),
    ("single quotes", "{'order_id': 'ORD-1001'}", "INVALID_JSON", "property name"),
    ("trailing comma", '{"order_id": "ORD-1001",}', "INVALID_JSON", "property name"),
    ("two objects", VALID_TEXT + VALID_TEXT, "INVALID_JSON", "Extra data"),
    ("a comment", VALID_TEXT + " // refund it", "INVALID_JSON", "Extra data"),
    ("markdown fence", f"```json\n{VALID_TEXT}\n```", "INVALID_JSON", "Expecting value"),
    ("truncated", VALID_TEXT[:-5], "INVALID_JSON", "line 1"),
    # JSON, but not an object.
    ("an array as text", "[]", "INVALID_JSON", "must be a JSON object, not an array"),
    ("a string as text", '"ORD-1001"', "INVALID_JSON", "must be a JSON object, not a string"),
    ("a number as text", "1000", "INVALID_JSON", "must be a JSON object, not a number"),
    ("null as text", "null", "INVALID_JSON", "must be a JSON object, not null"),
    ("a boolean as text", "true", "INVALID_JSON", "must be a JSON object, not a boolean"),
    ("an array", [VALID], "INVALID_JSON", "must be a JSON object, not an array"),
    ("a number", 1000, "INVALID_JSON", "must be a JSON object, not a number"),
    ("null", None, "INVALID_JSON", "must be a JSON object, not null"),
    ("a boolean", False, "INVALID_JSON", "must be a JSON object, not a boolean"),
    # Ambiguous JSON: two readers could disagree about what was asked.
    (
        "a duplicate key",
        '{"order_id": "ORD-1001", "amount_cents": 1, "amount_cents": 100000, '
        '"currency": "BRL", "reason": "damaged"}',
        "INVALID_JSON",
        "key 'amount_cents' appears more than once",
    ),
    ("NaN", VALID_TEXT.replace("1000", "NaN"), "INVALID_JSON", "NaN is not JSON"),
    ("Infinity", VALID_TEXT.replace("1000", "Infinity"), "INVALID_JSON", "Infinity is not JSON"),
    ("-Infinity", VALID_TEXT.replace("1000", "-Infinity"), "INVALID_JSON", "is not JSON"),
    ("1e400", VALID_TEXT.replace("1000", "1e400"), "INVALID_JSON", "out of range"),
    ("5000 digits", VALID_TEXT.replace("1000", "9" * 5000), "INVALID_JSON", "digits"),
    ("a lone surrogate", VALID_TEXT.replace("damaged", "\\ud800"), "INVALID_JSON", "surrogate"),
    # Too big or too deep.
    (
        "over the argument limit",
        json.dumps(refund_with(reason="x" * 9000)),
        "INVALID_JSON",
        "larger than 8192 bytes",
    ),
    (
        "over the limit in UTF-8 bytes, not characters",
        json.dumps(refund_with(reason="é" * 4200), ensure_ascii=False),
        "INVALID_JSON",
        "larger than 8192 bytes",
    ),
    (
        "an object over the argument limit",
        refund_with(reason="x" * 9000),
        "INVALID_JSON",
        "larger than 8192 bytes",
    ),
    ("nested 40 deep", nested(40), "INVALID_JSON", "nested deeper than 32 levels"),
    ("nested 4000 deep", "[" * 4000 + "]" * 4000, "INVALID_JSON", "nested deeper than 32"),
    # The schema: extra fields, wrong types, numbers out of range, look-alike ids.
    (
        "an extra field",
        refund_with(note="urgent"),
        "INVALID_ARGUMENTS",
        "note: unknown field (the only fields are: order_id, amount_cents, currency, reason)",
    ),
    ("a missing field", without("currency"), "INVALID_ARGUMENTS", "currency: required but not"),
    ("no fields", {}, "INVALID_ARGUMENTS", "order_id: required but not sent"),
    (
        "an amount as a string",
        refund_with(amount_cents="1000"),
        "INVALID_ARGUMENTS",
        'amount_cents: "1000" is a string, not an integer (send the number 1000, not a string)',
    ),
    (
        "an amount as a boolean",
        refund_with(amount_cents=True),
        "INVALID_ARGUMENTS",
        "amount_cents: true is a boolean, not an integer",
    ),
    (
        "an amount as a whole float",
        refund_with(amount_cents=1000.0),
        "INVALID_ARGUMENTS",
        "amount_cents: 1000.0 is not an integer (send the number 1000)",
    ),
    (
        "an amount in an object",
        refund_with(amount_cents={"value": 1000}),
        "INVALID_ARGUMENTS",
        'amount_cents: {"value":1000} is an object, not an integer',
    ),
    (
        "a null amount",
        refund_with(amount_cents=None),
        "INVALID_ARGUMENTS",
        "amount_cents: null is not an integer",
    ),
    (
        "an order id as a number",
        refund_with(order_id=1001),
        "INVALID_ARGUMENTS",
        'order_id: 1001 is a number, not a string (send "ORD-1001", in quotes)',
    ),
    (
        "a zero amount",
        refund_with(amount_cents=0),
        "INVALID_ARGUMENTS",
        "amount_cents: 0 is below the minimum of 1 (send at least 1)",
    ),
    (
        "a negative amount",
        refund_with(amount_cents=-1000),
        "INVALID_ARGUMENTS",
        "amount_cents: -1000 is below the minimum of 1 (send at least 1, such as 1000)",
    ),
    (
        "an amount over the bound",
        refund_with(amount_cents=100_000_001),
        "INVALID_ARGUMENTS",
        "amount_cents: 100000001 is above the maximum of 100000000 (send at most 100000000)",
    ),
    (
        "an amount over 64 bits",
        refund_with(amount_cents=10**30),
        "INVALID_ARGUMENTS",
        "is above the maximum of 100000000 (send at most 100000000)",
    ),
    (
        "a lower-case currency",
        refund_with(currency="brl"),
        "INVALID_ARGUMENTS",
        'currency: "brl" is not one of "BRL", "USD", "EUR", "JPY", "KWD" (send "BRL")',
    ),
    (
        "a currency with a Cyrillic Ve (U+0412)",
        refund_with(currency="\u0412RL"),
        "INVALID_ARGUMENTS",
        'currency: "\\u0412RL" is not one of "BRL", "USD", "EUR"',
    ),
    (
        "an unknown reason",
        refund_with(reason="changed_mind"),
        "INVALID_ARGUMENTS",
        'reason: "changed_mind" is not one of "damaged", "not_delivered", "customer_request"',
    ),
    (
        "an order id with fullwidth digits",
        refund_with(order_id="ORD-\uff11\uff10\uff10\uff11"),
        "INVALID_ARGUMENTS",
        'order_id: "ORD-\\uff11\\uff10\\uff10\\uff11" does not match ^ORD-[0-9]{1,12}$ '
        '(send "ORD-1001")',
    ),
    (
        "an order id with a Cyrillic O (U+041E)",
        refund_with(order_id="\u041eRD-1001"),
        "INVALID_ARGUMENTS",
        'order_id: "\\u041eRD-1001" does not match ^ORD-[0-9]{1,12}$ (the order\'s id',
    ),
    (
        "an order id with Arabic-Indic digits",
        refund_with(order_id="ORD-\u0661\u0660\u0660\u0661"),
        "INVALID_ARGUMENTS",
        'order_id: "ORD-\\u0661\\u0660\\u0660\\u0661" does not match ^ORD-[0-9]{1,12}$ '
        '(send "ORD-1001")',
    ),
    (
        "an order id with a trailing newline",
        refund_with(order_id="ORD-1001\n"),
        "INVALID_ARGUMENTS",
        'order_id: "ORD-1001\\n" does not match ^ORD-[0-9]{1,12}$ (send "ORD-1001")',
    ),
    (
        "an order id with a zero-width space",
        refund_with(order_id="ORD-10\u200b01"),
        "INVALID_ARGUMENTS",
        'order_id: "ORD-10\\u200b01" does not match ^ORD-[0-9]{1,12}$ (send "ORD-1001")',
    ),
]


@pytest.mark.parametrize(
    ("arguments", "code", "phrase"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_it_rejects_invalid_arguments_with_their_code_and_moves_no_money(
    api: AgentClient, ledger: Ledger, arguments: Any, code: str, phrase: str
) -> None:
    result = api.call("refund_order", arguments)

    assert result["code"] == code, result
    assert phrase in result["message"], result["message"]
    assert result["ok"] is False
    assert result["retryable"] is False
    assert result["message"].startswith("arguments: " if code == "INVALID_JSON" else "")
    assert result["model_text"].startswith(f"ERROR {code} refund_order:")
    assert ledger.state() == (0, 0)


def test_it_names_every_failing_field_at_once(api: AgentClient, ledger: Ledger) -> None:
    result = api.call(
        "refund_order", {"order_id": "ORD-1001", "amount_cents": 25.9, "currency": "usd"}
    )

    assert result["code"] == "INVALID_ARGUMENTS"
    fields = [part.split(":")[0] for part in result["message"].split("; ")]
    assert fields == ["amount_cents", "currency", "reason"]
    assert ledger.state() == (0, 0)


@pytest.mark.parametrize(
    ("order_id", "shown", "fix"),
    [
        ("ORD-\uff11\uff10\uff10\uff11", "\\uff11", '(send "ORD-1001")'),
        ("\u041eRD-1001", "\\u041e", "ORD- and ASCII digits, such as ORD-1001)"),
    ],
    ids=["fullwidth digits", "a Cyrillic O (U+041E)"],
)
def test_a_look_alike_order_id_never_reaches_the_order_book(
    api: AgentClient, ledger: Ledger, order_id: str, shown: str, fix: str
) -> None:
    result = api.call("get_order", {"order_id": order_id})

    assert result["code"] == "INVALID_ARGUMENTS"
    # The look-alike character shows as its escape, and the message says what to send instead.
    assert result["message"].startswith('order_id: "')
    assert shown in result["message"]
    assert "does not match ^ORD-[0-9]{1,12}$ (" in result["message"]
    assert result["message"].endswith(fix)
    assert ledger.state() == (0, 0)


def test_an_invalid_call_fixed_by_the_model_then_passes(api: AgentClient, ledger: Ledger) -> None:
    rejected = api.refund(25.90)
    fixed = api.refund(2590)

    assert rejected["code"] == "INVALID_ARGUMENTS"
    assert fixed["ok"] is True
    assert ledger.state() == (1, 2590)


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        # Arguments sent as an object are part of the envelope's own JSON, so what the envelope
        # parser refuses there is an envelope error, not a pipeline result.
        ('"arguments": ' + nested(40), "nested deeper than 32 levels"),
        ('"arguments": {"amount_cents": NaN}', "NaN is not JSON"),
        ('"arguments": {"amount_cents": 1, "amount_cents": 2}', "appears more than once"),
    ],
    ids=["nested 40 deep", "NaN", "a duplicate key"],
)
def test_ambiguous_json_in_an_argument_object_is_refused_with_the_envelope(
    api: AgentClient, ledger: Ledger, body: str, phrase: str
) -> None:
    response = api.post_body(
        '{"session_id": "s-1", "customer_id": "CUS-1", "tool": "refund_order", ' + body + "}"
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_envelope"
    assert phrase in response.json()["error"]["message"]
    assert ledger.state() == (0, 0)


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("get_order\u0000", {"order_id": "ORD-1001"}, "UNKNOWN_TOOL"),
        ("get_order", '{"order_id": "ORD-1001\u0000"}', "INVALID_JSON"),
        ("get_order", '{"order_id": "ORD-1001\\u0000"}', "INVALID_JSON"),
        ("get_order", {"order_id\u0000": "ORD-1001"}, "INVALID_JSON"),
        ("refund_order", {**VALID, "reason": "damaged\u0000"}, "INVALID_JSON"),
    ],
    ids=[
        "in the tool name",
        "raw in the argument text",
        "escaped in the argument text",
        "in a field name",
        "in a value",
    ],
)
def test_a_nul_character_anywhere_is_answered_and_audited(
    api: AgentClient, ledger: Ledger, tool: str, arguments: Any, code: str
) -> None:
    result = api.call(tool, arguments)

    assert result["code"] == code
    record = AuditRecord.objects.get()
    assert record.call_id == result["call_id"]
    assert "\u0000" not in record.tool + record.raw_arguments + record.message
    assert ledger.state() == (0, 0)
