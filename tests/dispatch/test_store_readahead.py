"""On PostgreSQL a call's opening statement also reads the record its tool declares as lookup.

The order tools declare the order; the gateway's first find in the call takes it from there with
no statement of its own. Over the budget nothing is read, and nothing outlives the call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch import readahead
from dispatch.models import Agent
from dispatch.pipeline.state import ClaimRequest, Opening
from dispatch.services import call_dispatch
from dispatch.store import OrmState
from orders.book import OrderView, order_lookup
from orders.gateway import OrmOrderBook
from orders.models import Order
from tests.conftest import MakeAgent

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL: only there is the opening one statement that can read ahead",
    ),
    pytest.mark.usefixtures("orders"),
]

ORDER_1001 = order_lookup(customer_id="CUS-1", order_id="ORD-1001")


def _open(agent: Agent, lookup_of: str, *, customer: str = "CUS-1", budget: int = 20) -> Opening:
    lookup = order_lookup(customer_id=customer, order_id=lookup_of)
    claim = ClaimRequest("k" * 64, "get_order", False, 3, datetime.now(UTC), lookup)
    return OrmState().open_call(
        agent_id=str(agent.pk),
        session_id="s-1",
        customer_id=customer,
        step_budget=budget,
        claim=claim,
    )


@contextmanager
def _statements() -> Iterator[CaptureQueriesContext]:
    with CaptureQueriesContext(connection) as queries:
        yield queries


def test_the_opening_reads_the_order_and_find_takes_it_without_a_statement(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    book = OrmOrderBook()

    with OrmState().call_scope():
        with _statements() as opening:
            _open(agent, "ORD-1001")
        with _statements() as first:
            order = book.find(customer_id="CUS-1", order_id="ORD-1001")
        with _statements() as second:
            again = book.find(customer_id="CUS-1", order_id="ORD-1001")

    assert len(opening) == 1
    assert order == OrderView("ORD-1001", "CUS-1", 12_000, "BRL", 0)
    assert len(first) == 0
    # Only the first read is served: a later one sees the order as it is now.
    assert again == order
    assert len(second) == 1


def test_an_order_that_is_not_there_is_read_ahead_as_none(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    with OrmState().call_scope():
        _open(agent, "ORD-9999")

        assert readahead.take(order_lookup(customer_id="CUS-1", order_id="ORD-9999")) == (
            True,
            None,
        )


def test_another_customers_order_is_read_ahead_as_none(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent, _ = make_agent()
    assert orders["ORD-1002"].customer_id == "CUS-2"

    with OrmState().call_scope():
        _open(agent, "ORD-1002")
        found, order = readahead.take(order_lookup(customer_id="CUS-1", order_id="ORD-1002"))

    assert (found, order) == (True, None)


def test_a_call_over_its_budget_reads_nothing_ahead(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    with OrmState().call_scope():
        _open(agent, "ORD-1001", budget=1)
    with OrmState().call_scope():
        opening = _open(agent, "ORD-1001", budget=1)

        assert opening.step == 2
        assert opening.claim is None
        assert readahead.take(ORDER_1001) == (False, None)


def test_what_was_read_ahead_does_not_outlive_the_call(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    with OrmState().call_scope():
        _open(agent, "ORD-1001")

    assert readahead.take(ORDER_1001) == (False, None)


def test_a_refunds_check_uses_the_order_read_ahead_and_its_answer_is_right(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent, _ = make_agent()
    # An earlier refund, with its ledger row: the database refuses refunded_cents without one.
    OrmOrderBook().refund(
        customer_id="CUS-1",
        order_id="ORD-1001",
        amount_cents=11_500,
        currency="BRL",
        reason="damaged",
        key="earlier",
        approved_by="policy",
    )
    arguments = {
        "order_id": "ORD-1001",
        "amount_cents": 600,
        "currency": "BRL",
        "reason": "damaged",
    }

    with _statements() as queries:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(arguments),
        )

    assert result.code == "AMOUNT_EXCEEDS_REFUNDABLE"
    assert result.data == {"refundable_cents": 500}
    # The opening's WITH holds the order's read; no statement reads the order on its own.
    assert not any(query["sql"].lstrip().startswith("SELECT order_id") for query in queries)
    orders["ORD-1001"].refresh_from_db()
    assert orders["ORD-1001"].refunded_cents == 11_500
