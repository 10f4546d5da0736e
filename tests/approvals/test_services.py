"""Every transition of a confirmation, with the ledger, the statuses and the event log it leaves."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import current_app
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ConfirmationEvent, ReviewerLimit
from approvals.services import (
    AlreadyDecided,
    AlreadyVoted,
    NotReconcilable,
    ReasonRequired,
    confirmation_approve,
    confirmation_execute,
    confirmation_reconcile,
    confirmation_reject,
    confirmations_expire_due,
)
from approvals.tasks import confirmation_execute_task
from dispatch.models import Agent, Confirmation, IdempotencyRecord
from orders.models import Order, Refund
from orders.services import gateway_faults_set
from tests.approvals.conftest import HeldRefund, refund_call
from tests.conftest import confirmation_rewrite

Capture = Callable[..., Any]


def events(confirmation: Confirmation) -> list[tuple[str, str]]:
    return list(
        ConfirmationEvent.objects.filter(confirmation=confirmation).values_list(
            "kind", "actor_label"
        )
    )


def ledger(order: Order) -> list[tuple[int, str, str]]:
    return list(
        Refund.objects.filter(order=order).values_list("amount_cents", "approval", "approved_by")
    )


def test_an_approved_refund_executes_once_after_the_commit(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    held.refresh_from_db()
    assert len(enqueued) == 1
    assert held.status == "executed"
    assert held.result is not None and held.result["ok"] and held.result["code"] == "OK"
    assert ledger(order) == [(6_000, "reviewer", "ana")]
    assert events(held) == [
        ("voted", "ana"),
        ("approved", "ana"),
        ("executing", "worker"),
        ("executed", "worker"),
    ]


def test_with_a_broker_the_approval_sends_its_execution_by_the_workers_task_name(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setitem(current_app.conf, "task_always_eager", False)
    monkeypatch.setattr(
        current_app, "send_task", lambda name, args, **_: sent.append((name, tuple(args)))
    )
    held = held_refund()

    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    # The services name the task and never import it: the name is the one the worker knows.
    assert sent == [(confirmation_execute_task.name, (held.pk,))]
    held.refresh_from_db()
    assert held.status == "approved"
    assert ledger(order) == []


def test_nothing_executes_before_the_approval_commits(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()

    with django_capture_on_commit_callbacks(execute=False):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    held.refresh_from_db()
    assert held.status == "approved"
    assert ledger(order) == []


def test_an_identical_call_while_approved_gets_the_state_and_after_execution_the_result(
    holding_agent: Agent,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()
    with django_capture_on_commit_callbacks(execute=False):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    while_approved = refund_call(holding_agent, 6_000)
    confirmation_execute(confirmation_id=held.pk)
    after = refund_call(holding_agent, 6_000)

    assert while_approved.code == "CONFIRMATION_REQUIRED"
    assert while_approved.data["confirmation_id"] == held.pk
    assert while_approved.data["status"] == "approved"
    assert after.ok and after.replayed
    assert Confirmation.objects.count() == 1
    assert ledger(order) == [(6_000, "reviewer", "ana")]


def test_an_approval_covers_only_the_call_it_was_given_not_one_argument_changed(
    holding_agent: Agent,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(6_000)
    with django_capture_on_commit_callbacks(execute=False):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    changed = refund_call(holding_agent, 6_001)
    confirmation_execute(confirmation_id=held.pk)

    assert changed.code == "CONFIRMATION_REQUIRED"
    assert changed.data["confirmation_id"] != held.pk
    assert Confirmation.objects.get(pk=changed.data["confirmation_id"]).status == "pending"
    assert ledger(order) == [(6_000, "reviewer", "ana")]


def test_a_rejection_reaches_the_model_and_an_identical_call_replays_it(
    holding_agent: Agent, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()

    confirmation_reject(
        confirmation_id=held.pk, reviewer=reviewers[0], reason="customer already got a voucher"
    )
    again = refund_call(holding_agent, 6_000)

    held.refresh_from_db()
    assert held.status == "rejected"
    assert again.code == "CONFIRMATION_REJECTED"
    assert "customer already got a voucher" in again.message
    assert Confirmation.objects.count() == 1
    assert ledger(order) == []
    assert events(held) == [("rejected", "ana")]


def test_a_rejection_needs_a_reason(held_refund: HeldRefund, reviewers: list[User]) -> None:
    held = held_refund()

    with pytest.raises(ReasonRequired):
        confirmation_reject(confirmation_id=held.pk, reviewer=reviewers[0], reason="   ")

    held.refresh_from_db()
    assert held.status == "pending"


def test_a_decided_confirmation_cannot_be_decided_again(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()
    confirmation_reject(confirmation_id=held.pk, reviewer=reviewers[0], reason="no")

    with pytest.raises(AlreadyDecided, match="already rejected"):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1])

    assert ledger(order) == []


def test_an_expired_confirmation_cannot_be_approved(
    holding_agent: Agent, held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()
    Confirmation.objects.filter(pk=held.pk).update(expires_at=timezone.now() - timedelta(1))

    with pytest.raises(AlreadyDecided, match="expired"):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    held.refresh_from_db()
    assert held.status == "expired"
    assert events(held) == [("expired", "expiry")]
    assert ledger(order) == []
    # An expired call may be held again.
    again = refund_call(holding_agent, 6_000)
    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] != held.pk


def test_the_periodic_expiry_marks_only_what_is_due(held_refund: HeldRefund, order: Order) -> None:
    due = held_refund(6_000)
    live = held_refund(7_000)
    Confirmation.objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(1))

    expired = confirmations_expire_due()

    assert expired == 1
    assert Confirmation.objects.get(pk=due.pk).status == "expired"
    assert Confirmation.objects.get(pk=live.pk).status == "pending"
    assert IdempotencyRecord.objects.get(key=due.key).status == "open"


def test_a_large_refund_needs_two_different_reviewers(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(25_000)
    assert held.reviewers_required == 2

    with django_capture_on_commit_callbacks(execute=True):
        first = confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        with pytest.raises(AlreadyVoted):
            confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        assert first.status == "pending"
        assert ledger(order) == []
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1])

    held.refresh_from_db()
    assert held.status == "executed"
    assert ledger(order) == [(25_000, "reviewer", "ana, bruno")]


def test_above_a_reviewers_limit_their_approval_is_a_vote(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    ana, bruno, _ = reviewers
    ReviewerLimit.objects.create(reviewer=ana, currency="BRL", max_amount_cents=5_000)
    ReviewerLimit.objects.create(reviewer=bruno, currency="BRL", max_amount_cents=10_000)
    held = held_refund(8_000)

    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=ana)
        held.refresh_from_db()
        assert held.status == "pending"
        assert ledger(order) == []
        confirmation_approve(confirmation_id=held.pk, reviewer=bruno)

    held.refresh_from_db()
    assert held.status == "executed"
    assert ledger(order) == [(8_000, "reviewer", "ana, bruno")]


def test_an_approval_re_checks_the_live_state_and_invalidates_a_call_that_no_longer_passes(
    holding_agent: Agent,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(45_000)
    # Meanwhile most of the order was refunded by another approved refund.
    other = held_refund(48_000, session="s-2")
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=other.pk, reviewer=reviewers[0])
        confirmation_approve(confirmation_id=other.pk, reviewer=reviewers[1])

    with django_capture_on_commit_callbacks(execute=True) as enqueued:
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1])

    held.refresh_from_db()
    assert held.status == "invalidated"
    assert held.decision_code == "AMOUNT_EXCEEDS_REFUNDABLE"
    assert "42000 still refundable" in held.decision_reason
    assert enqueued == []
    assert ledger(order) == [(48_000, "reviewer", "ana, bruno")]


def test_a_refused_execution_fails_for_certain_and_moves_nothing(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()
    gateway_faults_set(fail_before_commit=3)

    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])

    held.refresh_from_db()
    assert held.status == "failed"
    assert held.result is not None and held.result["code"] == "UPSTREAM_UNAVAILABLE"
    assert ledger(order) == []


def test_a_lost_answer_is_unknown_and_reconciled_by_asking_the_gateway(
    holding_agent: Agent,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()
    gateway_faults_set(lose_response_after_commit=3)
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
    held.refresh_from_db()
    assert held.status == "unknown"
    while_unknown = refund_call(holding_agent, 6_000)

    confirmation_reconcile(confirmation_id=held.pk, reviewer=reviewers[1])

    held.refresh_from_db()
    assert while_unknown.code == "CONFIRMATION_REQUIRED"
    assert while_unknown.data["status"] == "unknown"
    assert held.status == "executed"
    assert held.result is not None and held.result["data"]["amount_cents"] == 6_000
    assert ledger(order) == [(6_000, "reviewer", "ana")]
    assert [kind for kind, _ in events(held)][-2:] == ["unknown", "reconciled"]


def test_reconciling_an_execution_that_never_happened_fails_it(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund()
    confirmation_rewrite(held.pk, status="unknown")

    confirmation_reconcile(confirmation_id=held.pk, reviewer=reviewers[0])

    held.refresh_from_db()
    assert held.status == "failed"
    assert ledger(order) == []


def test_only_an_unknown_execution_is_reconciled(
    held_refund: HeldRefund, reviewers: list[User]
) -> None:
    held = held_refund()

    with pytest.raises(NotReconcilable):
        confirmation_reconcile(confirmation_id=held.pk, reviewer=reviewers[0])


def test_a_redelivered_execution_moves_the_money_once(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund()
    with django_capture_on_commit_callbacks(execute=False):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
    # A worker claimed it and died before settling it.
    Confirmation.objects.filter(pk=held.pk).update(status="executing")

    confirmation_execute(confirmation_id=held.pk)
    confirmation_execute(confirmation_id=held.pk)

    held.refresh_from_db()
    assert held.status == "executed"
    assert ledger(order) == [(6_000, "reviewer", "ana")]


def test_an_admin_no_longer_sets_a_reviewers_limit_alone(
    admin_client: Any, reviewers: list[User]
) -> None:
    response = admin_client.post(
        "/admin/approvals/reviewerlimit/add/",
        {"reviewer": reviewers[0].pk, "currency": "BRL", "max_amount_cents": 20_000},
    )

    # A limit changes by a policy change a second manager approves (docs/identity.md).
    assert response.status_code == 403
    assert not ReviewerLimit.objects.filter(reviewer=reviewers[0]).exists()
    assert admin_client.get("/admin/approvals/confirmationevent/").status_code == 200
