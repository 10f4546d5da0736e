"""On PostgreSQL a call's opening also reads the record its tool declares as its lookup.

The store returns it in the opening (Opening.read_ahead), and the pipeline hands it to the tool's
first read through its context. Over the budget nothing is read. A call that would reserve money
takes its customer's money lock and reads the sum it is judged by in the same round trip.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from dispatch.models import Agent, Movement
from dispatch.pipeline.allowance import AllowanceRequest
from dispatch.pipeline.state import ClaimRequest, Opening, ReadAhead
from dispatch.registry import tool_registry
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


def _open(agent: Agent, lookup_of: str, *, customer: str = "CUS-1", budget: int = 20) -> Opening:
    lookup = order_lookup(customer_id=customer, order_id=lookup_of)
    claim = ClaimRequest("k" * 64, "get_order", False, 3, datetime.now(UTC), lookup)
    with connection.cursor() as cursor:
        return OrmState(cursor, tool_registry).open_call(
            agent_id=str(agent.pk),
            session_id="s-1",
            customer_id=customer,
            step_budget=budget,
            claim=claim,
        )


def test_the_opening_reads_the_order_in_the_same_statement(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    with CaptureQueriesContext(connection) as queries:
        opening = _open(agent, "ORD-1001")

    assert len(queries) == 1
    assert opening.read_ahead is not None and opening.read_ahead.value.placed_at is not None
    assert ReadAhead(opening.read_ahead.value._replace(placed_at=None)) == ReadAhead(
        OrderView("ORD-1001", "CUS-1", 12_000, "BRL", 0)
    )


def test_an_order_that_is_not_there_is_read_ahead_as_none(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    opening = _open(agent, "ORD-9999")

    assert opening.read_ahead == ReadAhead(None)


def test_another_customers_order_is_read_ahead_as_none(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent, _ = make_agent()
    assert orders["ORD-1002"].customer_id == "CUS-2"

    opening = _open(agent, "ORD-1002")

    assert opening.read_ahead == ReadAhead(None)


def test_a_call_over_its_budget_reads_nothing_ahead(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    _open(agent, "ORD-1001", budget=1)
    opening = _open(agent, "ORD-1001", budget=1)

    assert opening.step == 2
    assert opening.claim is None
    assert opening.read_ahead is None


def test_a_read_answers_from_the_order_read_ahead_without_a_statement_of_its_own(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()

    with CaptureQueriesContext(connection) as queries:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="get_order",
            arguments='{"order_id": "ORD-1001"}',
        )

    assert result.ok
    assert result.data["total_cents"] == 12_000
    assert not any(query["sql"].lstrip().startswith("SELECT order_id") for query in queries)


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
        approved_by=(),
    )
    arguments = {
        "order_id": "ORD-1001",
        "amount_cents": 600,
        "currency": "BRL",
        "reason": "damaged",
    }

    with CaptureQueriesContext(connection) as queries:
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


def test_a_refunds_opening_takes_its_customers_money_lock_and_reads_the_sum_it_is_judged_by(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    now = datetime.now(UTC)
    request = AllowanceRequest(
        key="k" * 64,
        agent_id=str(agent.pk),
        session_id="s-9",
        customer_id="CUS-9",
        tool="refund_order",
        subject="ORD-9",
        currency="BRL",
        amount_cents=700,
        at=now,
        since=now - timedelta(hours=1),
        agent_day_needed=False,
        confirmation_id="c" * 32,
        held_until=now + timedelta(hours=1),
    )
    claim = ClaimRequest("k" * 64, "refund_order", True, 3, now, None, request)
    other = connections[DEFAULT_DB_ALIAS].copy()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            state = OrmState(cursor, tool_registry)
            state.open_call(
                agent_id=str(agent.pk),
                session_id="s-9",
                customer_id="CUS-9",
                step_budget=20,
                claim=claim,
            )
            with other.cursor() as elsewhere:
                elsewhere.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
                    ["toolgate.customer:CUS-9:BRL"],
                )
                (lock_was_free,) = elsewhere.fetchone()
            # Money written after the opening: the request the opening read for is judged by
            # what it read then (nothing else can reserve under the lock); another reads anew.
            Movement.objects.create(
                key="m" * 64,
                agent_id=agent.pk,
                session_id="s-8",
                customer_id="CUS-9",
                currency="BRL",
                tool="refund_order",
                subject="ORD-8",
                amount_cents=300,
                approval="policy",
                at=now,
                day=now.date(),
            )
            judged, _ = state.reserve_allowance(request, lambda history: None)
            read_anew, _ = OrmState(cursor, tool_registry).reserve_allowance(
                request._replace(key="n" * 64), lambda history: None
            )
    finally:
        other.close()

    assert not lock_was_free
    assert judged.customer_window_cents == 0
    assert read_anew.customer_window_cents == 300
