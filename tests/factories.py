"""factory_boy factories for the suite's database rows; `.create()` returns the typed model."""

from __future__ import annotations

from factory.declarations import Sequence
from factory.django import DjangoModelFactory

from orders.models import Currency, Order


class OrderFactory(DjangoModelFactory[Order]):
    class Meta:
        model = Order

    # factory_boy leaves its declarations untyped.
    order_id = Sequence(lambda n: f"ORD-{2000 + n}")  # type: ignore[no-untyped-call]
    customer_id = "CUS-1"
    total_cents = 12_000
    currency = Currency.BRL
