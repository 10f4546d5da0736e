"""Edit, then approve: a reviewer approves less than the model asked. The held call is never
changed: the edit is a new confirmation linked to it, judged again, which takes its key and its
money's place in the customer's sum, and executes once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals.models import ConfirmationEvent, WebhookDelivery
from approvals.services import (
    AlreadyDecided,
    EditRefused,
    PossibleDuplicate,
    SecondLookRequired,
    confirmation_approve,
    confirmation_edit_approve,
    confirmation_reject,
)
from dispatch.models import Agent, Confirmation, IdempotencyRecord, Movement, Session
from dispatch.selectors import confirmation_state
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund, refund_call

Capture = Callable[..., Any]


def counted_money() -> list[tuple[str, int]]:
    """The held and approved money that counts in the customer's sum now, by confirmation."""
    return sorted(
        Movement.objects.filter(released_at=None).values_list("confirmation_id", "amount_cents")
    )


def ledger(order: Order) -> list[int]:
    return list(Refund.objects.filter(order=order).values_list("amount_cents", flat=True))


def test_an_edited_refund_executes_the_lower_amount_once_and_supersedes_the_held_one(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(8_000)

    with django_capture_on_commit_callbacks(execute=True):
        edited = confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )

    held.refresh_from_db()
    edited.refresh_from_db()
    assert held.status == "superseded"
    assert held.arguments["amount_cents"] == 8_000
    assert edited.status == "executed"
    assert edited.edited_from == held.pk
    assert edited.key == held.key
    assert edited.arguments == {**held.arguments, "amount_cents": 6_000}
    assert list(edited.votes.values_list("reviewer__username", flat=True)) == ["ana"]
    assert edited.result is not None and edited.result["ok"]
    assert edited.result["data"]["edited"] == {"amount_cents": {"asked": 8_000, "executed": 6_000}}
    assert "differs from what was asked" in edited.result["model_text"]
    assert ledger(order) == [6_000]


def test_the_edit_is_a_chained_event_with_who_before_and_after(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)

    edited = confirmation_edit_approve(
        confirmation_id=held.pk, reviewer=reviewers[1], changes={"amount_cents": 7_000}
    )

    event = ConfirmationEvent.objects.get(confirmation=edited, kind="edited")
    assert event.actor_label == "bruno"
    assert event.data == {
        "edited_from": held.pk,
        "before": {"amount_cents": 8_000},
        "after": {"amount_cents": 7_000},
    }
    assert event.chain_seq == 1
    superseded = ConfirmationEvent.objects.get(confirmation=held, kind="superseded")
    assert superseded.data["edited_into"] == edited.pk


def test_the_sum_counts_the_edited_amount_not_both_and_not_neither(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    # From 200.00 two reviewers decide: the first approval of the edit is a vote, so the edited
    # call waits with its money held.
    held = held_refund(25_000)
    assert counted_money() == [(held.pk, 25_000)]

    edited = confirmation_edit_approve(
        confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 21_000}
    )

    assert edited.status == "pending"
    assert counted_money() == [(edited.pk, 21_000)]
    assert ledger(order) == []


def test_the_model_resending_its_call_gets_the_edited_calls_state_not_a_new_hold(
    held_refund: HeldRefund, holding_agent: Agent, reviewers: list[User], order: Order
) -> None:
    held = held_refund(25_000)
    steps = Session.objects.get(session_id="s-1").steps
    edited = confirmation_edit_approve(
        confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 21_000}
    )

    again = refund_call(holding_agent, 25_000)

    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] == edited.pk
    assert Confirmation.objects.count() == 2
    assert IdempotencyRecord.objects.get(key=held.key).confirmation_id == edited.pk
    # The edit used no step of the agent's budget; the resent call one.
    assert Session.objects.get(session_id="s-1").steps == steps + 1
    assert counted_money() == [(edited.pk, 21_000)]


def test_the_agent_polling_the_held_call_is_sent_to_the_edited_one(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)

    edited = confirmation_edit_approve(
        confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
    )

    held.refresh_from_db()
    state = confirmation_state(held)
    assert (state["status"], state["final"], state["superseded_by"]) == (
        "superseded",
        True,
        edited.pk,
    )
    edited.refresh_from_db()
    assert confirmation_state(edited)["edited_from"] == {
        "confirmation_id": held.pk,
        "arguments": held.arguments,
    }


