"""The order tools, declared once: arguments, business check, handler, flags, and what a
reviewer sees of a held refund.

The declarations take an OrderBook, so the very same tools run on the database in the service and
on an in-memory book in the core's tests and benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.state import Lookup
from dispatch.pipeline.tools import (
    CheckContext,
    Editable,
    EditRule,
    ExecutionContext,
    MoneyFromArguments,
    Refused,
    Rejection,
    Risk,
    ToolSpec,
)
from orders.book import OrderBook, OrderView, RefundReceipt, RefundRefused, order_lookup

CURRENCIES = ("BRL", "USD", "EUR", "JPY", "KWD")
REFUND_REASONS = ("damaged", "not_delivered", "customer_request")
# refund_order_v2's reasons: customer_request gone, a refund either owed or a gesture.
REFUND_REASON_CODES = ("damaged", "not_delivered", "wrong_item", "returned", "goodwill")
# At most 16 characters; no maxLength beside it, so that OpenAI's strict mode takes the schema.
ORDER_ID_PATTERN = r"^ORD-[0-9]{1,12}$"
MAX_REFUND_CENTS = 100_000_000

ORDER_NOT_FOUND = Code(
    "ORDER_NOT_FOUND",
    5,
    "No order with that id exists for this customer; ids must come from the user, not be guessed.",
    True,
    False,
)
CURRENCY_MISMATCH = Code(
    "CURRENCY_MISMATCH",
    5,
    "The currency differs from the order's; refunds are made in the order's own currency.",
    True,
    False,
)
AMOUNT_EXCEEDS_REFUNDABLE = Code(
    "AMOUNT_EXCEEDS_REFUNDABLE",
    5,
    "The amount is more than what is still refundable on the order.",
    True,
    False,
)

ORDER_ID_DESCRIPTION = "the order's id as the user gave it: ORD- and ASCII digits, such as ORD-1001"

REFUND_WORDS = ToolWords(noun="refund", plural="refunds", verb="refund", past="refunded")


class GetOrderArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="get_order")

    order_id: str = Field(pattern=ORDER_ID_PATTERN, description=ORDER_ID_DESCRIPTION)


class _RefundArguments(BaseModel):
    """What every version of refund_order sends: the order, and the amount in its currency."""

    model_config = ConfigDict(extra="forbid", strict=True)

    order_id: str = Field(pattern=ORDER_ID_PATTERN, description=ORDER_ID_DESCRIPTION)
    amount_cents: int = Field(
        ge=1,
        le=MAX_REFUND_CENTS,
        description="amount in minor units of the order's currency, as an integer: 25.90 is "
        "2590 (in JPY, which has no minor unit, ¥500 is sent as 500, and in KWD, which has "
        "three decimals, 1.250 KWD as 1250)",
    )
    currency: Literal["BRL", "USD", "EUR", "JPY", "KWD"] = Field(
        description="the order's own currency, one of BRL, USD, EUR, JPY, KWD (never converted)"
    )

    @property
    def recorded_reason(self) -> str:
        """The reason the refund's row records."""
        raise NotImplementedError


class RefundOrderArguments(_RefundArguments):
    model_config = ConfigDict(extra="forbid", strict=True, title="refund_order")

    reason: Literal["damaged", "not_delivered", "customer_request"] = Field(
        description="why the customer is refunded: damaged, not_delivered or customer_request"
    )

    @property
    def recorded_reason(self) -> str:
        return self.reason


