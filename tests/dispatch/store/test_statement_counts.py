"""How many statements a call sends to the database: what docs/benchmarks.md counts.

On PostgreSQL the store counts the step, claims the key and reads the order the tool declares as
its lookup in one statement, settles the key with the audit record, and a refund takes from the
order and enters the ledger in one; SQLite, which has no data-modifying WITH, runs each of them
as separate statements. What managers count of a call is counted later, from its audit record.
BEGIN and COMMIT are not counted here: they are one round trip each, made on PostgreSQL only by
a call that claims a write's key (tests/dispatch/test_services.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import Error, connection
from django.test.utils import CaptureQueriesContext
from pytest_django import Settings

from dispatch.models import AuditRecord, IdempotencyRecord, Session
from dispatch.services import call_dispatch
from orders.models import Order
from tests.conftest import MakeAgent

ONE_STATEMENT = connection.vendor == "postgresql"

# What docs/benchmarks.md counts: a contract on speed, in a group of its own
# (`pytest -m "not speed_contract"` leaves it out).
pytestmark = pytest.mark.speed_contract


def _statements(make_agent: MakeAgent, tool: str, arguments: dict[str, object]) -> int:
    agent, _ = make_agent()
    # The session's first call, outside the count: a later call is what the mix is made of.
    call_dispatch(
        agent=agent, session_id="s-1", customer_id="CUS-1", tool="get_order", arguments="{}"
    )
    with CaptureQueriesContext(connection) as queries:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool=tool,
            arguments=json.dumps(arguments),
        )
    assert result.ok, result.message
    # The test's own transaction turns the call's into a savepoint, which is not the call's work.
    return sum(not query["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for query in queries)


@pytest.mark.usefixtures("orders")
def test_a_read_is_its_opening_with_the_order_then_its_audit(make_agent: MakeAgent) -> None:
    count = _statements(make_agent, "get_order", {"order_id": "ORD-1001"})

    # On SQLite the step, the claim, the order the domain reads, and the audit record: the call
    # no longer counts itself in the rollups nor settles its session's pending rejections (six
    # statements here: beat's fills count it from its record, analytics/fills.py). On
    # PostgreSQL: the opening and the audit record, as before. On SQLite one more: the session's
    # audit head, its last record, read after the step (dispatch/store/sql.py, HEAD), which
    # PostgreSQL reads in the opening.
    assert count == (2 if ONE_STATEMENT else 5)


def test_an_executed_refund_is_its_opening_with_the_order_its_refund_and_audit(
    make_agent: MakeAgent, orders: dict[str, Order], settings: Settings
) -> None:
    # As in production: with fault injection on, the gateway also reads its switch.
    settings.TOOLGATE_GATEWAY_FAULTS = False
    arguments = {
        "order_id": "ORD-1001",
        "amount_cents": 500,
        "currency": "BRL",
        "reason": "damaged",
    }

    count = _statements(make_agent, "refund_order", arguments)

    # On SQLite two more: the allowance's read (its sum and movements in one statement) and its
    # reservation. On PostgreSQL the read is sent with the opening and the reservation with the
    # audit record (dispatch/store/allowance.py), on the raw connection, not counted here.
    # The rollup rows (hour and day) and the session's pending rejections, four more statements
    # on SQLite before, are no longer the call's: beat's fills count it from its record. On SQLite
    # the session's audit head is one more (HEAD); PostgreSQL reads it in the opening.
    assert count == (3 if ONE_STATEMENT else 10)
    orders["ORD-1001"].refresh_from_db()
    assert orders["ORD-1001"].refunded_cents == 500


@pytest.mark.usefixtures("orders")
def test_a_calls_statements_share_one_cursor_closed_with_the_call(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    tables = (Session._meta.db_table, IdempotencyRecord._meta.db_table, AuditRecord._meta.db_table)
    cursors: list[list[Any]] = []

    def note(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if any(table in sql for table in tables):
            cursors[-1].append(context["cursor"])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note):
        for _ in range(2):
            cursors.append([])
            result = call_dispatch(
                agent=agent,
                session_id="s-1",
                customer_id="CUS-1",
                tool="get_order",
                arguments='{"order_id": "ORD-1001"}',
            )
            assert result.ok, result.message

    first, second = cursors
    # The opening and the audit record; on SQLite the step, the claim, the session's audit head
    # and the audit record (the order is read by the domain, with a cursor of its own).
    assert len(first) == (2 if ONE_STATEMENT else 4)
    assert len({id(cursor) for cursor in first}) == 1
    # Each call has a cursor of its own, and the first was closed when its call ended.
    assert second[0] is not first[0]
    with pytest.raises(Error, match=r"(?i)closed"):
        first[0].execute("SELECT 1")
