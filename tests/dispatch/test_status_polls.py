"""Polling get_confirmation_status on the database store, over the API: free while the held call
waits for a human (neither LOOP_DETECTED nor STEP_LIMIT), then the outcome once it is decided,
counted as every call; a read of anything but the agent's and customer's own waiting
confirmation counts as today. On SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.reviewers import REVIEWERS_GROUP
from approvals.services import confirmation_approve, confirmation_reject
from dispatch.models import AuditRecord, Confirmation, IdempotencyRecord, Session
from dispatch.services import call_dispatch
from tests.conftest import ClientFor, Ledger, MakeAgent
from tests.dispatch.test_tools import held_refund, status

pytestmark = pytest.mark.usefixtures("orders")

TOOLS = ["get_order", "refund_order", "get_confirmation_status"]
STATUS = "get_confirmation_status"
# Budgets small enough that a dozen reads would pass both.
SMALL = {"allowed_tools": TOOLS, "step_budget": 3, "repeat_limit": 3}


@pytest.fixture
def reviewer(db: None) -> User:
    user = User.objects.create_user("rita", password="pw-rita")
    user.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    return user


def steps(session: str = "s-1") -> int:
    return Session.objects.get(session_id=session).steps


def test_a_dozen_polls_while_held_then_the_executed_outcome(
    make_agent: MakeAgent, client_for: ClientFor, reviewer: User, ledger: Ledger
) -> None:
    api = client_for(make_agent(**SMALL)[1])
    confirmation_id = held_refund(api)

    waiting = [status(api, confirmation_id) for _ in range(12)]
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    outcome = status(api, confirmation_id)

    assert [(r["code"], r["data"]["status"]) for r in waiting] == [("OK", "pending")] * 12
    assert outcome["ok"] is True
    data = outcome["data"]
    assert isinstance(data, dict)
    assert (data["status"], data["final"]) == ("executed", True)
    assert data["result"]["code"] == "OK" and data["result"]["data"]["amount_cents"] == 9000
    # Every poll has its audit record; only the refund and the decided read counted.
    assert AuditRecord.objects.filter(tool=STATUS).count() == 13
    assert steps() == 2
    assert IdempotencyRecord.objects.get(tool=STATUS).attempts == 1
    assert ledger.state() == (1, 9000)


def test_once_decided_polls_count_to_the_repeat_limit(
    make_agent: MakeAgent, client_for: ClientFor, reviewer: User, ledger: Ledger
) -> None:
    api = client_for(make_agent(allowed_tools=TOOLS, step_budget=20, repeat_limit=3)[1])
    confirmation_id = held_refund(api)
    for _ in range(5):
        status(api, confirmation_id)
    confirmation_reject(confirmation_id=confirmation_id, reviewer=reviewer, reason="not damaged")

    answers = [status(api, confirmation_id) for _ in range(4)]

    first = answers[0]["data"]
    assert isinstance(first, dict)
    assert (first["status"], first["decision_reason"]) == ("rejected", "not damaged")
    assert [a["code"] for a in answers] == ["OK", "OK", "OK", "LOOP_DETECTED"]
    assert steps() == 5
    assert ledger.state() == (0, 0)


def test_an_expired_hold_is_polled_as_any_call_and_says_expired(
    make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    api = client_for(make_agent(**SMALL)[1])
    confirmation_id = held_refund(api)
    Confirmation.objects.filter(pk=confirmation_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    answers = [status(api, confirmation_id) for _ in range(3)]

    first = answers[0]["data"]
    assert isinstance(first, dict) and first["status"] == "expired" and first["final"] is True
    assert [a["code"] for a in answers] == ["OK", "OK", "STEP_LIMIT"]
    assert ledger.state() == (0, 0)


def test_polling_another_agents_or_customers_hold_counts(
    make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    owner = client_for(make_agent(**SMALL)[1])
    confirmation_id = held_refund(owner)
    stranger = client_for(make_agent(**SMALL)[1])

    by_agent = [status(stranger, confirmation_id)["code"] for _ in range(4)]
    by_customer = [
        status(owner, confirmation_id, customer="CUS-2", session="s-2")["code"] for _ in range(4)
    ]

    assert by_agent == ["CONFIRMATION_NOT_FOUND"] * 3 + ["STEP_LIMIT"]
    assert by_customer == ["CONFIRMATION_NOT_FOUND"] * 3 + ["STEP_LIMIT"]
    assert Session.objects.filter(session_id="s-2").get().steps == 4
    assert ledger.state() == (0, 0)


def test_a_poll_from_a_new_conversation_of_the_customer_is_free(
    make_agent: MakeAgent, client_for: ClientFor
) -> None:
    api = client_for(make_agent(**SMALL)[1])
    confirmation_id = held_refund(api)

    answers = [status(api, confirmation_id, session="s-later")["code"] for _ in range(5)]

    assert answers == ["OK"] * 5
    assert steps("s-later") == 0


def test_a_free_poll_sends_as_many_statements_as_a_counted_one(
    make_agent: MakeAgent, reviewer: User
) -> None:
    agent, _ = make_agent(allowed_tools=TOOLS, step_budget=50, repeat_limit=50)
    envelope: dict[str, Any] = {"agent": agent, "session_id": "s-1", "customer_id": "CUS-1"}
    refund = {"order_id": "ORD-1001", "amount_cents": 9000, "currency": "BRL", "reason": "damaged"}
    held = call_dispatch(**envelope, tool="refund_order", arguments=json.dumps(refund))
    confirmation_id = held.data["confirmation_id"]
    arguments = f'{{"confirmation_id": "{confirmation_id}"}}'

    def statements() -> int:
        with CaptureQueriesContext(connection) as queries:
            result = call_dispatch(**envelope, tool=STATUS, arguments=arguments)
        assert result.ok, result.message
        return sum(not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for q in queries)

    free = statements()
    confirmation_reject(confirmation_id=confirmation_id, reviewer=reviewer, reason="no")
    counted = statements()

    # The exemption is judged inside the step's own statement: no statement of its own.
    assert free == counted
    assert steps() == 2
