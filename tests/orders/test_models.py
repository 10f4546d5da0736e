from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F

from orders.models import Currency, Order, Refund, RefundReason
from orders.services import order_create
from orders.tools import (
    CURRENCIES,
    REFUND_REASON_CODES,
    REFUND_REASONS,
    RefundOrderArguments,
    RefundOrderV2Arguments,
)
from tests.factories import OrderFactory

pytestmark = pytest.mark.django_db


def test_the_model_choices_are_the_tool_enums() -> None:
    assert tuple(Currency.values) == CURRENCIES
    assert tuple(RefundReason.values) == tuple(dict.fromkeys(REFUND_REASONS + REFUND_REASON_CODES))
    schema = RefundOrderArguments.model_json_schema()["properties"]
    assert tuple(schema["currency"]["enum"]) == CURRENCIES
    assert tuple(schema["reason"]["enum"]) == REFUND_REASONS
    v2 = RefundOrderV2Arguments.model_json_schema()["properties"]
    assert tuple(v2["currency"]["enum"]) == CURRENCIES
    assert tuple(v2["reason_code"]["enum"]) == REFUND_REASON_CODES


def test_order_create_stores_a_valid_order() -> None:
    order = order_create(
        order_id="ORD-1001", customer_id="CUS-1", total_cents=12_000, currency=Currency.BRL
    )

    order.refresh_from_db()
    assert (order.order_id, order.total_cents, order.refunded_cents) == ("ORD-1001", 12_000, 0)
    assert str(order) == "ORD-1001 (CUS-1)"


@pytest.mark.parametrize(
    "order_id", ["ORD-12a", "ORD-١٢٣", "ord-1001", "ORD-", "ORD-1234567890123"]
)
def test_order_create_rejects_order_ids_outside_the_tool_pattern(order_id: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        order_create(order_id=order_id, customer_id="CUS-1", total_cents=100, currency="BRL")

    assert "order_id" in excinfo.value.message_dict
    assert not Order.objects.exists()


def test_order_create_rejects_an_unknown_currency() -> None:
    with pytest.raises(ValidationError) as excinfo:
        order_create(order_id="ORD-1", customer_id="CUS-1", total_cents=100, currency="GBP")

    assert "currency" in excinfo.value.message_dict
    assert not Order.objects.exists()


def test_the_database_refuses_refunded_cents_above_the_total() -> None:
    order = OrderFactory.create(total_cents=12_000)

    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(refunded_cents=F("total_cents") + 1)

    order.refresh_from_db()
    assert order.refunded_cents == 0


def test_the_database_refuses_negative_refunded_cents() -> None:
    order = OrderFactory.create()

    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.filter(pk=order.pk).update(refunded_cents=-1)

    order.refresh_from_db()
    assert order.refunded_cents == 0


def test_the_database_refuses_an_order_without_a_total() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(order_id="ORD-1", customer_id="CUS-1", total_cents=0, currency="BRL")

    assert not Order.objects.exists()


def test_the_database_refuses_a_refund_of_nothing() -> None:
    order = OrderFactory.create()

    with pytest.raises(IntegrityError), transaction.atomic():
        Refund.objects.create(
            order=order,
            idempotency_key="key-1",
            amount_cents=0,
            currency="BRL",
            reason="damaged",
            approval="policy",
            refunded_cents_after=0,
        )

    assert not Refund.objects.exists()
