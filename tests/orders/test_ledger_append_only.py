"""A refund that took effect cannot be edited or removed, not even with SQL (PostgreSQL), and an
order's refunded_cents cannot move without its ledger row."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from pytest_django.fixtures import Settings

from orders.book import RefundReceipt
from orders.gateway import OrmOrderBook
from orders.models import Order, Refund
from tests.factories import OrderFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the ledger's triggers are PostgreSQL's"
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


# What follows commits: the check on refunded_cents runs at commit, which a test's own
# transaction never reaches.
commits = pytest.mark.django_db(transaction=True)


@commits
def test_the_database_refuses_to_commit_refunded_cents_without_a_ledger_row() -> None:
    order: Order = OrderFactory.create(order_id="ORD-1001")

    with pytest.raises(IntegrityError, match="ledger rows add up to 0"), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(refunded_cents=1000)

    order.refresh_from_db()
    assert order.refunded_cents == 0


@commits
def test_the_database_refuses_to_commit_a_ledger_row_the_order_did_not_take() -> None:
    order: Order = OrderFactory.create(order_id="ORD-1001")

    with pytest.raises(IntegrityError, match="ledger rows add up to 1000"), transaction.atomic():
        Refund.objects.create(
            order=order,
            idempotency_key="k-1",
            amount_cents=1000,
            currency=order.currency,
            reason="damaged",
            approval="policy",
            refunded_cents_after=1000,
        )

    assert not Refund.objects.exists()


@commits
def test_a_refund_whose_key_was_taken_gives_its_amount_back_and_commits(
    settings: Settings,
) -> None:
    # Without the fault switch the gateway does not look the key up first: the second refund
    # takes the amount, finds the key in the ledger, and gives the amount back.
    settings.TOOLGATE_GATEWAY_FAULTS = False
    order: Order = OrderFactory.create(order_id="ORD-1001", customer_id="CUS-1")
    first = _refund_ord_1001(key="k-1")

    again = _refund_ord_1001(key="k-1")

    assert again == first
    order.refresh_from_db()
    assert (Refund.objects.count(), order.refunded_cents) == (1, 1000)


def _refund_ord_1001(*, key: str) -> RefundReceipt:
    return OrmOrderBook().refund(
        customer_id="CUS-1",
        order_id="ORD-1001",
        amount_cents=1000,
        currency="BRL",
        reason="damaged",
        key=key,
        approved_by=(),
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("total_cents", 99_000),
        ("currency", "USD"),
        ("customer_id", "CUS-2"),
        ("order_id", "ORD-9999"),
    ],
)
def test_what_a_refund_was_judged_against_never_changes_after_it(
    refund: Refund, field: str, value: object
) -> None:
    order = refund.order

    with (
        pytest.raises(DatabaseError, match="has rows in orders_refund"),
        transaction.atomic(),
    ):
        Order.objects.filter(pk=order.pk).update(**{field: value})

    assert Order.objects.filter(pk=order.pk).values_list(field, flat=True).get() == getattr(
        order, field
    )


@commits
def test_an_order_is_edited_as_the_admin_does_until_its_first_refund() -> None:
    order: Order = OrderFactory.create(order_id="ORD-1001", customer_id="CUS-1")
    order.total_cents, order.customer_id, order.currency = 20_000, "CUS-2", "USD"
    order.save(update_fields=["total_cents", "customer_id", "currency"])

    receipt = OrmOrderBook().refund(
        customer_id="CUS-2",
        order_id="ORD-1001",
        amount_cents=1000,
        currency="USD",
        reason="damaged",
        key="k-1",
        approved_by=(),
    )

    assert (receipt.total_cents, receipt.refunded_cents) == (20_000, 1000)
    with pytest.raises(DatabaseError, match="no longer change"), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(total_cents=1000)
    # The same value written again changes nothing: the admin's save of an untouched field.
    Order.objects.filter(pk=order.pk).update(total_cents=20_000)
    assert Order.objects.get(pk=order.pk).total_cents == 20_000
