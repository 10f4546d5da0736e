"""get_confirmation_status, dispatch's own tool: declared and called like any other, over the API
too, and scoped to the agent and customer that made the held call."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch.models import AuditRecord
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

TOOLS = ["get_order", "refund_order", "get_confirmation_status"]


def held_refund(api: AgentClient, customer: str = "CUS-1") -> str:
    result = api.refund(9000, customer=customer)
    assert result["code"] == "CONFIRMATION_REQUIRED", result
    confirmation_id: str = result["data"]["confirmation_id"]
    return confirmation_id


def status(api: AgentClient, confirmation_id: str, **envelope: Any) -> dict[str, Any]:
    return api.call("get_confirmation_status", {"confirmation_id": confirmation_id}, **envelope)


def test_the_agent_reads_the_status_of_its_own_held_call(
    make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    api = client_for(make_agent(allowed_tools=TOOLS)[1])
    confirmation_id = held_refund(api)

    result = status(api, confirmation_id)

    assert result["ok"] is True
    assert result["data"]["confirmation_id"] == confirmation_id
    assert result["data"]["status"] == "pending"
    assert result["data"]["result"] is None
    assert AuditRecord.objects.filter(tool="get_confirmation_status", channel="api").count() == 1
    calls = api.get("/api/v1/sessions/s-1/calls").json()["results"]
    assert [(c["tool"], c["channel"]) for c in calls] == [
        ("refund_order", "api"),
        ("get_confirmation_status", "api"),
    ]
    assert ledger.state() == (0, 0)


def test_another_agents_or_customers_confirmation_is_answered_like_a_missing_one(
    make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    owner = client_for(make_agent(allowed_tools=TOOLS)[1])
    other = client_for(make_agent(allowed_tools=TOOLS)[1])
    confirmation_id = held_refund(owner)

    by_other_agent = status(other, confirmation_id)
    for_other_customer = status(owner, confirmation_id, session="s-2", customer="CUS-2")
    missing = status(owner, "0" * 32)

    for result in (by_other_agent, for_other_customer, missing):
        assert result["ok"] is False
        assert result["code"] == "CONFIRMATION_NOT_FOUND"
    assert by_other_agent["message"] == missing["message"].replace("0" * 32, confirmation_id)
    assert ledger.state() == (0, 0)


def test_the_confirmation_id_must_be_32_hexadecimal_digits(
    make_agent: MakeAgent, client_for: ClientFor
) -> None:
    api = client_for(make_agent(allowed_tools=TOOLS)[1])

    result = status(api, "ORD-1001")

    assert result["code"] == "INVALID_ARGUMENTS"
    assert result["message"].startswith("confirmation_id:")


def test_an_agent_without_it_on_its_allowlist_cannot_call_it(
    make_agent: MakeAgent, client_for: ClientFor
) -> None:
    api = client_for(make_agent()[1])
    confirmation_id = held_refund(api)

    result = status(api, confirmation_id)

    assert result["code"] == "TOOL_NOT_ALLOWED"
