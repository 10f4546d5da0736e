"""fastmcp's client (4.2, pyproject's dev extras) follows a held call by polling
get_confirmation_status, over streamable HTTP against a live server, with docs/mcp.md's
configuration.

fastmcp 4.2 asks for tasks only through the tasks extension of protocol 2026-07-28
(`io.modelcontextprotocol/tasks`), which its core does not ship: the client folds in the
extensions a companion package registers (fastmcp.client.extension_hooks), and none is
registered. So it gets plain answers, and polling is how it learns the outcome: free while the
call waits for a human (ToolSpec.watches), then the outcome, as the API gives it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from django.contrib.auth.models import User
from fastmcp.client.extension_hooks import build_internal_client_extensions

from approvals.services import confirmation_approve, confirmation_reject
from dispatch.models import Confirmation, Session
from tests.conftest import Ledger, MakeAgent
from tests.dispatch.test_mcp import REFUND, TOOLS, mcp_url
from tests.dispatch.test_mcp_clients import FastMCPClient, claude_code, with_fastmcp
from tests.dispatch.test_status_polls import reviewer

# The fixtures the tests use, imported from the modules that define them.
__all__ = ["mcp_url", "reviewer"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

STATUS = "get_confirmation_status"
HELD = {**REFUND, "amount_cents": 9000}
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CONVERSATION = "conversation-fastmcp-polls"


@pytest.fixture
def token(make_agent: MakeAgent) -> str:
    # A budget the polls would spend many times over, were they counted.
    return make_agent(allowed_tools=TOOLS, step_budget=4, repeat_limit=3)[1]


def meta(customer: str = "CUS-1") -> dict[str, str]:
    # One conversation a customer: a conversation stays bound to its first customer.
    conversation = CONVERSATION if customer == "CUS-1" else f"{CONVERSATION}-{customer}"
    return {"toolgate/conversation": conversation, "toolgate/customer": customer}


async def hold_then_poll(client: FastMCPClient) -> tuple[Any, list[Any]]:
    held = await client.call_tool("refund_order", HELD, raise_on_error=False, meta=meta())
    assert held.structured_content is not None
    confirmation_id = held.structured_content["data"]["confirmation_id"]
    polls = [
        await client.call_tool(
            STATUS, {"confirmation_id": confirmation_id}, raise_on_error=False, meta=meta()
        )
        for _ in range(8)
    ]
    return held, polls


def poll(confirmation_id: str, customer: str = "CUS-1") -> Any:
    async def steps(client: FastMCPClient) -> Any:
        return await client.call_tool(
            STATUS, {"confirmation_id": confirmation_id}, raise_on_error=False, meta=meta(customer)
        )

    return steps


def held_and_polled(url: str, token: str) -> tuple[str, Any, list[Any]]:
    held, polls = with_fastmcp(claude_code(url, token), hold_then_poll)
    return held.structured_content["data"]["confirmation_id"], held, polls


def test_fastmcp_asks_for_no_tasks_so_a_held_call_is_answered_plainly(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    async def hold(client: FastMCPClient) -> tuple[Any, Any]:
        held = await client.call_tool("refund_order", HELD, raise_on_error=False, meta=meta())
        return client.initialize_result, held

    initialized, held = with_fastmcp(claude_code(mcp_url, token), hold)

    # No tasks extension in fastmcp's client: none registered, no companion package installed.
    assert build_internal_client_extensions(None) == []
    assert importlib.util.find_spec("fastmcp_tasks") is None
    # Nor offered by the server; the held call's answer is today's, naming the way to follow it.
    assert TASKS_EXTENSION not in (initialized.capabilities.extensions or {})
    assert held.is_error is False
    assert held.structured_content["code"] == "CONFIRMATION_REQUIRED"
    assert STATUS in held.content[0].text
    assert ledger.state() == (0, 0)


def test_fastmcp_polls_a_held_call_to_its_executed_result_once_approved(
    mcp_url: str, token: str, reviewer: User, ledger: Ledger
) -> None:
    confirmation_id, _, polls = held_and_polled(mcp_url, token)

    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    outcome = with_fastmcp(claude_code(mcp_url, token), poll(confirmation_id))

    assert [(p.is_error, p.structured_content["data"]["status"]) for p in polls] == [
        (False, "pending")
    ] * 8
    data = outcome.structured_content["data"]
    assert (outcome.is_error, data["status"], data["final"]) == (False, "executed", True)
    # The result contract the API gives for the confirmation, as the task's result would be.
    assert data["result"] == Confirmation.objects.get(pk=confirmation_id).result
    assert (data["result"]["ok"], data["result"]["code"]) == (True, "OK")
    # The eight polls while it waited cost the conversation nothing.
    assert Session.objects.get(session_id=CONVERSATION).steps == 2
    assert ledger.state() == (1, 9000)


def test_fastmcp_polls_a_rejected_call_to_the_rejection_and_its_code(
    mcp_url: str, token: str, reviewer: User, ledger: Ledger
) -> None:
    confirmation_id, _, _ = held_and_polled(mcp_url, token)

    confirmation_reject(confirmation_id=confirmation_id, reviewer=reviewer, reason="not damaged")
    outcome = with_fastmcp(claude_code(mcp_url, token), poll(confirmation_id))

    data = outcome.structured_content["data"]
    assert (data["status"], data["final"]) == ("rejected", True)
    assert (data["decision_code"], data["decision_reason"]) == (
        "CONFIRMATION_REJECTED",
        "not damaged",
    )
    assert data["result"]["ok"] is False
    assert ledger.state() == (0, 0)


def test_fastmcp_cannot_read_another_customers_held_call(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    confirmation_id, _, _ = held_and_polled(mcp_url, token)

    other = with_fastmcp(
        claude_code(mcp_url, token, customer="CUS-2"), poll(confirmation_id, "CUS-2")
    )

    assert other.is_error is True
    assert other.structured_content["code"] == "CONFIRMATION_NOT_FOUND"
    assert "pending" not in str(other.structured_content)
    assert Confirmation.objects.get(pk=confirmation_id).status == "pending"
    assert ledger.state() == (0, 0)
