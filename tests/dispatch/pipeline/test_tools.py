"""What a declaration says of a held call: the review of its subject, the words for it, and its
money."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    Money,
    MoneyFromArguments,
    MoneyFromState,
    Risk,
    ToolSpec,
    held_plurals,
)
from orders.tools import RefundOrderArguments
from tests.dispatch.pipeline.conftest import Harness

MONEY = FactKind.MONEY


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def nothing(arguments: NoArguments, context: ExecutionContext) -> dict[str, Any]:
    return {}


def refund_of(order_id: str) -> RefundOrderArguments:
    return RefundOrderArguments(
        order_id=order_id, amount_cents=6_000, currency="BRL", reason="damaged"
    )


def test_a_refund_is_reviewed_with_its_order_as_it_is_now(harness: Harness) -> None:
    spec = harness.pipeline.registry.get("refund_order")
    assert spec is not None and spec.review is not None
    harness.refund(2_590)

    review = spec.review(refund_of("ORD-1001"), "CUS-1")

    assert review == ReviewView(
        "Order",
        "ORD-1001",
        facts=(
            Fact("Order total", 12_000, MONEY),
            Fact("Already refunded", 2_590, MONEY),
            Fact("Still refundable", 9_410, MONEY),
        ),
    )


def test_another_customers_order_is_reviewed_as_not_found(harness: Harness) -> None:
    spec = harness.pipeline.registry.get("refund_order")
    assert spec is not None and spec.review is not None

    review = spec.review(refund_of("ORD-1002"), "CUS-1")

    assert review == ReviewView("Order", "ORD-1002", found=False)


def test_a_tool_that_declares_no_words_is_spoken_of_by_its_label() -> None:
    spec = ToolSpec(
        name="ship_replacement",
        label="Ship replacement",
        description="",
        arguments=NoArguments,
        handler=nothing,
    )

    words = spec.action_words

    assert (spec.title, words.noun, words.plural) == (
        "Ship replacement",
        "ship replacement call",
        "ship replacement calls",
    )


def test_what_a_human_may_decide_is_said_in_the_high_risk_tools_words(harness: Harness) -> None:
    vouchers = ToolWords(noun="voucher", plural="vouchers", verb="issue", past="issued")
    voucher = ToolSpec(
        name="issue_voucher",
        description="",
        arguments=NoArguments,
        handler=nothing,
        risk=Risk.HIGH,
        words=vouchers,
    )
    tools = list(harness.pipeline.registry)

    alone, with_vouchers = held_plurals(tools), held_plurals([*tools, voucher])

    assert (alone, with_vouchers) == ("refunds", "refunds and vouchers")
    assert held_plurals([]) == "held calls"


def test_a_refunds_money_is_known_from_its_arguments_before_anything_is_read(
    harness: Harness,
) -> None:
    spec = harness.pipeline.registry.get("refund_order")
    assert spec is not None

    ahead = spec.money_ahead(refund_of("ORD-1001"))

    assert ahead == Money(6_000, "BRL", "ORD-1001")
    assert spec.money_of(refund_of("ORD-1001"), CheckContext("CUS-1")) == ahead
    assert (spec.amount_field, spec.currency_field) == ("amount_cents", "currency")


def test_money_from_the_subjects_state_is_known_only_once_it_is_read() -> None:
    readers: list[str] = []

    def what_is_left(arguments: NoArguments, context: CheckContext) -> Money:
        readers.append(context.customer_id)
        return Money(2_500, "BRL", "ORD-1001")

    spec = ToolSpec(
        name="cancel_order",
        description="",
        arguments=NoArguments,
        handler=nothing,
        writes=True,
        money=MoneyFromState(what_is_left),
    )

    ahead = spec.money_ahead(NoArguments())
    judged = spec.money_of(NoArguments(), CheckContext("CUS-1"))

    assert ahead is None
    assert judged == Money(2_500, "BRL", "ORD-1001")
    assert readers == ["CUS-1"]
    assert (spec.amount_field, spec.currency_field) == (None, None)


def test_money_that_names_an_argument_the_tool_does_not_take_is_refused() -> None:
    with pytest.raises(ValueError, match="'amount_cents' is not an argument"):
        ToolSpec(
            name="issue_voucher",
            description="",
            arguments=NoArguments,
            handler=nothing,
            money=MoneyFromArguments(amount="amount_cents", currency="currency"),
        )
