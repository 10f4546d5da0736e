"""Sessions that follow conversations over MCP: a host that serves many conversations on one
connection names each call's conversation (and customer) in the call's `_meta`, so that a retry
is replayed and a new conversation gets a fresh step budget; over stdio a host that names none
gets a session for each call (nothing shared, nothing replayed across calls). The SDK's own
client over stdio (PostgreSQL) and streamable HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client

from dispatch import mcp
from dispatch.models import AuditRecord, SecurityEvent, Session
from tests.conftest import Ledger, MakeAgent
from tests.dispatch.test_mcp import (
    REFUND,
    TOOLS,
    Connect,
    agent_of,
    connect,
    drive,
    mcp_url,
    over_stdio,
    server_database_url,
)

# The fixtures the tests use, imported from the modules that define them.
__all__ = ["connect", "mcp_url"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

ORDER = {"order_id": "ORD-1001"}


def named(conversation: Any = None, customer: Any = None) -> Any:
    """A tools/call's `_meta` as a host writes it (never the model)."""
    meta = {mcp.CONVERSATION_META: conversation, mcp.CUSTOMER_META: customer}
    return {key: value for key, value in meta.items() if value is not None}


def test_one_connection_serves_conversations_each_with_its_budget_and_replays(
    connect: Connect, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS, step_budget=2)[1]

    async def two_conversations(client: Client) -> list[Any]:
        return [
            await client.call_tool("refund_order", REFUND, meta=named("conv-a")),
            await client.call_tool("refund_order", REFUND, meta=named("conv-a")),
            await client.call_tool("get_order", ORDER, meta=named("conv-a")),
            await client.call_tool("get_order", ORDER, meta=named("conv-b")),
        ]

    refund, retry, spent, fresh = drive(connect, two_conversations, token)

    assert (refund.structured_content["code"], retry.structured_content["replayed"]) == (
        "OK",
        True,
    )
    assert spent.structured_content["code"] == "STEP_LIMIT"
    assert fresh.structured_content["code"] == "OK"
    sessions = Session.objects.filter(agent=agent_of(token)).order_by("session_id")
    assert [(s.session_id, s.steps) for s in sessions] == [("conv-a", 3), ("conv-b", 1)]
    assert ledger.state() == (1, 1000)


def test_a_call_names_its_customer_and_its_conversation_stays_bound_to_it(
    connect: Connect, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]

    async def calls(client: Client) -> list[Any]:
        return [
            await client.call_tool(
                "get_order", {"order_id": "ORD-1002"}, meta=named("conv-c2", "CUS-2")
            ),
            await client.call_tool("get_order", {"order_id": "ORD-1002"}, meta=named("conv-x")),
            await client.call_tool("get_order", ORDER, meta=named("conv-c2", "CUS-1")),
        ]

    theirs, unnamed_customer, other_customer = drive(connect, calls, token, customer=None)

    assert theirs.structured_content["code"] == "OK"
    assert theirs.structured_content["data"]["order_id"] == "ORD-1002"
    assert unnamed_customer.structured_content["code"] == "customer_missing"
    assert other_customer.structured_content["code"] == "session_conflict"
    session = Session.objects.get(agent=agent_of(token), session_id="conv-c2")
    assert (session.customer_id, session.steps) == ("CUS-2", 1)
    assert ledger.state() == (0, 0)


def test_a_conversation_or_customer_that_is_not_an_id_is_refused(
    connect: Connect, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]

    async def calls(client: Client) -> list[Any]:
        return [
            await client.call_tool("refund_order", REFUND, meta=named({"id": "conv-1"})),
            await client.call_tool("refund_order", REFUND, meta=named("conv 1")),
            await client.call_tool("refund_order", REFUND, meta=named("conv-1", 7)),
        ]

    results = drive(connect, calls, token)

    assert [r.structured_content["code"] for r in results] == [
        "session_invalid",
        "session_invalid",
        "customer_invalid",
    ]
    assert all(r.is_error for r in results)
    assert not AuditRecord.objects.filter(agent=agent_of(token)).exists()
    assert SecurityEvent.objects.filter(reason="session_invalid").count() == 2
    assert ledger.state() == (0, 0)


def test_over_stdio_a_host_that_names_nothing_shares_nothing_between_calls(
    make_agent: MakeAgent, ledger: Ledger
) -> None:
    server_database_url()
    token = make_agent(allowed_tools=TOOLS, step_budget=2)[1]

    async def one_server_many_calls(client: Client) -> list[Any]:
        reads = [await client.call_tool("get_order", ORDER) for _ in range(3)]
        refunds = [await client.call_tool("refund_order", REFUND) for _ in range(2)]
        return [*reads, *refunds]

    *reads, refund, again = drive(over_stdio, one_server_many_calls, token)

    # As one Claude Desktop server for all its conversations: no call is over a budget that
    # others spent, and the same refund again is a new call, held as a possible duplicate.
    assert [r.structured_content["code"] for r in reads] == ["OK"] * 3
    assert refund.structured_content["code"] == "OK"
    assert again.structured_content["code"] == "CONFIRMATION_REQUIRED"
    assert again.structured_content["replayed"] is False
    sessions = Session.objects.filter(agent=agent_of(token))
    assert sessions.count() == 5 and {s.steps for s in sessions} == {1}
    assert ledger.state() == (1, 1000)
