"""Many refunds at once, on real concurrent connections: the ledger invariant holds."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Sum

from orders.book import RefundReceipt, RefundRefused
from orders.gateway import OrmOrderBook
from orders.models import Order, Refund
from tests.factories import OrderFactory
from tests.threads import run_together

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL row locking and real concurrent connections",
    ),
    pytest.mark.django_db(transaction=True),
]


def refund(order: Order, *, amount_cents: int, key: str) -> RefundReceipt:
    return OrmOrderBook().refund(
        customer_id=order.customer_id,
        order_id=order.order_id,
        amount_cents=amount_cents,
        currency=order.currency,
        reason="damaged",
        key=key,
        approved_by=(),
    )


def test_the_same_key_refunded_by_32_threads_at_once_refunds_once() -> None:
    order = OrderFactory.create(total_cents=12_000)

    results = run_together(32, lambda _: refund(order, amount_cents=1000, key="same-key"))

    receipts = [result for result in results if isinstance(result, RefundReceipt)]
    assert len(receipts) == 32, [r for r in results if not isinstance(r, RefundReceipt)]
    assert len(set(receipts)) == 1
    assert Refund.objects.filter(order=order).count() == 1
    order.refresh_from_db()
    assert order.refunded_cents == 1000
    assert receipts[0].refunded_cents == 1000


def test_50_threads_refunding_one_order_at_once_never_pass_its_total() -> None:
    order = OrderFactory.create(total_cents=12_000)

    results = run_together(50, lambda i: refund(order, amount_cents=500, key=f"key-{i}"))

    receipts = [result for result in results if isinstance(result, RefundReceipt)]
    refusals = [result for result in results if isinstance(result, RefundRefused)]
    assert len(receipts) == 24
    assert len(refusals) == 26
    assert {refusal.reason for refusal in refusals} == {RefundRefused.EXCEEDS_REFUNDABLE}
    order.refresh_from_db()
    ledger_sum = Refund.objects.filter(order=order).aggregate(total=Sum("amount_cents"))["total"]
    assert order.refunded_cents == ledger_sum == 12_000 <= order.total_cents
    assert Refund.objects.filter(order=order).count() == 24
    # Each receipt saw its own refund land on top of the ones before it.
    assert sorted(receipt.refunded_cents for receipt in receipts) == list(range(500, 12_001, 500))
