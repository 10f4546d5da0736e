"""The policy what-if page: a draft in the query string, the recorded calls judged again under it,
for managers only, and nothing written."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from analytics.replay import policy_what_if
from approvals.services import confirmation_approve, confirmation_execute
from dispatch.models import Agent, AuditRecord, Confirmation
from dispatch.services import call_dispatch
from orders.models import Refund
from tests.analytics import test_views
from tests.analytics.test_views import Traffic, login_in_group
from tests.conftest import MakeAgent
from tests.factories import OrderFactory

pytestmark = pytest.mark.usefixtures("orders")

READS = ("SELECT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")

# test_views' traffic and signed-in manager.
clock = test_views.clock
traffic = test_views.traffic
manager = test_views.manager


def outcome_rows(response: object) -> dict[str, tuple[int, int]]:
    rows = response.context["rows"]  # type: ignore[attr-defined]
    return {row.outcome: (row.actual_calls, row.draft_calls) for row in rows}


def test_a_manager_sees_where_the_calls_would_have_gone(traffic: Traffic, manager: Client) -> None:
    response = manager.get(
        "/analytics/what-if/",
        # Per currency, in its major units: 200.00 BRL.
        {"agent": str(traffic.shop.pk), "range": "24h", "BRL_auto_approve_below": "200"},
    )

    assert response.status_code == 200
    # The small refund ran without a human; the held 90.00 would have too under the draft.
    assert outcome_rows(response)["auto_executed"] == (1, 2)
    assert outcome_rows(response)["one_reviewer"] == (1, 0)
    [move] = response.context["moves"]
    assert (move["actual"], move["draft"]) == ("Held for one reviewer", "Auto-executed")
    assert move["examples"][0]["call_id"] in response.content.decode()
    assert 'name="BRL_auto_approve_below" value="200"' in response.content.decode()
    # Why: the rule that let it through, the customer's sum, the draft's threshold and the one in
    # force.
    assert move["examples"][0]["reason"].replace("\xa0", " ") == (
        "With the customer's sum in the window, R$ 100,00 (R$ 10,00 before it), below R$ 200,00, "
        "the draft lets it move without a human (in force: R$ 50,00)."
    )


def test_without_a_draft_it_shows_the_policy_in_force_and_no_move(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/what-if/", {"agent": traffic.shop.pk})

    assert response.status_code == 200
    assert response.context["changed"] is False
    assert response.context["moves"] == []
    assert "The draft is the policy in force" in response.content.decode()


def test_a_value_out_of_range_is_said_and_the_current_one_is_used(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get(
        "/analytics/what-if/",
        {
            "agent": str(traffic.shop.pk),
            "auto_approve_window_seconds": "5",
            "BRL_max_amount": "x",
            # A yen has no smaller unit: 50.5 is said, never rounded in silence.
            "JPY_auto_approve_below": "50.5",
            "USD_max_amount": "50.555",
            "BRL_daily_cap": "-5",
            "EUR_max_amount": "1" + "0" * 20,
        },
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert "must be a whole number of seconds from 60" in page
    assert "&#x27;x&#x27; is not an amount" in page
    assert "50.5 JPY is finer than its smallest unit" in page
    assert "50.555 USD is finer than its smallest unit (2 decimals)" in page
    assert "-5 is not an amount of money (0 or more)" in page
    assert "must be at most 92233720368547758.07 EUR" in page
    # Each beside its own field, which is marked invalid.
    form = response.context["form"]
    assert set(form.errors) == {
        "auto_approve_window_seconds",
        "BRL_max_amount",
        "JPY_auto_approve_below",
        "USD_max_amount",
        "BRL_daily_cap",
        "EUR_max_amount",
    }
    assert page.count('aria-invalid="true"') == 6
    assert response.context["changed"] is False


def test_an_empty_two_reviewer_amount_means_one_reviewer_is_enough(
    make_agent: MakeAgent, manager: Client
) -> None:
    agent, _ = make_agent(two_reviewers_from_cents=5_000)

    response = manager.get(
        "/analytics/what-if/", {"agent": str(agent.pk), "BRL_two_reviewers_from": ""}
    )

    assert response.status_code == 200
    assert response.context["changed"] is True
    assert "No calls that move money in this range" in response.content.decode()


def test_it_reads_and_writes_nothing(traffic: Traffic, manager: Client) -> None:
    before = (AuditRecord.objects.count(), Confirmation.objects.count(), Refund.objects.count())

    with CaptureQueriesContext(connection) as queries:
        response = manager.get(
            "/analytics/what-if/",
            {
                "agent": str(traffic.shop.pk),
                "BRL_auto_approve_below": "0",
                "BRL_max_amount": "1",
            },
        )

    assert response.status_code == 200
    # Savepoints mark the request's transaction and write nothing.
    writes = [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith(READS)]
    assert writes == []
    after = (AuditRecord.objects.count(), Confirmation.objects.count(), Refund.objects.count())
    assert after == before


def test_with_no_agent_it_says_how_to_make_one(manager: Client) -> None:
    response = manager.get("/analytics/what-if/")

    assert response.status_code == 200
    assert "No agent with a policy yet" in response.content.decode()


def test_it_is_for_managers_only(traffic: Traffic, client: Client) -> None:
    reviewer = login_in_group("rita", "reviewers")

    assert reviewer.get("/analytics/what-if/").status_code == 403
    assert client.get("/analytics/what-if/").status_code == 302


def _refund(agent: Agent, session: str, order_id: str, cents: int, at: datetime) -> Any:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="refund_order",
        arguments=json.dumps(
            {"order_id": order_id, "amount_cents": cents, "currency": "BRL", "reason": "damaged"}
        ),
        clock=lambda: at,
    )


# Committed: on PostgreSQL each call reserves its money on a connection of its own, which sees the
# decisions made before it only once they committed.
@pytest.mark.django_db(transaction=True)
def test_under_the_policy_in_force_no_call_of_any_range_moves(
    make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers are down: an approved refund executes when this test says.
    monkeypatch.setattr("approvals.executing.execution_send", lambda confirmation_id: False)
    # Auto-approve below 50.00 BRL over 24 hours; a confirmation lives an hour.
    agent, _ = make_agent()
    login_in_group("rita", "reviewers")
    rita = User.objects.get(username="rita")
    OrderFactory.create(order_id="ORD-3001", customer_id="CUS-1", total_cents=50_000)
    now = timezone.now().replace(microsecond=0)
    # Held for its amount three days ago, approved within its hour, executed two days later
    # (a worker that was down): its money moved 21 hours ago and counts until 3 hours from now.
    held_long_ago = _refund(agent, "s-1", "ORD-1001", 6_000, now - timedelta(hours=69))
    approved_at = now - timedelta(hours=68, minutes=40)
    confirmation_approve(
        confirmation_id=held_long_ago.data["confirmation_id"], reviewer=rita, now=approved_at
    )
    executed_at = now - timedelta(hours=21)
    confirmation_execute(confirmation_id=held_long_ago.data["confirmation_id"], now=executed_at)
    # Held live for the window's sum, which that execution makes.
    by_the_sum = _refund(agent, "s-2", "ORD-1001", 2_500, now - timedelta(hours=20))
    # Held in the range, approved and executed in it; then a refund the sum holds again.
    in_range = _refund(agent, "s-3", "ORD-3001", 6_000, now - timedelta(hours=10))
    confirmation_approve(
        confirmation_id=in_range.data["confirmation_id"],
        reviewer=rita,
        now=now - timedelta(hours=9, minutes=50),
    )
    confirmation_execute(
        confirmation_id=in_range.data["confirmation_id"], now=now - timedelta(hours=9)
    )
    again = _refund(agent, "s-4", "ORD-3001", 1_000, now - timedelta(hours=2))
    # Another customer's small refund runs without a human.
    alone = call_dispatch(
        agent=agent,
        session_id="s-5",
        customer_id="CUS-2",
        tool="refund_order",
        arguments=json.dumps(
            {"order_id": "ORD-1002", "amount_cents": 1_000, "currency": "USD", "reason": "damaged"}
        ),
        clock=lambda: now - timedelta(hours=1),
    )
    assert [r.code for r in (held_long_ago, by_the_sum, in_range, again, alone)] == [
        "CONFIRMATION_REQUIRED",
        "CONFIRMATION_REQUIRED",
        "CONFIRMATION_REQUIRED",
        "CONFIRMATION_REQUIRED",
        "OK",
    ]
    assert "moved with a reviewer's approval" in by_the_sum.data["reason"]["message"]
    policy = agent.current_policy.snapshot()  # type: ignore[union-attr]
    # The last day, the last 7, the last 31, and a range starting within the window of the
    # execution, after it.
    ranges = {
        "1 day": (now - timedelta(days=1), 4),
        "7 days": (now - timedelta(days=7), 5),
        "31 days": (now - timedelta(days=31), 5),
        "mid-window": (executed_at + timedelta(minutes=10), 4),
    }

    for name, (since, calls) in ranges.items():
        result = policy_what_if(agent_id=agent.pk, since=since, until=now, draft=policy)

        assert (name, result.calls) == (name, calls)
        assert (name, result.moves) == (name, ())
        assert result.draft == result.actual
