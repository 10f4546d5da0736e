"""Deciding through the reviewer pages' forms: what the reviewer is told, and what moved."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ConfirmationEvent, EventKind
from approvals.services import confirmation_approve, confirmation_reject
from dispatch.models import ConfirmationStatus
from orders.services import gateway_faults_set
from tests.approvals.conftest import HELD_ACTIONS, HoldRefund, MakeUser
from tests.approvals.test_pages import text
from tests.conftest import Ledger
from tests.factories import OrderFactory

pytestmark = pytest.mark.django_db

# pytest-django's django_capture_on_commit_callbacks: the execution is enqueued after the commit.
Commits = Callable[..., AbstractContextManager[Any]]


# Committed for real, as in the embedded setup: the task runs in-process once the approval
# commits, before the page answers.
@pytest.mark.django_db(transaction=True)
def test_an_approval_executes_and_says_so(
    client: Client, reviewer: User, hold_refund: HoldRefund, ledger: Ledger
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)

    response = client.post(f"/approvals/{held.pk}/approve", {"next": "/approvals/"})
    page = client.get(response["Location"])

    assert response.status_code == 303
    assert "Executed: Refund order R$ 60,00 ORD-1001." in text(page)
    assert f"No {HELD_ACTIONS} are waiting" in text(page)
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.EXECUTED
    assert ledger.state("ORD-1001") == (1, 6_000)


def test_a_rejection_says_the_agent_is_told_the_reason(
    client: Client, reviewer: User, hold_refund: HoldRefund, ledger: Ledger
) -> None:
    held = hold_refund(6_000)
    client.force_login(reviewer)

    response = client.post(
        f"/approvals/{held.pk}/reject", {"reason": "Outside the return window"}, follow=True
    )

    assert "Rejected: Refund order R$ 60,00 ORD-1001. The agent is told your reason." in text(
        response
    )
    held.refresh_from_db()
    assert (held.status, held.decision_reason) == ("rejected", "Outside the return window")
    assert ledger.state("ORD-1001") == (0, 0)


def test_deciding_what_someone_else_decided_first_shows_their_decision_not_an_error(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund, ledger: Ledger
) -> None:
    held = hold_refund(6_000)
    confirmation_reject(
        confirmation_id=held.pk, reviewer=make_user("other", "reviewers"), reason="duplicate"
    )
    client.force_login(reviewer)

    response = client.post(f"/approvals/{held.pk}/approve", follow=True)

    assert response.status_code == 200
    assert "It is already rejected" in text(response)
    assert ledger.state("ORD-1001") == (0, 0)


def test_a_first_approval_of_two_is_recorded_as_a_vote(
    client: Client, reviewer: User, hold_refund: HoldRefund, ledger: Ledger
) -> None:
    OrderFactory.create(order_id="ORD-3002", customer_id="CUS-1", total_cents=100_000)
    held = hold_refund(25_000, order_id="ORD-3002")
    client.force_login(reviewer)

    first = client.post(f"/approvals/{held.pk}/approve", follow=True)
    again = client.post(f"/approvals/{held.pk}/approve", follow=True)

    assert "Your approval of Refund order R$ 250,00 ORD-3002 is recorded" in text(first)
    assert "Needs another reviewer's approval" in text(first)
    assert "You approved this already" in text(again)
    assert "You approved" in text(again)
    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING
    assert ledger.state("ORD-3002") == (0, 0)


def test_the_detail_page_shows_the_timeline_and_the_result(
    reviewer: User,
    make_user: MakeUser,
    hold_refund: HoldRefund,
    client: Client,
    django_capture_on_commit_callbacks: Commits,
) -> None:
    OrderFactory.create(order_id="ORD-3002", customer_id="CUS-1", total_cents=100_000)
    held = hold_refund(25_000, order_id="ORD-3002")
    confirmation_approve(confirmation_id=held.pk, reviewer=make_user("june", "reviewers"))
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewer)
    client.force_login(reviewer)

    page = text(client.get(f"/approvals/{held.pk}/"))

    timeline = page[page.index("Timeline") :]
    assert timeline.index("june approved (a vote)") < timeline.index("rita approved")
    assert timeline.index("rita approved") < timeline.index("worker started executing")
    assert timeline.index("worker started executing") < timeline.index("worker executed it")
    assert "Result" in page and "✓ OK" in page and '"refund_id"' in page


def test_an_unknown_outcome_is_listed_and_reconciled_from_the_page(
    client: Client,
    reviewer: User,
    hold_refund: HoldRefund,
    ledger: Ledger,
    django_capture_on_commit_callbacks: Commits,
) -> None:
    held = hold_refund(6_000)
    # Every attempt's answer is lost after the refund took effect.
    gateway_faults_set(lose_response_after_commit=10)
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewer)
    gateway_faults_set()
    client.force_login(reviewer)
    listed = text(client.get("/approvals/reconciliation/"))

    response = client.post(f"/approvals/{held.pk}/reconcile", follow=True)

    assert "R$ 60,00 Refund order · ORD-1001" in listed and held.execution_key in listed
    assert "Executed: Refund order R$ 60,00 ORD-1001." in text(response)
    assert "Nothing to reconcile" in text(response)
    assert ConfirmationEvent.objects.filter(
        confirmation=held, kind=EventKind.RECONCILED, actor=reviewer
    ).exists()
    assert ledger.state("ORD-1001") == (1, 6_000)


def test_the_history_filters_by_status_and_reviewer(
    client: Client, reviewer: User, make_user: MakeUser, hold_refund: HoldRefund
) -> None:
    by_rita = hold_refund(6_000)
    by_june = hold_refund(7_000)
    confirmation_reject(confirmation_id=by_rita.pk, reviewer=reviewer, reason="no")
    june = make_user("june", "reviewers")
    confirmation_reject(confirmation_id=by_june.pk, reviewer=june, reason="no")
    client.force_login(reviewer)

    rejected = client.get("/approvals/history/", {"status": "rejected"}).content.decode()
    executed = client.get("/approvals/history/", {"status": "executed"}).content.decode()
    junes = client.get("/approvals/history/", {"reviewer": str(june.pk)}).content.decode()

    assert by_rita.pk in rejected and by_june.pk in rejected
    assert by_rita.pk not in executed
    assert by_june.pk in junes and by_rita.pk not in junes
