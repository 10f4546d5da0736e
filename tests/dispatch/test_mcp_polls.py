"""A client without tasks learns a held call's outcome over MCP by polling get_confirmation_status:
past the repeat limit and the step budget while the call waits, then the outcome once a reviewer
decided. The SDK's own client over stdio (PostgreSQL) and streamable HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from mcp import Client

from approvals.services import confirmation_approve
from dispatch.models import AuditRecord, Session
from tests.conftest import Ledger, MakeAgent
from tests.dispatch.test_mcp import (
    REFUND,
    TOOLS,
    Connect,
    agent_of,
    connect,
    drive,
    mcp_url,
)
from tests.dispatch.test_status_polls import reviewer

# The fixtures the tests use, imported from the modules that define them.
__all__ = ["connect", "mcp_url", "reviewer"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

STATUS = "get_confirmation_status"


def test_polling_past_both_limits_while_held_then_the_outcome(
    connect: Connect, make_agent: MakeAgent, reviewer: User, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS, step_budget=4, repeat_limit=3)[1]
    conversation = "conversation-polls"

    async def hold_then_poll(client: Client) -> tuple[Any, list[Any]]:
        held = await client.call_tool("refund_order", {**REFUND, "amount_cents": 9000})
        confirmation_id = held.structured_content["data"]["confirmation_id"]
        polls = [
            await client.call_tool(STATUS, {"confirmation_id": confirmation_id}) for _ in range(10)
        ]
        return held, polls

    async def poll(client: Client) -> Any:
        return await client.call_tool(STATUS, {"confirmation_id": confirmation_id})

    held, polls = drive(connect, hold_then_poll, token, session=conversation)
    confirmation_id = held.structured_content["data"]["confirmation_id"]
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    outcome = drive(connect, poll, token, session=conversation)

    assert "get_confirmation_status" in held.content[0].text
    assert [(p.is_error, p.structured_content["data"]["status"]) for p in polls] == [
        (False, "pending")
    ] * 10
    assert outcome.is_error is False
    data = outcome.structured_content["data"]
    assert (data["status"], data["final"], data["result"]["code"]) == ("executed", True, "OK")
    assert AuditRecord.objects.filter(agent=agent_of(token), tool=STATUS).count() == 11
    assert Session.objects.get(session_id=conversation).steps == 2
    assert ledger.state() == (1, 9000)
