"""The refund gateway on the database: the OrderBook the service runs on.

It behaves like `orders.book.InMemoryOrderBook`, under any number of processes: a key refunds at
most once, a repeated key returns the first receipt, and the ledger always adds up to the order's
refunded_cents, which never passes its total.

A lookup and a refund are on the hot path of most calls, so they are raw SQL (the same on
PostgreSQL and SQLite): a lookup is one statement, a refund one on PostgreSQL (two on SQLite, which
has no data-modifying WITH), with no query compiled per call and no savepoint (benchmark (b) in
docs/benchmarks.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from dispatch import readahead
from dispatch.pipeline.tools import OutcomeUnknownError, TransientError
from orders.book import ORDER_SOURCE, OrderView, RefundReceipt, RefundRefused, order_lookup
from orders.models import Order, Refund
from orders.services import GatewayFaultKind, gateway_fault_consume

_ORDER = Order._meta.db_table
_REFUND = Refund._meta.db_table

_FIND_SQL = f"""
    SELECT order_id, customer_id, total_cents, currency, refunded_cents FROM {_ORDER}
    WHERE order_id = %s AND customer_id = %s
"""


def _order_of(row: Any) -> OrderView:
    return OrderView(*row)


# The order tools declare the order as their lookup: on PostgreSQL the store reads it with the
# call's opening, and find() takes it from there.
readahead.source_register(ORDER_SOURCE, sql=_FIND_SQL, to_value=_order_of)

# Check and write in one statement: the row lock makes concurrent refunds of the same order queue
# here, and each re-evaluates the condition on the latest row and returns exactly its own result.
_TAKE_SQL = f"""
    UPDATE {_ORDER} SET refunded_cents = refunded_cents + %s
    WHERE order_id = %s AND customer_id = %s AND currency = %s
        AND refunded_cents <= total_cents - %s
    RETURNING id, refunded_cents, total_cents
"""


def _ledger_sql(rows: str) -> str:
    """The ledger's insert, of the rows given (VALUES, or a SELECT in a WITH)."""
    return f"""
    INSERT INTO {_REFUND} (order_id, idempotency_key, amount_cents, currency, reason,
        approved_by, refunded_cents_after, created_at)
    {rows}
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
"""


# A key that already has its ledger row (a repeat, or a twin that committed while this one waited
# on the order's lock) inserts nothing, and the refund takes its update back.
_LEDGER_SQL = _ledger_sql("VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")

# On PostgreSQL both in one statement (a data-modifying WITH): the ledger row is inserted only if
# the order had room, and the answer says which of the two happened.
_ENTER_IF_TAKEN_SQL = _ledger_sql(
    "SELECT taken.id, %s, %s, %s, %s, %s, taken.refunded_cents, %s FROM taken"
)
_TAKE_AND_ENTER_SQL = f"""
    WITH taken AS ({_TAKE_SQL}), entered AS ({_ENTER_IF_TAKEN_SQL})
    SELECT taken.id, taken.refunded_cents, taken.total_cents, entered.id
    FROM taken LEFT JOIN entered ON true
"""

_GIVE_BACK_SQL = f"UPDATE {_ORDER} SET refunded_cents = refunded_cents - %s WHERE id = %s"


def _faults_on() -> bool:
    # Each fault check is a query on every refund, so production switches them off altogether.
    return bool(settings.TOOLGATE_GATEWAY_FAULTS)


def _fault(kind: GatewayFaultKind) -> bool:
    return _faults_on() and gateway_fault_consume(kind=kind)


class OrmOrderBook:
    def find(self, *, customer_id: str, order_id: str) -> OrderView | None:
        found, order = readahead.take(order_lookup(customer_id, order_id))
        if found:
            return order  # type: ignore[no-any-return]
        return self._read(customer_id=customer_id, order_id=order_id)

    def _read(self, *, customer_id: str, order_id: str) -> OrderView | None:
        with connection.cursor() as cursor:
            cursor.execute(_FIND_SQL, [order_id, customer_id])
            row = cursor.fetchone()
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
        approved_by: str,
    ) -> RefundReceipt:
        # With faults on, a repeated key is answered before any fault is consumed; without, the
        # refund itself finds a repeated key, which saves a query on every refund.
        receipt = self._receipt_for_key(key) if _faults_on() else None
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
        # One transaction when called on its own; inside a call's transaction, no savepoint (two
        # round trips saved): nothing in it raises but a database error, which fails the call.
        inserted = None
        take: list[Any] = [amount_cents, order_id, customer_id, currency, amount_cents]
        now = connection.ops.adapt_datetimefield_value(datetime.now(UTC))
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    _TAKE_AND_ENTER_SQL,
                    [*take, key, amount_cents, currency, reason, approved_by, now],
                )
                row = cursor.fetchone()
                taken = None if row is None else row[:3]
                inserted = None if row is None or row[3] is None else row[3:]
            else:
                cursor.execute(_TAKE_SQL, take)
                taken = cursor.fetchone()
                if taken is not None:
                    cursor.execute(
                        _LEDGER_SQL,
                        [taken[0], key, amount_cents, currency, reason, approved_by, taken[1], now],
                    )
                    inserted = cursor.fetchone()
            if taken is not None:
                pk, refunded_cents, total_cents = taken
                if inserted is None:
                    cursor.execute(_GIVE_BACK_SQL, [amount_cents, pk])
        if taken is not None and inserted is not None:
            return RefundReceipt(
                refund_id=f"RF-{inserted[0]}",
                order_id=order_id,
                amount_cents=amount_cents,
                currency=currency,
                refunded_cents=refunded_cents,
                total_cents=total_cents,
            )
        # A repeated key keeps its first answer, whatever the order allows now.
        first = self._receipt_for_key(key)
        if first is not None:
            return first
        if taken is not None:  # pragma: no cover - the conflict was on a committed ledger row
            raise RuntimeError(f"refund key {key!r} conflicted but has no ledger row")
        raise self._refusal(customer_id=customer_id, order_id=order_id, currency=currency)

    def _refusal(self, *, customer_id: str, order_id: str, currency: str) -> RefundRefused:
        # Read now, after the refused update: why it was refused is the order's state since.
        order = self._read(customer_id=customer_id, order_id=order_id)
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
