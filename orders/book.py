"""The order book port: what the order tools need from the system of record.

`orders.gateway.OrmOrderBook` is the real one, on the database; `InMemoryOrderBook` serves the
core's unit tests and its benchmark. Both refund idempotently by key, as a payment gateway does,
and both can be told to fail on purpose.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, Protocol

from dispatch.pipeline.state import Lookup
from dispatch.pipeline.tools import OutcomeUnknownError, TransientError

# The order tools' lookup (ToolSpec.lookup): the order, by id and customer, as OrderBook.find
# reads it; orders.gateway says how a store reads it (ORDER_LOOKUP_SOURCE).
ORDER_SOURCE = "orders.order"


def order_lookup(customer_id: str, order_id: str) -> Lookup:
    return Lookup(ORDER_SOURCE, {"order_id": order_id, "customer_id": customer_id})


class OrderView(NamedTuple):
    order_id: str
    customer_id: str
    total_cents: int
    currency: str
    refunded_cents: int
    # When it was placed, where the book keeps it.
    placed_at: datetime | None = None

    @property
    def refundable_cents(self) -> int:
        return self.total_cents - self.refunded_cents


class RefundReceipt(NamedTuple):
    refund_id: str
    order_id: str
    amount_cents: int
    currency: str
    refunded_cents: int
    total_cents: int


class RefundRefused(Exception):
    """The refund cannot happen, and nothing happened. `reason` is one of the constants below."""

    NOT_FOUND = "not_found"
    CURRENCY_MISMATCH = "currency_mismatch"
    EXCEEDS_REFUNDABLE = "exceeds_refundable"

    def __init__(self, reason: str, order: OrderView | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.order = order


@dataclass
class GatewayFaults:
    """Failures to inject into the next refunds, consumed one per refund attempt."""

    # Fail before anything is written: a clean transient error.
    fail_before_commit: int = 0
    # Write the refund, then lose the answer: the caller cannot know it happened.
    lose_response_after_commit: int = 0


class OrderBook(Protocol):
    def find(self, *, customer_id: str, order_id: str) -> OrderView | None:
        """The order if it exists and belongs to the customer; otherwise None, alike."""
        ...

    def refund(
        self,
        *,
        customer_id: str,
        order_id: str,
        amount_cents: int,
        currency: str,
        reason: str,
        key: str,
        approved_by: tuple[str, ...],
    ) -> RefundReceipt:
        """Refund once per key: a repeated key returns the first receipt and moves no money.

        approved_by names the reviewers who approved it; none: the policy let it through."""
        ...

    def receipt_for_key(self, key: str) -> RefundReceipt | None:
        """The receipt of the refund made under that key, or None if none was."""
        ...


@dataclass
class InMemoryOrderBook:
    orders: dict[str, OrderView] = field(default_factory=dict)
    receipts: dict[str, RefundReceipt] = field(default_factory=dict)
    faults: GatewayFaults = field(default_factory=GatewayFaults)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, order_id: str, customer_id: str, total_cents: int, currency: str) -> None:
        self.orders[order_id] = OrderView(order_id, customer_id, total_cents, currency, 0)

    def find(self, *, customer_id: str, order_id: str) -> OrderView | None:
        order = self.orders.get(order_id)
        if order is None or order.customer_id != customer_id:
            return None
        return order

    def refund(
        self,
        *,
        customer_id: str,
        order_id: str,
        amount_cents: int,
        currency: str,
        reason: str,
        key: str,
        approved_by: tuple[str, ...],
    ) -> RefundReceipt:
        with self._lock:
            receipt = self.receipts.get(key) or self._apply(
                customer_id=customer_id,
                order_id=order_id,
                amount_cents=amount_cents,
                currency=currency,
                key=key,
            )
            if self.faults.lose_response_after_commit > 0:
                self.faults.lose_response_after_commit -= 1
                raise OutcomeUnknownError("gateway response lost after commit")
            return receipt

    def receipt_for_key(self, key: str) -> RefundReceipt | None:
        return self.receipts.get(key)

    def _apply(
        self, *, customer_id: str, order_id: str, amount_cents: int, currency: str, key: str
    ) -> RefundReceipt:
        if self.faults.fail_before_commit > 0:
            self.faults.fail_before_commit -= 1
            raise TransientError("gateway unavailable")
        order = self.find(customer_id=customer_id, order_id=order_id)
        if order is None:
            raise RefundRefused(RefundRefused.NOT_FOUND)
        if order.currency != currency:
            raise RefundRefused(RefundRefused.CURRENCY_MISMATCH, order)
        if amount_cents > order.refundable_cents:
            raise RefundRefused(RefundRefused.EXCEEDS_REFUNDABLE, order)
        refunded = order.refunded_cents + amount_cents
        self.orders[order_id] = OrderView(
            order.order_id, order.customer_id, order.total_cents, order.currency, refunded
        )
        receipt = RefundReceipt(
            refund_id=f"RF-{len(self.receipts) + 1}",
            order_id=order_id,
            amount_cents=amount_cents,
            currency=currency,
            refunded_cents=refunded,
            total_cents=order.total_cents,
        )
        self.receipts[key] = receipt
        return receipt
