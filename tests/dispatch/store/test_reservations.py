"""The reservations' own connections (dispatch/store/allowance.py) across a server that dropped
them: the next refund reserves on a new connection instead of failing."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from dispatch.models import Movement, MovementApproval
from dispatch.services import call_dispatch
from dispatch.store.allowance import allowance_release
from orders.models import Order
from tests.conftest import MakeAgent


@pytest.mark.django_db(transaction=True)
def test_a_refund_after_the_server_dropped_the_reservations_connections_executes(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the reservations have connections of their own only on PostgreSQL")
    agent, _ = make_agent()

    def refund(session: str, amount: int) -> str:
        result = call_dispatch(
            agent=agent,
            session_id=session,
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": "ORD-1001",
                    "amount_cents": amount,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )
        return result.code

    assert refund("s-1", 500) == "OK"
    end_the_other_connections()

    assert refund("s-2", 700) == "OK"
    orders["ORD-1001"].refresh_from_db()
    assert orders["ORD-1001"].refunded_cents == 1_200


@pytest.mark.django_db(transaction=True)
def test_a_release_after_the_server_dropped_the_reservations_connections_releases() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the reservations have connections of their own only on PostgreSQL")
    now = timezone.now()
    movement = Movement.objects.create(
        key="k-release",
        agent_id=1,
        session_id="s-1",
        customer_id="CUS-1",
        currency="BRL",
        tool="refund_order",
        subject="ORD-1001",
        amount_cents=500,
        approval=MovementApproval.POLICY,
        at=now,
        day=now.date(),
    )
    # A first release opens a reservations' connection, which then waits in its pool.
    allowance_release("k-none", cursor=connection.cursor())
    end_the_other_connections()

    allowance_release("k-release", cursor=connection.cursor())

    movement.refresh_from_db()
    assert movement.released_at is not None


def end_the_other_connections() -> None:
    """Every other connection to the test's database ends, as a restart or a failover ends them:
    among them the reservations' own, idle in their pool."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        ours = connection.connection.info.backend_pid
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)",
            [ours],
        )
        while admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid NOT IN (pg_backend_pid(), %s)",
            [ours],
        ).fetchone():
            time.sleep(0.01)
