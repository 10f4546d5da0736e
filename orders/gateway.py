"""The refund gateway on the database: the OrderBook the service runs on.

It behaves like `orders.book.InMemoryOrderBook`, under any number of processes: a key refunds at
most once, a repeated key returns the first receipt, and the ledger always adds up to the order's
refunded_cents, which never passes its total.
"""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from dispatch.pipeline.tools import OutcomeUnknownError, TransientError
from orders.book import OrderView, RefundReceipt, RefundRefused
from orders.models import Order, Refund
from orders.services import GatewayFaultKind, gateway_fault_consume

_ORDER_VIEW_FIELDS = ("order_id", "customer_id", "total_cents", "currency", "refunded_cents")


def _fault(kind: GatewayFaultKind) -> bool:
    # Each check is a query on every refund, so production switches them off altogether.
    return bool(settings.TOOLGATE_GATEWAY_FAULTS) and gateway_fault_consume(kind=kind)


class OrmOrderBook:
    def find(self, *, customer_id: str, order_id: str) -> OrderView | None:
        row = (
            Order.objects.filter(order_id=order_id, customer_id=customer_id)
            .values_list(*_ORDER_VIEW_FIELDS)
            .first()
        )
        return None if row is None else OrderView(*row)

    def refund(
        self,
        *,
        customer_id: str,
        order_id: str,
        amount_cents: int,
        currency: str,
        reason: str,
        key: str,
        approved_by: str,
    ) -> RefundReceipt:
        receipt = self._receipt_for_key(key)
        if receipt is None:
            if _fault("fail_before_commit"):
                raise TransientError("gateway unavailable")
            receipt = self._apply(
                customer_id=customer_id,
                order_id=order_id,
                amount_cents=amount_cents,
                currency=currency,
                reason=reason,
                key=key,
                approved_by=approved_by,
            )
        if _fault("lose_response_after_commit"):
            raise OutcomeUnknownError("gateway response lost after commit")
        return receipt

    def _apply(
        self,
        *,
        customer_id: str,
        order_id: str,
        amount_cents: int,
        currency: str,
        reason: str,
        key: str,
        approved_by: str,
    ) -> RefundReceipt:
        try:
            with transaction.atomic():
                # Check and write in one statement: the row lock makes concurrent refunds of the
                # same order queue here, and each re-evaluates the condition on the latest row.
                updated = Order.objects.filter(
                    order_id=order_id,
                    customer_id=customer_id,
                    currency=currency,
                    refunded_cents__lte=F("total_cents") - amount_cents,
                ).update(refunded_cents=F("refunded_cents") + amount_cents)
                if updated == 0:
                    raise self._refusal(
                        customer_id=customer_id, order_id=order_id, currency=currency
                    )
                # Our update holds the row lock until commit, so this is exactly our result.
                pk, refunded_cents, total_cents = (
                    Order.objects.filter(order_id=order_id)
                    .values_list("pk", "refunded_cents", "total_cents")
                    .get()
                )
                refund = Refund.objects.create(
                    order_id=pk,
                    idempotency_key=key,
                    amount_cents=amount_cents,
                    currency=currency,
                    reason=reason,
                    approved_by=approved_by,
                    refunded_cents_after=refunded_cents,
                )
        except IntegrityError:
            # A concurrent call with the same key committed first; leaving the atomic block
            # rolled back our order update too, so the twin's refund is the only one.
            twin = self._receipt_for_key(key)
            if twin is None:
                raise
            return twin
        return RefundReceipt(
            refund_id=f"RF-{refund.pk}",
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            refunded_cents=refunded_cents,
            total_cents=total_cents,
        )

    def _refusal(self, *, customer_id: str, order_id: str, currency: str) -> RefundRefused:
        order = self.find(customer_id=customer_id, order_id=order_id)
        if order is None:
            return RefundRefused(RefundRefused.NOT_FOUND)
        if order.currency != currency:
            return RefundRefused(RefundRefused.CURRENCY_MISMATCH, order)
        return RefundRefused(RefundRefused.EXCEEDS_REFUNDABLE, order)

    def _receipt_for_key(self, key: str) -> RefundReceipt | None:
        row = (
            Refund.objects.filter(idempotency_key=key)
            .values_list(
                "pk",
                "order__order_id",
                "amount_cents",
                "currency",
                "refunded_cents_after",
                "order__total_cents",
            )
            .first()
        )
        if row is None:
            return None
        pk, order_id, amount_cents, currency, refunded_cents, total_cents = row
        return RefundReceipt(
            refund_id=f"RF-{pk}",
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            refunded_cents=refunded_cents,
            total_cents=total_cents,
        )
