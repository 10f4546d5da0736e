"""A tool whose money comes from its subject's state rather than an argument: a cancellation
refunds what is left on the order, and that money is judged like any other."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline import Pipeline
from dispatch.pipeline.engine import Limits
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    Money,
    MoneyFromState,
    Risk,
    ToolCall,
    ToolSpec,
)
from orders.book import InMemoryOrderBook
from tests.dispatch.pipeline.conftest import Harness, default_policy


class CancelArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    order_id: str = Field(pattern=r"^ORD-[0-9]{1,12}$")


def cancellation(book: InMemoryOrderBook) -> ToolSpec[CancelArguments]:
    def what_is_left(arguments: CancelArguments, context: CheckContext) -> Money | None:
        order = book.find(customer_id=context.customer_id, order_id=arguments.order_id)
        if order is None or not order.refundable_cents:
            return None
        return Money(order.refundable_cents, order.currency, order.order_id)

    def cancel(arguments: CancelArguments, context: ExecutionContext) -> Mapping[str, Any]:
        order = book.find(customer_id=context.customer_id, order_id=arguments.order_id)
        assert order is not None
        receipt = book.refund(
            customer_id=context.customer_id,
            order_id=order.order_id,
            amount_cents=order.refundable_cents,
            currency=order.currency,
            reason="customer_request",
            key=context.idempotency_key,
            approved_by=context.approved_by,
        )
        return {"order_id": receipt.order_id, "refunded_cents": receipt.amount_cents}

    return ToolSpec(
        name="cancel_for_test",
        description="cancel an order and refund what is left of it",
        arguments=CancelArguments,
        handler=cancel,
        writes=True,
        risk=Risk.HIGH,
        money=MoneyFromState(what_is_left),
    )


def run(harness: Harness, order_id: str, session: str = "s-1") -> dict[str, Any]:
    harness.pipeline.registry.register(cancellation(harness.book))
    pipeline = Pipeline(
        harness.pipeline.registry,
        harness.state,
        limits=Limits(),
        clock=harness.clock,
        monotonic=harness.clock.monotonic,
        sleep=harness.clock.sleep,
    )
    policy = default_policy(allowed_tools=frozenset({"cancel_for_test", "refund_order"}))
    call = ToolCall(
        "agent-1", session, "CUS-1", "cancel_for_test", json.dumps({"order_id": order_id})
    )
    return pipeline.run(call, policy).as_dict()


def test_the_money_of_a_cancellation_is_what_is_left_of_its_order(harness: Harness) -> None:
    harness.book.add("ORD-7001", "CUS-1", 3_000, "USD")

    result = run(harness, "ORD-7001")

    assert result["code"] == "OK"
    assert harness.refunded_cents("ORD-7001") == 3_000
    (_, currency, movement), *_ = harness.state.movements.values()
    assert (movement.amount_cents, currency, movement.subject) == (3_000, "USD", "ORD-7001")


def test_a_cancellation_worth_more_than_the_line_is_held_with_its_money(
    harness: Harness,
) -> None:
    harness.book.add("ORD-7002", "CUS-1", 30_000, "BRL")

    result = run(harness, "ORD-7002")

    assert result["code"] == "CONFIRMATION_REQUIRED"
    held = harness.state.confirmations[result["data"]["confirmation_id"]]
    assert (held.amount_cents, held.currency) == (30_000, "BRL")
    assert held.reviewers_required == 2
    assert harness.refunded_cents("ORD-7002") == 0


def test_a_cancellation_worth_more_than_the_maximum_is_refused(harness: Harness) -> None:
    result = run(harness, "ORD-2003")

    assert result["code"] == "POLICY_LIMIT"
    assert result["data"] == {"limit_cents": 50_000, "currency": "BRL"}
    assert harness.refunded_cents("ORD-2003") == 0