class RefundOrderV2Arguments(_RefundArguments):
    """refund_order_v2's contract: v1's catch-all `customer_request` hid goodwill among owed
    refunds, so the reason is a code from a finer list in which every refund is either owed
    (damaged, not delivered, wrong item, returned) or a gesture (goodwill)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="refund_order_v2")

    reason_code: Literal["damaged", "not_delivered", "wrong_item", "returned", "goodwill"] = Field(
        description="why the customer is refunded: damaged, not_delivered, wrong_item, returned "
        "(the item came back) or goodwill (a gesture the customer is not owed)"
    )

    @property
    def recorded_reason(self) -> str:
        return self.reason_code


def order_as_data(order: OrderView) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "total_cents": order.total_cents,
        "currency": order.currency,
        "refunded_cents": order.refunded_cents,
        "refundable_cents": order.refundable_cents,
    }


def receipt_as_data(receipt: RefundReceipt) -> dict[str, Any]:
    return {
        "refund_id": receipt.refund_id,
        "order_id": receipt.order_id,
        "amount_cents": receipt.amount_cents,
        "currency": receipt.currency,
        "refunded_cents": receipt.refunded_cents,
        "refundable_cents": receipt.total_cents - receipt.refunded_cents,
    }


def order_review(order_id: str, order: OrderView | None) -> ReviewView:
    """The order as a reviewer glances at it before deciding a refund: what it came to, what went
    back already and what may still go."""
    if order is None:
        return ReviewView("Order", order_id, found=False)
    money = FactKind.MONEY
    placed = (
        ()
        if order.placed_at is None
        else (Fact("Ordered", order.placed_at.isoformat(), FactKind.DATE),)
    )
    return ReviewView(
        "Order",
        order.order_id,
        facts=(
            *placed,
            Fact("Order total", order.total_cents, money),
            Fact("Already refunded", order.refunded_cents, money),
            Fact("Still refundable", order.refundable_cents, money),
        ),
    )


def _not_found(order_id: str) -> Rejection:
    return Rejection(
        ORDER_NOT_FOUND,
        f"order_id: no order {order_id} exists for this customer "
        "(use only an id the user gave you; ask them to check it)",
    )


def _refused(exc: RefundRefused, arguments: _RefundArguments) -> Rejection:
    order = exc.order
    if exc.reason == RefundRefused.CURRENCY_MISMATCH and order is not None:
        return Rejection(
            CURRENCY_MISMATCH,
            f"currency: order {order.order_id} is in {order.currency}, not {arguments.currency} "
            f"(send the amount in {order.currency} minor units; never convert it yourself)",
            {"order_currency": order.currency},
        )
    if exc.reason == RefundRefused.EXCEEDS_REFUNDABLE and order is not None:
        return Rejection(
            AMOUNT_EXCEEDS_REFUNDABLE,
            f"amount_cents: {arguments.amount_cents} is more than the {order.refundable_cents} "
            f"still refundable on order {order.order_id} (total {order.total_cents}, already "
            f"refunded {order.refunded_cents})",
            {"refundable_cents": order.refundable_cents},
        )
    return _not_found(arguments.order_id)


def _the_order(arguments: GetOrderArguments | _RefundArguments, customer_id: str) -> Lookup:
    # What the tools read first: get_order's handler, the refunds' check.
    return order_lookup(customer_id, arguments.order_id)


def order_tools(book: OrderBook) -> tuple[ToolSpec[Any], ...]:
    def the_order(
        arguments: GetOrderArguments | _RefundArguments,
        context: CheckContext | ExecutionContext,
    ) -> OrderView | None:
        if context.read_ahead is not None:
            # The store read the order (the tools' lookup) as the call opened.
            return cast(OrderView | None, context.read_ahead.value)
        return book.find(customer_id=context.customer_id, order_id=arguments.order_id)

    def get_order(arguments: GetOrderArguments, context: ExecutionContext) -> Mapping[str, Any]:
        order = the_order(arguments, context)
        if order is None:
            raise Refused(_not_found(arguments.order_id))
        return order_as_data(order)

    def check_refund(arguments: _RefundArguments, context: CheckContext) -> Rejection | None:
        order = the_order(arguments, context)
        if order is None:
            return _not_found(arguments.order_id)
        if order.currency != arguments.currency:
            return _refused(RefundRefused(RefundRefused.CURRENCY_MISMATCH, order), arguments)
        if arguments.amount_cents > order.refundable_cents:
            return _refused(RefundRefused(RefundRefused.EXCEEDS_REFUNDABLE, order), arguments)
        return None

    def refund_review(arguments: _RefundArguments, customer_id: str) -> ReviewView:
        order = book.find(customer_id=customer_id, order_id=arguments.order_id)
        return order_review(arguments.order_id, order)

    def refund_order(arguments: _RefundArguments, context: ExecutionContext) -> Mapping[str, Any]:
        try:
            receipt = book.refund(
                customer_id=context.customer_id,
                order_id=arguments.order_id,
                amount_cents=arguments.amount_cents,
                currency=arguments.currency,
                reason=arguments.recorded_reason,
                key=context.idempotency_key,
                approved_by=context.approved_by,
            )
        except RefundRefused as exc:
            # The live state changed between the check and the effect (a concurrent refund).
            raise Refused(_refused(exc, arguments)) from None
        return receipt_as_data(receipt)

    def refund_outcome(key: str) -> Mapping[str, Any] | None:
        receipt = book.receipt_for_key(key)
        return None if receipt is None else receipt_as_data(receipt)

    def refund_spec(
        *,
        name: str,
        label: str,
        arguments: type[_RefundArguments],
        description: str,
        replaces: str | None = None,
    ) -> ToolSpec[Any]:
        """A version of refund_order: each has its own contract, and the same rules and effect."""
        return ToolSpec(
            name=name,
            label=label,
            description=description,
            arguments=arguments,
            check=check_refund,
            handler=refund_order,
            writes=True,
            risk=Risk.HIGH,
            # Money that leaves cannot be taken back by another call; an identical call in the
            # same session is replayed, never refunded twice.
            destructive=True,
            idempotent=True,
            subject_field="order_id",
            money=MoneyFromArguments(amount="amount_cents", currency="currency"),
            codes=(ORDER_NOT_FOUND, CURRENCY_MISMATCH, AMOUNT_EXCEEDS_REFUNDABLE),
            lookup=_the_order,
            review=refund_review,
            words=REFUND_WORDS,
            outcome_of=refund_outcome,
            # A reviewer may approve less than was asked (60.00 of the 80.00), never more.
            editable=(Editable("amount_cents", EditRule.ONLY_LOWER),),
            replaces=replaces,
        )

    return (
        ToolSpec(
            name="get_order",
            label="Get order",
            description="Look up one of the customer's orders: total, currency and what is "
            "already refunded. Read-only.",
            arguments=GetOrderArguments,
            handler=get_order,
            idempotent=True,
            codes=(ORDER_NOT_FOUND,),
            lookup=_the_order,
        ),
        refund_spec(
            name="refund_order",
            label="Refund order",
            arguments=RefundOrderArguments,
            description="Refund part or all of one of the customer's orders, in the order's "
            "currency. Moves money; may be held for a human to approve.",
        ),
        refund_spec(
            name="refund_order_v2",
            label="Refund order (v2)",
            arguments=RefundOrderV2Arguments,
            description="Refund part or all of one of the customer's orders, in the order's "
            "currency, with a reason code that says whether the refund is owed or goodwill. "
            "Moves money; may be held for a human to approve.",
            replaces="refund_order",
        ),
    )
