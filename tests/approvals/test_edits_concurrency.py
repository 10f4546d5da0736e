"""Edits that race other decisions, on PostgreSQL with real connections: one decision, at most one
execution, and a customer's sum that counts the held amount or the edited one, never both and
never neither."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum

from approvals.services import (
    AlreadyDecided,
    ConfirmationError,
    confirmation_approve,
    confirmation_edit_approve,
)
from dispatch.models import Confirmation, Movement
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.test_services_concurrency import at_once

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL: SQLite runs one writer at a time, so nothing races there",
    ),
    pytest.mark.django_db(transaction=True),
]


def live_money() -> list[int]:
    """The customer's money that counts now (held, approved or moved), as its rows."""
    return list(Movement.objects.filter(released_at=None).values_list("amount_cents", flat=True))


def refunded(order: Order) -> list[int]:
    return list(Refund.objects.filter(order=order).values_list("amount_cents", flat=True))


@pytest.mark.parametrize("round_", range(3))
def test_an_edit_and_an_approval_as_asked_at_once_make_one_decision(
    round_: int, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)

    outcomes = at_once(
        lambda: confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        ),
        lambda: confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1]),
    )

    refused = [outcome for outcome in outcomes if isinstance(outcome, ConfirmationError)]
    assert len(refused) == 1 and isinstance(refused[0], AlreadyDecided)
    assert len(refunded(order)) == 1
    assert live_money() == refunded(order)
    assert Confirmation.objects.filter(status="executed").count() == 1


@pytest.mark.parametrize("round_", range(3))
def test_two_reviewers_editing_at_once_make_one_edit(
    round_: int, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)

    outcomes = at_once(
        lambda: confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        ),
        lambda: confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[1], changes={"amount_cents": 7_000}
        ),
    )

    refused = [outcome for outcome in outcomes if isinstance(outcome, ConfirmationError)]
    assert len(refused) == 1 and isinstance(refused[0], AlreadyDecided)
    assert Confirmation.objects.filter(edited_from=held.pk).count() == 1
    assert refunded(order) in ([6_000], [7_000])
    assert live_money() == refunded(order)


def test_the_sum_read_while_edits_commit_counts_one_amount_each_time(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    # From 200.00 two reviewers decide: each edit's approval is a vote, and the edited call
    # waits, its money held, to be edited again.
    held = held_refund(40_000)
    done = threading.Event()
    seen: list[tuple[int, int]] = []

    def read_the_sum() -> None:
        try:
            while not done.is_set():
                live = Movement.objects.filter(released_at=None)
                total = live.aggregate(total=Sum("amount_cents"))["total"] or 0
                seen.append((live.count(), total))
        finally:
            connection.close()

    reader = threading.Thread(target=read_the_sum)
    reader.start()
    try:
        current = held
        for amount in range(39_000, 29_000, -1_000):
            reviewer = reviewers[amount // 1_000 % 2]
            current = confirmation_edit_approve(
                confirmation_id=current.pk, reviewer=reviewer, changes={"amount_cents": amount}
            )
    finally:
        done.set()
        reader.join()

    # Each read, in a statement of its own, may fall between two edits, never inside one.
    assert seen
    assert all(count == 1 for count, _ in seen), {count for count, _ in seen}
    assert {total for _, total in seen} <= set(range(30_000, 40_001, 1_000))
    assert live_money() == [30_000]
    assert refunded(order) == []
