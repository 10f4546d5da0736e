"""The simulated model corrects a rejected call from the text it got back, and from nothing else.

Its corrections are checked against the real pipeline (the core, with the in-memory store): each
deliberate mistake of the simulation, told what to send, passes on the next call.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from demo.simulation import HintReader
from tests.dispatch.pipeline.conftest import Harness, build_harness

MEANT = {"order_id": "ORD-1001", "amount_cents": 2590, "currency": "BRL", "reason": "not_delivered"}


class NoGuessing(random.Random):
    """A model that must not guess: where the hint says what to send, chance plays no part."""

    def random(self) -> float:
        raise AssertionError("the model had to guess")

    def choice(self, seq: Any) -> Any:
        raise AssertionError("the model had to guess")


def sent_with(**changes: Any) -> dict[str, Any]:
    sent = {**MEANT, **changes}
    return {key: value for key, value in sent.items() if value is not None}


# What the model sent, and what it means to send (which its correction must be).
MISTAKES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "a whole float": (sent_with(amount_cents=2590.0), MEANT),
    "a string of the number": (sent_with(amount_cents="2590"), MEANT),
    "major units as a float": (sent_with(amount_cents=25.9), MEANT),
    "major units as a string": (sent_with(amount_cents="25.90"), MEANT),
    "one major unit as a string": (sent_with(amount_cents="1.00"), {**MEANT, "amount_cents": 100}),
    "a negative amount": (sent_with(amount_cents=-2590), MEANT),
    "a lower-case currency": (sent_with(currency="brl"), MEANT),
    "a reason with a space": (sent_with(reason="not delivered"), MEANT),
    "an order id in full-width digits": (sent_with(order_id="ORD-\uff11\uff10\uff10\uff11"), MEANT),
    "an order id with a zero-width space": (sent_with(order_id="ORD-10\u200b01"), MEANT),
    "an order id as a number": (sent_with(order_id=1001), MEANT),
    "a lower-case order id": (sent_with(order_id="ord-1001"), MEANT),
    "an order id with a space": (sent_with(order_id="ORD 1001"), MEANT),
    "a field under its own name": ({**sent_with(amount_cents=None), "amount": 2590}, MEANT),
    "a missing field": (sent_with(currency=None), MEANT),
    "an invented field": ({**MEANT, "notify_customer": True}, MEANT),
    "two mistakes at once": (sent_with(amount_cents=25.9, currency="brl"), MEANT),
}


@pytest.mark.parametrize(("sent", "meant"), MISTAKES.values(), ids=MISTAKES.keys())
def test_it_sends_what_the_message_says_and_the_call_passes(
    sent: dict[str, Any], meant: dict[str, Any]
) -> None:
    harness = build_harness()
    rejected = harness.call("refund_order", json.dumps(sent))

    correction = HintReader(NoGuessing()).correct(
        tool="refund_order",
        sent=sent,
        result=rejected.as_dict(),
        meant=MEANT,
        meant_tool="refund_order",
    )

    assert rejected.code == "INVALID_ARGUMENTS"
    assert correction == ("refund_order", meant)
    assert harness.call("refund_order", json.dumps(meant)).ok


def test_where_the_message_does_not_say_what_to_send_it_gives_up_or_guesses() -> None:
    result = {"code": "INVALID_ARGUMENTS", "message": "amount_cents: invalid"}
    sent = sent_with(amount_cents=2590.0)

    corrections = [
        HintReader(random.Random(seed)).correct(
            tool="refund_order", sent=sent, result=result, meant=MEANT, meant_tool="refund_order"
        )
        for seed in range(40)
    ]

    assert None in corrections
    guesses = [correction[1]["amount_cents"] for correction in corrections if correction]
    assert guesses
    assert set(guesses) != {2590}


def run_once(harness: Harness, tool: str, sent: dict[str, Any], meant_tool: str) -> Any:
    result = harness.call(tool, json.dumps(sent)).as_dict()
    return HintReader(NoGuessing()).correct(
        tool=tool, sent=sent, result=result, meant=MEANT, meant_tool=meant_tool
    )


def test_it_refunds_in_the_currency_the_message_names() -> None:
    harness = build_harness()

    correction = run_once(harness, "refund_order", sent_with(currency="USD"), "refund_order")

    assert correction == ("refund_order", MEANT)


def test_told_to_ask_the_user_it_sends_the_id_the_user_gives() -> None:
    harness = build_harness()

    correction = run_once(harness, "refund_order", sent_with(order_id="ORD-10010"), "refund_order")

    assert correction == ("refund_order", MEANT)


def test_it_calls_the_tool_it_meant_when_the_message_lists_it() -> None:
    harness = build_harness()
    sent = {"order_id": "ORD-1001"}

    listed = run_once(harness, "lookup_order", sent, "get_order")
    not_listed = run_once(harness, "lookup_order", sent, "teleport_order")

    assert listed == ("get_order", sent)
    assert not_listed is None


def test_told_its_text_is_not_json_it_sends_the_object_it_meant() -> None:
    harness = build_harness()
    result = harness.call("refund_order", json.dumps(MEANT)[:-1]).as_dict()

    correction = HintReader(NoGuessing()).correct(
        tool="refund_order", sent=MEANT, result=result, meant=MEANT, meant_tool="refund_order"
    )

    assert result["code"] == "INVALID_JSON"
    assert correction == ("refund_order", MEANT)
