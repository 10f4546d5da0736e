"""The orders app on the database: a gateway, an order, and a refund call with defaults."""

from __future__ import annotations

from typing import Any, Protocol

import pytest

from orders.book import RefundReceipt
from orders.gateway import OrmOrderBook
from orders.models import Order
from tests.factories import OrderFactory


class RefundCall(Protocol):
    def __call__(self, **overrides: Any) -> RefundReceipt: ...


@pytest.fixture
def book() -> OrmOrderBook:
    return OrmOrderBook()


@pytest.fixture
def order(db: None) -> Order:
    return OrderFactory.create(order_id="ORD-1001")


@pytest.fixture
def refund(book: OrmOrderBook, order: Order) -> RefundCall:
    def call(**overrides: Any) -> RefundReceipt:
        arguments: dict[str, Any] = {
            "customer_id": order.customer_id,
            "order_id": order.order_id,
            "amount_cents": 1000,
            "currency": order.currency,
            "reason": "damaged",
            "key": "key-1",
            "approved_by": ("reviewer-1",),
        }
        arguments.update(overrides)
        return book.refund(**arguments)

    return call
