"""The desk's money changes only with its operation (PostgreSQL): a gift card's balance, an order's
payment lines and its items' prices commit only in a transaction that records a row of
retail_operation, as the desk's writes and `load_retail` do."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import F

from retail.book import OrderView, UserView, plan_cancel
from retail.gateway import OrmRetailBook
from retail.models import Operation, OrderItem, Payment, PaymentMethod, RetailOrder

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the money guards are PostgreSQL triggers"
    ),
    # The guards run at commit, which a test's own transaction never reaches.
    pytest.mark.django_db(transaction=True),
]


def _gift_card_order() -> tuple[RetailOrder, PaymentMethod]:
    order = RetailOrder.objects.filter(
        status="pending", payments__payment_method_id__startswith="gift_card"
    ).first()
    assert order is not None
    [paid] = order.payments.all()
    card = PaymentMethod.objects.get(user=order.user, payment_method_id=paid.payment_method_id)
    return order, card


def _state(order: RetailOrder, card: PaymentMethod) -> tuple[Any, ...]:
    return (
        PaymentMethod.objects.get(pk=card.pk).balance_cents,
        list(Payment.objects.filter(order=order).values_list("transaction_type", "amount_cents")),
        list(OrderItem.objects.filter(order=order).values_list("item_id", "price_cents")),
        RetailOrder.objects.get(pk=order.pk).status,
    )


def test_a_gift_card_balance_changed_without_its_operation_is_refused_at_commit(
    retail_db: dict[str, Any],
) -> None:
    order, card = _gift_card_order()
    before = _state(order, card)

    with (
        pytest.raises(IntegrityError, match="retail_paymentmethod: UPDATE without a row of"),
        transaction.atomic(),
    ):
        PaymentMethod.objects.filter(pk=card.pk).update(balance_cents=F("balance_cents") + 100_000)

    assert _state(order, card) == before


def test_a_payment_line_or_an_item_price_without_its_operation_is_refused_at_commit(
    retail_db: dict[str, Any],
) -> None:
    order, card = _gift_card_order()
    before = _state(order, card)

    with pytest.raises(IntegrityError, match="retail_payment: INSERT"), transaction.atomic():
        Payment.objects.create(
            order=order,
            position=9,
            transaction_type="payment",
            amount_cents=1_000_000,
            payment_method_id=card.payment_method_id,
        )
    with pytest.raises(IntegrityError, match="retail_orderitem: UPDATE"), transaction.atomic():
        OrderItem.objects.filter(order=order).update(price_cents=1_000_000)
    with pytest.raises(IntegrityError, match="retail_paymentmethod: INSERT"), transaction.atomic():
        PaymentMethod.objects.create(
            user=order.user,
            payment_method_id="gift_card_0000001",
            source="gift_card",
            balance_cents=1_000_000,
            position=99,
        )

    assert _state(order, card) == before


def test_a_desk_write_commits_its_balance_and_payments_with_its_operation(
    retail_db: dict[str, Any],
) -> None:
    order, card = _gift_card_order()
    balance = card.balance_cents
    assert balance is not None
    paid = order.payments.get().amount_cents

    def judge(view: OrderView | None, user: UserView) -> Any:
        assert view is not None
        return plan_cancel(view, user, "no longer needed")

    # Inside a caller's transaction, as a call's execution runs it: the write is a savepoint.
    with transaction.atomic():
        OrmRetailBook().write(
            tool="cancel_pending_order",
            key="guards-cancel",
            customer_id=order.user.user_id,
            order_id=order.order_id,
            judge=judge,
            answer=lambda view, user: {"status": view.status if view else None},
        )

    assert PaymentMethod.objects.get(pk=card.pk).balance_cents == balance + paid
    assert list(order.payments.values_list("transaction_type", flat=True)) == [
        "payment",
        "refund",
    ]
    assert Operation.objects.filter(idempotency_key="guards-cancel").exists()


def test_an_operation_keeps_the_transaction_that_recorded_it_whatever_the_insert_says(
    retail_db: dict[str, Any],
) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        operation = Operation.objects.create(
            idempotency_key="forged", tool="t", subject="s", result={}, transaction_id=1
        )
        cursor.execute("SELECT txid_current()")
        (current,) = cursor.fetchone()

    assert Operation.objects.get(pk=operation.pk).transaction_id == current != 1
