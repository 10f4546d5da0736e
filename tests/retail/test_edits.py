"""A held return edited before approval: the reviewer returns fewer of the items asked, never
others, and the money the gate counts is the edited return's."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.services import EditRefused, confirmation_edit_approve
from dispatch.models import Agent, Confirmation, Movement
from retail.models import RetailOrder
from tests.retail.test_desk import desk_agent, post  # noqa: F401  (its fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def delivered_order_of_three_items() -> RetailOrder:
    """A delivered order of at least three items, paid by one method."""
    for order in RetailOrder.objects.filter(status="delivered").order_by("order_id"):
        payments = {payment.payment_method_id for payment in order.payments.all()}
        if order.items.count() >= 3 and len(payments) == 1:
            return order
    raise AssertionError("the retail data has no delivered order of three items")


def live_money() -> list[tuple[str, int]]:
    return sorted(
        Movement.objects.filter(released_at=None).values_list("confirmation_id", "amount_cents")
    )


@pytest.fixture
def held_return(retail_db: dict[str, Any], desk_agent: tuple[Agent, str]) -> Confirmation:  # noqa: F811
    order = delivered_order_of_three_items()
    items = list(order.items.order_by("position").values_list("item_id", flat=True))
    method = order.payments.first()
    assert method is not None
    result = post(
        Client(),
        desk_agent[1],
        "return_delivered_order_items",
        {
            "order_id": order.order_id,
            "item_ids": items,
            "payment_method_id": method.payment_method_id,
        },
        customer=order.user.user_id,
    )
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result["data"]["confirmation_id"])


@pytest.fixture
def rita(db: None) -> User:
    user = User.objects.create_user("rita", password="pw")
    user.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    return user


def test_a_reviewer_returns_fewer_items_and_the_edited_money_counts_instead(
    held_return: Confirmation, rita: User
) -> None:
    asked = held_return.arguments["item_ids"]
    order = RetailOrder.objects.get(order_id=held_return.arguments["order_id"])
    kept = asked[:1]
    price = order.items.get(item_id=kept[0]).price_cents

    edited = confirmation_edit_approve(
        confirmation_id=held_return.pk, reviewer=rita, changes={"item_ids": kept}
    )

    edited.refresh_from_db()
    assert edited.status == "executed", edited.result
    assert held_return.amount_cents is not None
    assert edited.amount_cents == price < held_return.amount_cents
    assert Movement.objects.get(key=edited.execution_key).approval == "reviewer"
    assert live_money() == [(edited.pk, price)]
    order.refresh_from_db()
    assert (order.status, order.return_items) == ("return requested", kept)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda asked: asked + asked[:1], "was not asked (or not as often)"),
        (lambda asked: ["9999999999"], "was not asked"),
        (lambda asked: [], "does not fit its schema"),
    ],
)
def test_a_return_edited_beyond_its_items_is_refused_and_moves_nothing(
    held_return: Confirmation, rita: User, edit: Any, words: str
) -> None:
    asked = held_return.arguments["item_ids"]

    with pytest.raises(EditRefused, match=re.escape(words)):
        confirmation_edit_approve(
            confirmation_id=held_return.pk, reviewer=rita, changes={"item_ids": edit(asked)}
        )

    held_return.refresh_from_db()
    assert held_return.status == "pending"
    assert live_money() == [(held_return.pk, held_return.amount_cents)]
