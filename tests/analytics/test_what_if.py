"""The policy what-if page: a draft in the query string, the recorded calls judged again under it,
for managers only, and nothing written."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dispatch.models import AuditRecord, Confirmation
from orders.models import Refund
from tests.analytics import test_views
from tests.analytics.test_views import Traffic, login_in_group
from tests.conftest import MakeAgent

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
        },
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert "must be a whole number of seconds from 60" in page
    assert "&#x27;x&#x27; is not an amount" in page
    assert "50.5 JPY is finer than its smallest unit" in page
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
