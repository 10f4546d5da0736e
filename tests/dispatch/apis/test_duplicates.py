"""Possible duplicates are sought by what moves, not by how the call was sent: the same tool,
subject and amount under another key is held as one whatever the session, the refund's reason, or
whether the first call's key was pruned since, over the look-back the policy sets (by default the
confirmation's lifetime plus the keys' keep time, longer than the sum's window).

Through real HTTP; the first refund's money is aged by hand, as the tables' owner can, to stand
where days would have put it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.utils import timezone

from approvals.services import PossibleDuplicate, confirmation_approve
from dispatch.models import Confirmation, ConfirmationStatus, IdempotencyRecord, Movement
from dispatch.retention import records_prune
from dispatch.store.guards import MOVEMENT_PROTOCOL_TRIGGER
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

DAY = timedelta(days=1)


@pytest.fixture
def reviewer(db: None) -> User:
    person = User.objects.create_user("rita", password="pw")
    person.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    return person


def held(result: dict[str, Any]) -> Confirmation:
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result["data"]["confirmation_id"])


def movement_age(key: str, by: timedelta) -> None:
    """Test set-up only: the money under `key` moved `by` earlier, as the tables' owner can set
    it with the reservations' protocol off for the statement."""
    moved = Movement.objects.get(key=key)
    at = moved.at - by
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic(), connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                f"ALTER TABLE dispatch_movement DISABLE TRIGGER {MOVEMENT_PROTOCOL_TRIGGER}"
            )
        Movement.objects.filter(key=key).update(at=at, day=at.date())
        if postgresql:
            cursor.execute(
                f"ALTER TABLE dispatch_movement ENABLE TRIGGER {MOVEMENT_PROTOCOL_TRIGGER}"
            )
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def executed_refund(api: AgentClient, reviewer: User, *, session: str) -> Confirmation:
    """A refund above the line, held, approved and executed: the issue's first payment."""
    first = held(api.refund(6_000, session=session))
    confirmation_approve(confirmation_id=first.pk, reviewer=reviewer)
    first.refresh_from_db()
    assert first.status == ConfirmationStatus.EXECUTED
    return first


@pytest.mark.django_db(transaction=True)
def test_a_refund_resent_in_its_own_session_after_its_key_was_pruned_is_held_as_a_duplicate(
    api: AgentClient, reviewer: User, ledger: Ledger
) -> None:
    first = executed_refund(api, reviewer, session="s-1")
    movement_age(first.execution_key, 3 * DAY)
    pruned = records_prune(now=timezone.now() + 8 * DAY)
    assert pruned.keys >= 1 and pruned.sessions == 1
    assert not IdempotencyRecord.objects.filter(key=first.key).exists()

    again = held(api.refund(6_000, session="s-1"))

    # The same call, under the same key as the first, now pruned: a new confirmation, linked to
    # the money the first one moved three days ago (past the 24 h window).
    assert again.key == first.key and again.pk != first.pk
    assert again.hold_reason is not None
    assert again.hold_reason["kind"] == "possible_duplicate"
    (earlier,) = again.hold_reason["data"]["earlier"]
    assert (earlier["subject"], earlier["amount_cents"]) == ("ORD-1001", 6_000)
    assert earlier["approval"] == "reviewer"
    assert again.duplicate_of == first.execution_key
    with pytest.raises(PossibleDuplicate):
        confirmation_approve(confirmation_id=again.pk, reviewer=reviewer)
    assert ledger.state() == (1, 6_000)


def test_a_refund_of_the_same_order_and_amount_with_another_reason_is_a_possible_duplicate(
    api: AgentClient, ledger: Ledger
) -> None:
    first = api.refund(1_000, session="s-1", reason="damaged")

    again = api.refund(1_000, session="s-1", reason="customer_request")

    assert first["code"] == "OK"
    reason = held(again).hold_reason
    assert reason is not None and reason["kind"] == "possible_duplicate"
    assert ledger.state() == (1, 1_000)


def test_a_refund_of_another_amount_in_the_same_session_is_no_duplicate(
    api: AgentClient, ledger: Ledger
) -> None:
    api.refund(1_000, session="s-1")

    again = api.refund(1_500, session="s-1", reason="customer_request")

    assert again["code"] == "OK"
    assert ledger.state() == (2, 2_500)


@pytest.mark.parametrize(
    ("lookback", "aged", "duplicate"),
    [
        # The default: the confirmation's lifetime (1 day) plus the keys' keep time (7 days).
        (None, 7 * DAY, True),
        (None, 9 * DAY, False),
        # Set by the policy, never shorter than the sum's window (24 h).
        (2 * DAY, 1 * DAY + timedelta(hours=12), True),
        (2 * DAY, 3 * DAY, False),
        (timedelta(hours=1), timedelta(hours=20), True),
    ],
)
def test_possible_duplicates_are_sought_over_the_policys_look_back(
    client_for: ClientFor,
    make_agent: MakeAgent,
    ledger: Ledger,
    lookback: timedelta | None,
    aged: timedelta,
    duplicate: bool,
) -> None:
    seconds = None if lookback is None else int(lookback.total_seconds())
    api = client_for(make_agent(duplicate_lookback_seconds=seconds)[1])
    first = api.refund(1_000, session="s-1")
    movement_age(Movement.objects.get().key, aged)

    again = api.refund(1_000, session="s-2")

    assert first["code"] == "OK"
    if duplicate:
        reason = held(again).hold_reason
        assert reason is not None and reason["kind"] == "possible_duplicate"
        assert ledger.state() == (1, 1_000)
    else:
        assert again["code"] == "OK"
        assert ledger.state() == (2, 2_000)
