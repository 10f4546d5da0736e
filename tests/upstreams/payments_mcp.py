"""The payments tools again, declared over an MCP server reached by streamable HTTP
(tests/upstreams/payments_mcp_server.py): the same argument models, checks and answers as the
HTTP upstream's (tests/upstreams/payments.py), its calls made through upstreams.mcp."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from dispatch.pipeline.tools import ToolSpec
from tests.upstreams.payments import (
    CURRENCIES,
    Payment,
    RefundMade,
    RefundPaymentArguments,
    Refunds,
    payment_tools,
)
from upstreams.http import UpstreamRefusal
from upstreams.mcp import McpHttpUpstream, McpUpstream

__all__ = ["CURRENCIES", "UPSTREAM", "payments_mcp_upstream", "tools"]

KEY_META = "payments.example/idempotency-key"
SCHEMAS = Path(__file__).with_name("payments_mcp_schemas.json")


def payments_mcp_upstream(*, key: Literal["none", "meta", "argument"]) -> McpHttpUpstream:
    return McpHttpUpstream(
        name="payments_mcp",
        url_env="TOOLGATE_UPSTREAM_PAYMENTS_MCP_URL",
        token_env="TOOLGATE_UPSTREAM_PAYMENTS_MCP_TOKEN",
        tools=("get_payment", "create_refund", "list_refunds"),
        headers=(("X-Toolgate-Client", "payments-desk"),),
        idempotency_meta=KEY_META if key == "meta" else None,
        idempotency_argument="idempotency_key" if key == "argument" else None,
        timeout_seconds=float(os.environ.get("TOOLGATE_UPSTREAM_PAYMENTS_TIMEOUT", "2")),
        input_schemas=SCHEMAS,
    )


UPSTREAM = payments_mcp_upstream(key="meta")


def tools(upstream: McpUpstream) -> tuple[ToolSpec[Any], ...]:
    def read_payment(payment_id: str) -> Payment | None:
        try:
            # No customer is injected: the check compares the payment's own.
            return upstream.call("get_payment", Payment, {"payment_id": payment_id}, customer_id="")
        except UpstreamRefusal:
            return None  # "no such payment"

    def create_refund(arguments: RefundPaymentArguments, key: str) -> RefundMade:
        return upstream.call(
            "create_refund",
            RefundMade,
            {
                "payment_id": arguments.payment_id,
                "amount_cents": arguments.amount_cents,
                "currency": arguments.currency,
                "reason": arguments.reason,
                "client_reference": key,
            },
            customer_id="",
            key=key,
        )

    def refunds_under(key: str) -> Refunds:
        return upstream.call("list_refunds", Refunds, {"client_reference": key}, customer_id="")

    return payment_tools(read_payment, create_refund, refunds_under)
