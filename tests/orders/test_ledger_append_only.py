"""A refund that took effect cannot be edited or removed, not even with SQL (PostgreSQL)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from orders.gateway import OrmOrderBook
from orders.models import Order, Refund
from tests.factories import OrderFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's"
    ),
]


@pytest.fixture
def refund() -> Refund:
    order: Order = OrderFactory.create(order_id="ORD-1001", customer_id="CUS-1")
    OrmOrderBook().refund(
        customer_id="CUS-1",
        order_id=order.order_id,
        amount_cents=1000,
        currency=order.currency,
        reason="damaged",
        key="k-1",
        approved_by=(),
    )
    return Refund.objects.get()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE orders_refund SET amount_cents = 1 WHERE id = %s",
        "DELETE FROM orders_refund WHERE id = %s",
    ],
    ids=["a changed amount", "a delete"],
)
def test_the_database_refuses_to_change_or_remove_a_ledger_row(
    refund: Refund, statement: str
) -> None:
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [refund.pk])

    assert Refund.objects.get(pk=refund.pk).amount_cents == 1000
