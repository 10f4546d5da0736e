"""The named actions on orders and on the gateway's fault switch.

Refunds are not here: they move money only through `orders.gateway.OrmOrderBook.refund`.
"""

from __future__ import annotations

from typing import Literal

from django.db import transaction
from django.db.models import F

from orders.models import Currency, GatewayFault, Order

GatewayFaultKind = Literal["fail_before_commit", "lose_response_after_commit"]


@transaction.atomic
def order_create(
    *, order_id: str, customer_id: str, total_cents: int, currency: Currency | str
) -> Order:
    order = Order(
        order_id=order_id,
        customer_id=customer_id,
        total_cents=total_cents,
        currency=currency,
    )
    order.full_clean()
    order.save()
    return order


@transaction.atomic
def gateway_faults_set(
    *, fail_before_commit: int = 0, lose_response_after_commit: int = 0
) -> GatewayFault:
    fault, _ = GatewayFault.objects.update_or_create(
        pk=1,
        defaults={
            "fail_before_commit": fail_before_commit,
            "lose_response_after_commit": lose_response_after_commit,
        },
    )
    return fault


def gateway_fault_consume(*, kind: GatewayFaultKind) -> bool:
    """Consume one fault of this kind if any is left; True if one was consumed.

    One conditional UPDATE, so concurrent refunds never consume the same fault twice.
    """
    consumed = GatewayFault.objects.filter(pk=1, **{f"{kind}__gt": 0}).update(**{kind: F(kind) - 1})
    return consumed == 1
