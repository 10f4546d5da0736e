"""What announcing a hold adds to the held call's statements: one INSERT of its notification
rows, in the hold's transaction; nothing where no channel is configured. The sending happens
after the commit, on a worker, and is not the call's."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django import Settings

from dispatch.models import Agent
from dispatch.services import call_dispatch
from orders.models import Order

pytestmark = pytest.mark.speed_contract


def held_call_statements(agent: Agent, session: str) -> list[str]:
    # The session's first call, outside the count, as tests/dispatch/store counts a call.
    call_dispatch(
        agent=agent, session_id=session, customer_id="CUS-7", tool="get_order", arguments="{}"
    )
    with CaptureQueriesContext(connection) as queries:
        result = call_dispatch(
            agent=agent,
            session_id=session,
            customer_id="CUS-7",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": "ORD-3001",
                    "amount_cents": 6_000,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
        )
    assert result.code == "CONFIRMATION_REQUIRED", result.message
    return [
        query["sql"]
        for query in queries
        if not query["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]


def test_announcing_a_hold_adds_one_insert_to_the_held_path(
    holding_agent: Agent, order: Order, settings: Settings
) -> None:
    settings.TOOLGATE_NOTIFY_EMAIL = False
    settings.SLACK_BOT_TOKEN = ""
    without = held_call_statements(holding_agent, "s-off")
    settings.TOOLGATE_NOTIFY_EMAIL = True
    settings.SLACK_BOT_TOKEN = "xoxb-counted-not-used"

    with_channels = held_call_statements(holding_agent, "s-on")

    assert len(with_channels) == len(without) + 1
    added = [sql for sql in with_channels if "approvals_notification" in sql]
    assert len(added) == 1 and added[0].startswith("INSERT")
