"""The agent host's withdrawal of a held call: a move of the lifecycle like a decision, under the
same locks. It releases the call's money and reopens its key; it is refused once a reviewer
approved (or voted to), and a withdrawal racing an approval makes exactly one of the two."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import ProgrammingError, connection, transaction
from django.utils import timezone

from analytics.charts import OUTCOMES
from analytics.selectors import confirmation_outcomes
from approvals.models import ConfirmationEvent, EventKind
from approvals.services import (
    HOST,
    AlreadyApproved,
    AlreadyDecided,
    ConfirmationError,
    ConfirmationNotFound,
    confirmation_approve,
    confirmation_reject,
    confirmation_withdraw,
)
from dispatch.models import (
    Agent,
    Confirmation,
    ConfirmationStatus,
    IdempotencyRecord,
    Movement,
)
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund, refund_call
from tests.approvals.test_services_concurrency import at_once
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db


def money_counting(confirmation: Confirmation) -> int:
    return Movement.objects.filter(key=confirmation.execution_key, released_at=None).count()


def test_it_withdraws_a_pending_call_releasing_its_money_and_reopening_its_key(
    held_refund: HeldRefund, holding_agent: Agent, order: Order
) -> None:
    held = held_refund()
    assert money_counting(held) == 1

    withdrawn = confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)

    assert withdrawn.status == ConfirmationStatus.WITHDRAWN
    assert withdrawn.decision_code == "WITHDRAWN" and withdrawn.decided_at is not None
    assert money_counting(held) == 0
    assert IdempotencyRecord.objects.get(key=held.key).status == "open"
    event = ConfirmationEvent.objects.filter(confirmation=held).order_by("-id").first()
    assert event is not None and event.kind == EventKind.WITHDRAWN and event.actor_label == HOST
    # The same call again is judged anew: a new confirmation, not the withdrawn one's answer.
    again = refund_call(holding_agent, 6_000)
    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] != held.pk
    assert Refund.objects.filter(order=order).count() == 0


def test_a_withdrawn_call_is_an_outcome_in_the_analytics(
    held_refund: HeldRefund, holding_agent: Agent
) -> None:
    held = held_refund()

    confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)

    now = timezone.now()
    outcomes = confirmation_outcomes(since=now - timedelta(hours=1), until=now + timedelta(hours=1))
    assert outcomes["by_status"] == {"withdrawn": 1}
    # Nobody reviewed it: it is no reviewer's decision time.
    assert outcomes["by_reviewer"] == {}
    assert ConfirmationStatus.WITHDRAWN in OUTCOMES


def test_it_is_refused_once_a_reviewer_approved(
    held_refund: HeldRefund, holding_agent: Agent, reviewers: list[User], order: Order
) -> None:
    held = held_refund()
    confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
    held.refresh_from_db()
    before = (held.status, held.event_seq)

    with pytest.raises(AlreadyApproved) as refused:
        confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)

    assert refused.value.code == "already_approved"
    held.refresh_from_db()
    # Approved, its execution sent once the approval commits (which a test's transaction never
    # does): the withdrawal moved nothing.
    assert (held.status, held.event_seq) == before
    assert held.status == ConfirmationStatus.APPROVED
    assert Movement.objects.get(key=held.execution_key).approval == "approved"


def test_it_is_refused_once_one_of_two_reviewers_voted(
    held_refund: HeldRefund, holding_agent: Agent, reviewers: list[User]
) -> None:
    held = held_refund(25_000)
    confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    with pytest.raises(AlreadyApproved):
        confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)

    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING
    assert money_counting(held) == 1


def test_it_is_refused_once_rejected_expired_or_withdrawn(
    held_refund: HeldRefund, holding_agent: Agent, reviewers: list[User]
) -> None:
    rejected, expired, withdrawn = held_refund(), held_refund(7_000), held_refund(8_000)
    confirmation_reject(confirmation_id=rejected.pk, reviewer=reviewers[0], reason="no")
    Confirmation.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    confirmation_withdraw(confirmation_id=withdrawn.pk, agent=holding_agent)

    for held, status in ((rejected, "rejected"), (expired, "expired"), (withdrawn, "withdrawn")):
        with pytest.raises(AlreadyDecided):
            confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)
        held.refresh_from_db()
        assert held.status == status


def test_another_agents_or_customers_call_is_answered_as_missing(
    held_refund: HeldRefund, holding_agent: Agent, make_agent: MakeAgent
) -> None:
    held = held_refund()
    other = make_agent()[0]

    for agent, customer in ((other, None), (holding_agent, "CUS-8")):
        with pytest.raises(ConfirmationNotFound):
            confirmation_withdraw(confirmation_id=held.pk, agent=agent, customer_id=customer)
    with pytest.raises(ConfirmationNotFound):
        confirmation_withdraw(confirmation_id="no-such-id", agent=holding_agent)

    held.refresh_from_db()
    assert held.status == ConfirmationStatus.PENDING and money_counting(held) == 1


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL: the lifecycle's trigger"
)
def test_the_database_refuses_any_move_out_of_withdrawn(
    held_refund: HeldRefund, holding_agent: Agent
) -> None:
    held = held_refund()
    confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent)

    with pytest.raises(ProgrammingError) as refused, transaction.atomic():
        Confirmation.objects.filter(pk=held.pk).update(status=ConfirmationStatus.APPROVED)

    assert "does not move from withdrawn to approved" in str(refused.value)


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: SQLite runs one writer at a time, so nothing races there",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(4))
def test_a_withdrawal_racing_an_approval_makes_exactly_one(
    round_: int,
    held_refund: HeldRefund,
    holding_agent: Agent,
    reviewers: list[User],
    order: Order,
) -> None:
    held = held_refund()

    approved, withdrawn = at_once(
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0]),
        lambda: confirmation_withdraw(confirmation_id=held.pk, agent=holding_agent),
    )

    refused = [each for each in (approved, withdrawn) if isinstance(each, ConfirmationError)]
    assert len(refused) == 1
    held.refresh_from_db()
    refunds = Refund.objects.filter(order=order).count()
    if isinstance(withdrawn, ConfirmationError):
        assert withdrawn.code == "already_approved"
        assert (held.status, refunds) == ("executed", 1)
    else:
        assert approved.code == "already_decided"
        assert (held.status, refunds, money_counting(held)) == ("withdrawn", 0, 0)
    kinds = list(ConfirmationEvent.objects.filter(confirmation=held).values_list("kind", flat=True))
    assert (EventKind.WITHDRAWN in kinds) != (EventKind.APPROVED in kinds)