def test_the_model_sending_the_edited_amount_itself_is_held_as_a_possible_duplicate(
    held_refund: HeldRefund,
    holding_agent: Agent,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(8_000)
    with django_capture_on_commit_callbacks(execute=True):
        edited = confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )

    # In the same conversation, the amount the reviewer approved, sent by the model itself.
    again = refund_call(holding_agent, 6_000)

    assert again.code == "CONFIRMATION_REQUIRED"
    twin = Confirmation.objects.get(pk=again.data["confirmation_id"])
    assert twin.duplicate_of == edited.execution_key
    assert ledger(order) == [6_000]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"amount_cents": 9_000}, "is more than the 8000 asked"),
        ({"order_id": "ORD-3002"}, "order_id cannot be changed"),
        ({"amount_cents": 6_000, "currency": "USD"}, "currency cannot be changed"),
        ({"amount_cents": 0}, "does not fit its schema"),
        ({"amount_cents": "60.00"}, "give a whole number"),
        ({"amount_cents": 60.0}, "give a whole number"),
        ({"amount_cents": 8_000}, "Nothing was changed"),
        ({}, "Nothing was changed"),
    ],
)
def test_an_edit_outside_the_tools_rules_is_refused_and_moves_nothing(
    changes: dict[str, Any],
    words: str,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
) -> None:
    held = held_refund(8_000)

    with pytest.raises(EditRefused, match=words):
        confirmation_edit_approve(confirmation_id=held.pk, reviewer=reviewers[0], changes=changes)

    held.refresh_from_db()
    assert held.status == "pending"
    assert Confirmation.objects.count() == 1
    assert not ConfirmationEvent.objects.filter(confirmation=held).exists()
    assert counted_money() == [(held.pk, 8_000)]
    assert ledger(order) == []


def test_an_edit_whose_call_no_longer_passes_its_checks_is_refused(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)
    # Meanwhile the order was refunded but for 10.00 (its ledger row kept in step).
    Refund.objects.create(
        order=order,
        idempotency_key="elsewhere",
        amount_cents=order.total_cents - 1_000,
        currency="BRL",
        reason="damaged",
        approval="policy",
        refunded_cents_after=order.total_cents - 1_000,
    )
    Order.objects.filter(pk=order.pk).update(refunded_cents=order.total_cents - 1_000)

    with pytest.raises(EditRefused, match="does not pass its checks"):
        confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )

    assert Confirmation.objects.count() == 1
    assert counted_money() == [(held.pk, 8_000)]


def test_a_decided_call_cannot_be_edited(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held = held_refund(8_000)
    confirmation_reject(confirmation_id=held.pk, reviewer=reviewers[0], reason="no")

    with pytest.raises(AlreadyDecided):
        confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[1], changes={"amount_cents": 6_000}
        )

    assert Confirmation.objects.count() == 1


def test_an_edit_whose_approval_is_refused_is_not_made_either(
    make_agent: Any,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    agent = make_agent(
        auto_approve_below_cents=5_000, two_reviewers_from_cents=None, confirm_above_cents=5_000
    )[0]
    result = refund_call(agent, 8_000)
    held = Confirmation.objects.get(pk=result.data["confirmation_id"])

    with pytest.raises(SecondLookRequired):
        confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 7_000}
        )

    held.refresh_from_db()
    assert held.status == "pending"
    assert Confirmation.objects.count() == 1
    assert counted_money() == [(held.pk, 8_000)]

    with django_capture_on_commit_callbacks(execute=True):
        edited = confirmation_edit_approve(
            confirmation_id=held.pk,
            reviewer=reviewers[0],
            changes={"amount_cents": 7_000},
            confirmed=True,
        )
    edited.refresh_from_db()
    assert edited.status == "executed"
    assert ledger(order) == [7_000]


def test_a_superseded_call_cannot_be_approved_after_its_edit(
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(8_000)
    with django_capture_on_commit_callbacks(execute=True):
        confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )

    with pytest.raises(AlreadyDecided, match="superseded"):
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[1])

    assert ledger(order) == [6_000]


def test_the_agents_webhook_hears_the_held_call_superseded_and_the_edited_one_executed(
    held_refund: HeldRefund,
    holding_agent: Agent,
    reviewers: list[User],
    order: Order,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    held = held_refund(8_000)
    Agent.objects.filter(pk=holding_agent.pk).update(webhook_url="https://hooks.example.com/t")

    with django_capture_on_commit_callbacks(execute=False):
        edited = confirmation_edit_approve(
            confirmation_id=held.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )

    told = {
        (delivery.confirmation_id, delivery.event): delivery.payload["confirmation"]
        for delivery in WebhookDelivery.objects.all()
    }
    assert told[(held.pk, "superseded")]["superseded_by"] == edited.pk
    assert told[(edited.pk, "approved")]["edited_from"]["arguments"]["amount_cents"] == 8_000
    assert told[(edited.pk, "approved")]["arguments"]["amount_cents"] == 6_000


def test_an_edited_possible_duplicate_stays_one_and_needs_the_reviewers_word(
    held_refund: HeldRefund, reviewers: list[User], order: Order
) -> None:
    held_refund(8_000)
    twin = held_refund(8_000, session="s-2")
    assert twin.duplicate_of

    with pytest.raises(PossibleDuplicate):
        confirmation_edit_approve(
            confirmation_id=twin.pk, reviewer=reviewers[0], changes={"amount_cents": 6_000}
        )
    assert Confirmation.objects.filter(edited_from=twin.pk).count() == 0

    edited = confirmation_edit_approve(
        confirmation_id=twin.pk,
        reviewer=reviewers[0],
        changes={"amount_cents": 6_000},
        separate=True,
    )

    assert edited.duplicate_of == twin.duplicate_of
    assert ConfirmationEvent.objects.filter(confirmation=edited, kind="separate").exists()
