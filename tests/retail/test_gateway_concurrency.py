"""Retail writes at once, on real concurrent connections: each judged on what the writes before
it left, so an order is cancelled once and a gift card never pays more than its balance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from dispatch.pipeline.tools import Refused
from retail.book import OrderView, Plan, UserView, plan_cancel, plan_modify_payment
from retail.gateway import OrmRetailBook
from retail.models import Operation, PaymentMethod, RetailOrder
from tests.threads import run_together

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL row locking and real concurrent connections",
    ),
    pytest.mark.django_db(transaction=True),
]


def write(order: RetailOrder, key: str, judge: Callable[[OrderView, UserView], Plan | Any]) -> Any:
    def judged(view: OrderView | None, user: UserView) -> Any:
        assert view is not None
        return judge(view, user)

    return OrmRetailBook().write(
        tool="test",
        key=key,
        customer_id=order.user.user_id,
        order_id=order.order_id,
        judge=judged,
        answer=lambda view, user: {"status": view.status if view else None},
    )


def refusals(results: list[Any]) -> list[str]:
    return [r.rejection.code.name for r in results if isinstance(r, Refused)]


def test_eight_cancellations_of_one_order_at_once_cancel_it_once(
    retail_db: dict[str, Any],
) -> None:
    order = RetailOrder.objects.filter(
        status="pending", payments__payment_method_id__startswith="gift_card"
    ).first()
    assert order is not None
    [paid] = order.payments.all()
    card = PaymentMethod.objects.get(user=order.user, payment_method_id=paid.payment_method_id)
    balance = card.balance_cents
    assert balance is not None

    results = run_together(
        8,
        lambda n: write(order, f"cancel-{n}", lambda o, u: plan_cancel(o, u, "no longer needed")),
    )

    assert results.count({"status": "cancelled"}) == 1
    assert refusals(results) == ["ORDER_NOT_PENDING"] * 7
    card.refresh_from_db()
    assert card.balance_cents == balance + paid.amount_cents
    assert order.payments.count() == 2


def test_a_gift_card_paying_two_orders_at_once_pays_only_what_its_balance_covers(
    retail_db: dict[str, Any],
) -> None:
    # A user with a gift card and two pending orders paid once with something else.
    chosen: tuple[PaymentMethod, list[RetailOrder]] | None = None
    for card in PaymentMethod.objects.filter(source="gift_card").select_related("user"):
        orders = [
            o
            for o in RetailOrder.objects.filter(user=card.user, status="pending")
            if o.payments.count() == 1
            and not o.payments.get().payment_method_id.startswith("gift_card")
        ]
        if len(orders) >= 2:
            chosen = card, orders[:2]
            break
    assert chosen is not None
    card, orders = chosen
    amounts = [o.payments.get().amount_cents for o in orders]
    # Enough for either order, not for both: set with the operation that records it, as the
    # database asks of every balance change (docs/deploy.md).
    with transaction.atomic():
        PaymentMethod.objects.filter(pk=card.pk).update(balance_cents=max(amounts))
        Operation.objects.create(
            idempotency_key="test-balance", tool="test", subject=card.payment_method_id, result={}
        )

    results = run_together(
        2,
        lambda n: write(
            orders[n],
            f"pay-{n}",
            lambda o, u: plan_modify_payment(o, u, card.payment_method_id),
        ),
    )

    assert refusals(results) == ["GIFT_CARD_INSUFFICIENT_BALANCE"]
    paid = next(n for n, result in enumerate(results) if isinstance(result, dict))
    card.refresh_from_db()
    assert card.balance_cents == max(amounts) - amounts[paid]
    assert card.balance_cents >= 0
