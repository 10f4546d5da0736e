"""The payments upstream's declarations: what a new upstream needs besides its configuration.

The tools are declared as hosted tools are (orders/tools.py): strict arguments, risk, money,
the business check (here reading the payment through the upstream's GET), what a reviewer sees,
the write, and the read that finds a write's effect by its key (the client reference it stores).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    MoneyFromArguments,
    Refused,
    Rejection,
    Risk,
    ToolSpec,
)
from upstreams.http import HttpUpstream, Upstream
from upstreams.tools import answer_data

CURRENCIES = ("BRL", "USD", "EUR")
PAYMENT_ID = r"^PAY-[0-9]{1,12}$"


def payments_upstream(*, honours_idempotency_key: bool) -> HttpUpstream:
    return HttpUpstream(
        name="payments",
        openapi=Path(__file__).with_name("payments_openapi.json"),
        operations=("getPayment", "createRefund", "listRefunds"),
        url_env="TOOLGATE_UPSTREAM_PAYMENTS_URL",
        token_env="TOOLGATE_UPSTREAM_PAYMENTS_TOKEN",
        honours_idempotency_key=honours_idempotency_key,
        timeout_seconds=float(os.environ.get("TOOLGATE_UPSTREAM_PAYMENTS_TIMEOUT", "2")),
    )


UPSTREAM = payments_upstream(honours_idempotency_key=True)

PAYMENT_NOT_FOUND = Code(
    "PAYMENT_NOT_FOUND",
    5,
    "No payment with that id exists for this customer; ids must come from the user.",
    True,
    False,
)
PAYMENT_CURRENCY_MISMATCH = Code(
    "PAYMENT_CURRENCY_MISMATCH",
    5,
    "The currency differs from the payment's; refunds are made in the payment's own currency.",
    True,
    False,
)
PAYMENT_AMOUNT_EXCEEDS_REFUNDABLE = Code(
    "PAYMENT_AMOUNT_EXCEEDS_REFUNDABLE",
    5,
    "The amount is more than what is still refundable on the payment.",
    True,
    False,
)


class GetPaymentArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="get_payment")

    payment_id: str = Field(pattern=PAYMENT_ID, description="the payment's id, such as PAY-1")


class RefundPaymentArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="refund_payment")

    payment_id: str = Field(pattern=PAYMENT_ID, description="the payment's id, such as PAY-1")
    amount_cents: int = Field(
        ge=1, le=100_000_000, description="amount in minor units, as an integer: 25.90 is 2590"
    )
    currency: Literal["BRL", "USD", "EUR"] = Field(description="the payment's own currency")
    reason: Literal["damaged", "not_delivered", "customer_request"] = Field(
        description="why the customer is refunded"
    )


# The upstream's answers, as Toolgate reads them: anything else is a bad answer.
class Payment(BaseModel):
    model_config = ConfigDict(strict=True)

    payment_id: str
    customer_id: str
    amount_cents: int
    currency: str
    refunded_cents: int


class RefundMade(BaseModel):
    model_config = ConfigDict(strict=True)

    refund_id: str
    payment_id: str
    amount_cents: int
    currency: str
    client_reference: str
    refunded_cents: int


class Refunds(BaseModel):
    model_config = ConfigDict(strict=True)

    refunds: list[RefundMade]


def tools(upstream: Upstream) -> tuple[ToolSpec[Any], ...]:
    def read_payment(payment_id: str) -> Payment | None:
        return upstream.read("getPayment", Payment, path={"payment_id": payment_id}, missing=True)

    def create_refund(arguments: RefundPaymentArguments, key: str) -> RefundMade:
        return upstream.write(
            "createRefund",
            RefundMade,
            key=key,
            path={"payment_id": arguments.payment_id},
            body={
                "amount_cents": arguments.amount_cents,
                "currency": arguments.currency,
                "reason": arguments.reason,
                # What the outcome read finds the effect by.
                "client_reference": key,
            },
        )

    def refunds_under(key: str) -> Refunds:
        found = upstream.read("listRefunds", Refunds, query={"client_reference": key})
        assert found is not None
        return found

    return payment_tools(read_payment, create_refund, refunds_under)


def payment_tools(
    read_payment: Callable[[str], Payment | None],
    create_refund: Callable[[RefundPaymentArguments, str], RefundMade],
    refunds_under: Callable[[str], Refunds],
) -> tuple[ToolSpec[Any], ...]:
    """The payments tools, whichever way the upstream is reached: its payment by id (None if it
    has none), a refund made under a key (stored as its client reference), and the refunds made
    under a key."""

    def the_payment(payment_id: str, customer_id: str) -> Payment | None:
        payment = read_payment(payment_id)
        # Another customer's payment is answered like one that does not exist.
        return payment if payment is not None and payment.customer_id == customer_id else None

    def not_found(payment_id: str) -> Rejection:
        return Rejection(
            PAYMENT_NOT_FOUND,
            f"payment_id: no payment {payment_id} exists for this customer "
            "(use only an id the user gave you)",
        )

    def get_payment(arguments: GetPaymentArguments, context: ExecutionContext) -> Mapping[str, Any]:
        payment = the_payment(arguments.payment_id, context.customer_id)
        if payment is None:
            raise Refused(not_found(arguments.payment_id))
        return answer_data(payment)

    def check_refund(arguments: RefundPaymentArguments, context: CheckContext) -> Rejection | None:
        payment = the_payment(arguments.payment_id, context.customer_id)
        if payment is None:
            return not_found(arguments.payment_id)
        if payment.currency != arguments.currency:
            return Rejection(
                PAYMENT_CURRENCY_MISMATCH,
                f"currency: payment {payment.payment_id} is in {payment.currency}, not "
                f"{arguments.currency} (never convert it yourself)",
            )
        refundable = payment.amount_cents - payment.refunded_cents
        if arguments.amount_cents > refundable:
            return Rejection(
                PAYMENT_AMOUNT_EXCEEDS_REFUNDABLE,
                f"amount_cents: {arguments.amount_cents} is more than the {refundable} still "
                f"refundable on payment {payment.payment_id}",
                {"refundable_cents": refundable},
            )
        return None

    def refund_review(arguments: RefundPaymentArguments, customer_id: str) -> ReviewView:
        payment = the_payment(arguments.payment_id, customer_id)
        if payment is None:
            return ReviewView("Payment", arguments.payment_id, found=False)
        money = FactKind.MONEY
        return ReviewView(
            "Payment",
            payment.payment_id,
            facts=(
                Fact("Paid", payment.amount_cents, money),
                Fact("Already refunded", payment.refunded_cents, money),
                Fact("Still refundable", payment.amount_cents - payment.refunded_cents, money),
            ),
        )

    def refund_payment(
        arguments: RefundPaymentArguments, context: ExecutionContext
    ) -> Mapping[str, Any]:
        return answer_data(create_refund(arguments, context.idempotency_key))

    def refund_outcome(key: str) -> Mapping[str, Any] | None:
        found = refunds_under(key)
        return answer_data(found.refunds[0]) if found.refunds else None

    return (
        ToolSpec(
            name="get_payment",
            label="Get payment",
            description="Look up one of the customer's payments: amount, currency and what is "
            "already refunded. Read-only.",
            arguments=GetPaymentArguments,
            handler=get_payment,
            idempotent=True,
            codes=(PAYMENT_NOT_FOUND,),
        ),
        ToolSpec(
            name="refund_payment",
            label="Refund payment",
            description="Refund part or all of one of the customer's payments, in its currency. "
            "Moves money; may be held for a human to approve.",
            arguments=RefundPaymentArguments,
            check=check_refund,
            handler=refund_payment,
            writes=True,
            risk=Risk.HIGH,
            destructive=True,
            idempotent=True,
            subject_field="payment_id",
            money=MoneyFromArguments(amount="amount_cents", currency="currency"),
            codes=(PAYMENT_NOT_FOUND, PAYMENT_CURRENCY_MISMATCH, PAYMENT_AMOUNT_EXCEEDS_REFUNDABLE),
            review=refund_review,
            words=ToolWords(noun="refund", plural="refunds", verb="refund", past="refunded"),
            outcome_of=refund_outcome,
        ),
    )
