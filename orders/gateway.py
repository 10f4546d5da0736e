"""The refund gateway on the database: the OrderBook the service runs on.

It behaves like `orders.book.InMemoryOrderBook`, under any number of processes: a key refunds at
most once, a repeated key returns the first receipt, and the ledger always adds up to the order's
refunded_cents, which never passes its total.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from dispatch.pipeline.tools import LookupSource, OutcomeUnknownError, TransientError
from orders.book import OrderView, RefundReceipt, RefundRefused
from orders.models import Refund, RefundApproval
from orders.services import GatewayFaultKind, gateway_fault_consume

_FIND_SQL = """
    SELECT order_id, customer_id, total_cents, currency, refunded_cents, created_at AS placed_at
    FROM orders_order
    WHERE order_id = %(order_id)s AND customer_id = %(customer_id)s
"""


def _order_of(row: Mapping[str, Any]) -> OrderView:
    return OrderView(
        order_id=row["order_id"],
        customer_id=row["customer_id"],
        total_cents=row["total_cents"],
        currency=row["currency"],
        refunded_cents=row["refunded_cents"],
        placed_at=_moment(row.get("placed_at")),
    )


def _moment(value: Any) -> datetime | None:
    # PostgreSQL returns aware datetimes; SQLite naive ones in UTC, or text.
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# How a store reads the order tools' lookup (orders.book.order_lookup) with a call's opening.
ORDER_LOOKUP_SOURCE = LookupSource(sql=_FIND_SQL, to_value=_order_of)

# Check and write in one statement: the row lock makes concurrent refunds of the same order queue
# here, and each re-evaluates the condition on the latest row and returns exactly its own result.
_TAKE_SQL = """
    UPDATE orders_order SET refunded_cents = refunded_cents + %(amount_cents)s
    WHERE order_id = %(order_id)s AND customer_id = %(customer_id)s AND currency = %(currency)s
        AND refunded_cents <= total_cents - %(amount_cents)s
    RETURNING id AS order_pk, refunded_cents, total_cents
"""

# A key that already has its ledger row (a repeat, or a twin that committed while this one waited
# on the order's lock) inserts nothing, and the refund gives back what it took.
_ENTER_SQL = """
    INSERT INTO orders_refund (order_id, idempotency_key, amount_cents, currency, reason,
        approval, approved_by, refunded_cents_after, created_at)
    VALUES (%(order_pk)s, %(key)s, %(amount_cents)s, %(currency)s, %(reason)s, %(approval)s,
        %(approved_by)s, %(refunded_cents)s, %(now)s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id AS refund_pk
"""

# On PostgreSQL both in one statement: the ledger row is inserted only if the order had room, and
# the answer says which of the two happened.
_TAKE_AND_ENTER_SQL = f"""
    WITH taken AS ({_TAKE_SQL}),
    entered AS (
        INSERT INTO orders_refund (order_id, idempotency_key, amount_cents, currency, reason,
            approval, approved_by, refunded_cents_after, created_at)
        SELECT taken.order_pk, %(key)s, %(amount_cents)s, %(currency)s, %(reason)s,
            %(approval)s, %(approved_by)s, taken.refunded_cents, %(now)s
        FROM taken
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING id AS refund_pk
    )
    SELECT taken.*, entered.refund_pk FROM taken LEFT JOIN entered ON true
"""

_GIVE_BACK_SQL = """
    UPDATE orders_order SET refunded_cents = refunded_cents - %(amount_cents)s
    WHERE id = %(order_pk)s
"""


def _fetch_row(cursor: Any) -> dict[str, Any] | None:
    row = cursor.fetchone()
    if row is None:
        return None
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


def _faults_on() -> bool:
    # Production switches fault injection off altogether.
    return bool(settings.TOOLGATE_GATEWAY_FAULTS)


def _fault(kind: GatewayFaultKind) -> bool:
    return _faults_on() and gateway_fault_consume(kind=kind)


class OrmOrderBook:
    def find(self, *, customer_id: str, order_id: str) -> OrderView | None:
        with connection.cursor() as cursor:
            cursor.execute(_FIND_SQL, {"order_id": order_id, "customer_id": customer_id})
            row = _fetch_row(cursor)
        return None if row is None else _order_of(row)

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
        # With faults on, a repeated key is answered before any fault is consumed; without, the
        # refund itself finds a repeated key.
        receipt = self.receipt_for_key(key) if _faults_on() else None
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
        approved_by: tuple[str, ...],
    ) -> RefundReceipt:
        params: dict[str, Any] = {
            "customer_id": customer_id,
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": currency,
            "reason": reason,
            "key": key,
            "approval": RefundApproval.REVIEWER if approved_by else RefundApproval.POLICY,
            "approved_by": ", ".join(approved_by),
            "now": connection.ops.adapt_datetimefield_value(datetime.now(UTC)),
        }
        # Its own transaction when called on its own; inside a call's, no savepoint: nothing in
        # it raises but a database error, which fails the whole call anyway.
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(_TAKE_AND_ENTER_SQL, params)
                taken = _fetch_row(cursor)
                refund_pk = None if taken is None else taken["refund_pk"]
            else:
                cursor.execute(_TAKE_SQL, params)
                taken = _fetch_row(cursor)
                refund_pk = None
                if taken is not None:
                    cursor.execute(_ENTER_SQL, {**params, **taken})
                    entered = _fetch_row(cursor)
                    refund_pk = None if entered is None else entered["refund_pk"]
            if taken is not None and refund_pk is None:
                cursor.execute(_GIVE_BACK_SQL, {**params, **taken})
        if taken is not None and refund_pk is not None:
            return RefundReceipt(
                refund_id=f"RF-{refund_pk}",
                order_id=order_id,
                amount_cents=amount_cents,
                currency=currency,
                refunded_cents=taken["refunded_cents"],
                total_cents=taken["total_cents"],
            )
        # A repeated key keeps its first answer, whatever the order allows now.
        first = self.receipt_for_key(key)
        if first is not None:
            return first
        if taken is not None:  # pragma: no cover - the conflict was on a committed ledger row
            raise RuntimeError(f"refund key {key!r} conflicted but has no ledger row")
        raise self._refusal(customer_id=customer_id, order_id=order_id, currency=currency)

    def _refusal(self, *, customer_id: str, order_id: str, currency: str) -> RefundRefused:
        # Read now, after the refused update: why it was refused is the order's state since.
        order = self.find(customer_id=customer_id, order_id=order_id)
        if order is None:
            return RefundRefused(RefundRefused.NOT_FOUND)
        if order.currency != currency:
            return RefundRefused(RefundRefused.CURRENCY_MISMATCH, order)
        return RefundRefused(RefundRefused.EXCEEDS_REFUNDABLE, order)

    def receipt_for_key(self, key: str) -> RefundReceipt | None:
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
