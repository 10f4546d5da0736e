"""Decisions that race each other, on PostgreSQL with real connections: one decision, counted once
in the analytics, at most one execution, and never a second confirmation or ledger row."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from analytics.fills import rollups_fill
from analytics.models import DecisionRollup
from analytics.rollups import audit_in_session_order, rollups_live, rollups_rebuilt
from approvals.services import (
    ConfirmationError,
    confirmation_approve,
    confirmation_reject,
    confirmations_expire_due,
)
from dispatch.models import Agent, Confirmation
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund, refund_call

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL: SQLite runs one writer at a time, so nothing races there",
    ),
    pytest.mark.django_db(transaction=True),
]


def at_once(*work: Callable[[], Any]) -> list[Any]:
    """Run each function on a thread (and a connection) of its own, released together."""
    barrier = threading.Barrier(len(work))

    def run(job: Callable[[], Any]) -> Any:
        try:
            barrier.wait(timeout=30)
            return job()
        except ConfirmationError as refused:
            return refused
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        return list(pool.map(run, work))


def ledger(order: Order) -> int:
    return Refund.objects.filter(order=order).count()


def decisions_counted() -> dict[str, int]:
    """The decisions in the analytics' histogram, by who decided ("" for an expiry), once a fill
    counted them from the event log."""
    rollups_fill(lag=timedelta(0))
    counted: dict[str, int] = {}
    for decided_by, decisions in DecisionRollup.objects.values_list("decided_by", "decisions"):
        counted[decided_by] = counted.get(decided_by, 0) + decisions
    return counted


@pytest.mark.parametrize("round_", range(3))
def test_two_reviewers_approving_at_once_execute_once(
    round_: int, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()

    outcomes = at_once(
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0]),
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1]),
    )

    held.refresh_from_db()
    assert held.status == "executed"
    assert sum(isinstance(outcome, ConfirmationError) for outcome in outcomes) == 1
    assert sum(decisions_counted().values()) == 1
    assert ledger(order) == 1


@pytest.mark.parametrize("round_", range(2))
def test_reviewers_deciding_many_held_calls_at_once_count_each_decision_once(
    round_: int, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = [held_refund(5_000 + index, session=f"s-{index}") for index in range(6)]

    def decide(reviewer: User) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            outcomes: list[Any] = []
            for confirmation in held:
                try:
                    outcomes.append(
                        confirmation_reject(
                            confirmation_id=confirmation.pk, reviewer=reviewer, reason="No."
                        )
                    )
                except ConfirmationError as refused:
                    outcomes.append(refused)
            return outcomes

        return run

    at_once(*(decide(reviewer) for reviewer in reviewers))
    # The decisions are counted from the event log by a fill.
    rollups_fill(lag=timedelta(0))

    deciders = dict(
        Confirmation.objects.filter(events__kind="rejected").values_list(
            "pk", "events__actor_label"
        )
    )
    assert len(deciders) == len(held)
    expected: dict[str, int] = {}
    for name in deciders.values():
        expected[name] = expected.get(name, 0) + 1
    assert decisions_counted() == expected
    assert rollups_live() == rollups_rebuilt(audit_in_session_order())[0]
    assert ledger(order) == 0


def test_a_double_submit_by_one_reviewer_is_one_vote(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(25_000)  # two reviewers needed

    outcomes = at_once(
        *[lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])] * 4
    )

    held.refresh_from_db()
    assert held.status == "pending"
    assert held.votes.count() == 1
    assert sum(isinstance(outcome, ConfirmationError) for outcome in outcomes) == 3
    assert ledger(order) == 0


@pytest.mark.parametrize("round_", range(3))
def test_an_approval_racing_the_agents_identical_call_executes_once(
    round_: int, holding_agent: Agent, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()

    outcomes = at_once(
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0]),
        lambda: refund_call(holding_agent, 6_000),
        lambda: refund_call(holding_agent, 6_000),
    )

    held.refresh_from_db()
    assert held.status == "executed"
    assert Confirmation.objects.count() == 1
    for result in outcomes[1:]:
        assert result.code in {"CONFIRMATION_REQUIRED", "OK"}
        assert result.data["confirmation_id" if not result.ok else "refund_id"]
    assert ledger(order) == 1


@pytest.mark.parametrize("round_", range(3))
def test_an_approval_racing_the_expiry_has_one_outcome(
    round_: int, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()
    Confirmation.objects.filter(pk=held.pk).update(
        expires_at=timezone.now() + timedelta(milliseconds=20)
    )

    def expire_when_due() -> int:
        while timezone.now() < held.expires_at + timedelta(milliseconds=25):
            pass
        return confirmations_expire_due()

    held.refresh_from_db()
    at_once(
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0]),
        expire_when_due,
    )

    held.refresh_from_db()
    assert held.status in {"executed", "expired"}
    assert ledger(order) == (1 if held.status == "executed" else 0)
    kinds = list(held.events.values_list("kind", flat=True))
    assert ("expired" in kinds) != ("approved" in kinds)
    assert decisions_counted() == ({"": 1} if "expired" in kinds else {reviewers[0].username: 1})
