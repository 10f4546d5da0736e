"""Tool versions through real HTTP: refund_order_v2 beside refund_order, each listed, called and
audited under its own name; a retired version unlisted, refused as TOOL_RETIRED naming its
successor, its held calls still decided by reviewers; start-up refuses versions that do not
hold together."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from pytest_django.fixtures import DjangoCaptureOnCommitCallbacks

from approvals.deciding import confirmation_approve
from dispatch.apps import tools_retire_and_check
from dispatch.models import AuditRecord, Confirmation
from dispatch.pipeline import ToolRegistry
from dispatch.registry import tool_registry
from orders.book import InMemoryOrderBook
from orders.models import Refund
from orders.tools import RefundOrderV2Arguments, order_tools
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

BOTH = ["get_order", "refund_order", "refund_order_v2"]
V2_REFUND = {
    "order_id": "ORD-1001",
    "amount_cents": 1000,
    "currency": "BRL",
    "reason_code": "goodwill",
}


@pytest.fixture
def retired_v1() -> Iterator[None]:
    """refund_order retired, as TOOLGATE_RETIRED_TOOLS does at start-up."""
    tool_registry.set_retired("refund_order")
    try:
        yield
    finally:
        tool_registry.set_retired("refund_order", retired=False)


@pytest.fixture
def both(client_for: ClientFor, make_agent: MakeAgent) -> AgentClient:
    """An agent allowed both versions of the refund."""
    return client_for(make_agent(allowed_tools=BOTH)[1])


def listed(api: AgentClient, shape: str) -> list[str]:
    response = api.get("/api/v1/tools", format=shape)
    assert response.status_code == 200, response.text
    tools: list[dict[str, Any]] = response.json()["tools"]
    return [tool.get("name") or tool["function"]["name"] for tool in tools]


def test_both_versions_are_listed_each_with_its_own_contract(both: AgentClient) -> None:
    response = both.get("/api/v1/tools")
    tools = {tool["name"]: tool for tool in response.json()["tools"]}

    assert list(tools) == BOTH
    assert tools["refund_order_v2"]["replaces"] == "refund_order"
    assert tools["refund_order"]["replaces"] is None
    assert tools["refund_order_v2"]["input_schema"] == RefundOrderV2Arguments.model_json_schema()
    assert "reason_code" in tools["refund_order_v2"]["input_schema"]["required"]
    assert "reason" in tools["refund_order"]["input_schema"]["required"]


@pytest.mark.parametrize("shape", ["neutral", "openai", "responses", "anthropic"])
def test_a_retired_version_is_listed_in_no_format(
    both: AgentClient, retired_v1: None, shape: str
) -> None:
    assert listed(both, shape) == ["get_order", "refund_order_v2"]


def test_v2_refunds_once_and_records_its_reason_code(both: AgentClient, ledger: Ledger) -> None:
    result = both.call("refund_order_v2", V2_REFUND)

    assert (result["code"], result["tool"]) == ("OK", "refund_order_v2")
    assert ledger.state() == (1, 1000)
    assert Refund.objects.get().reason == "goodwill"
    again = both.call("refund_order_v2", V2_REFUND)
    assert again["replayed"] is True
    assert ledger.state() == (1, 1000)


def test_v2_refuses_v1s_reason_with_the_field_named(both: AgentClient, ledger: Ledger) -> None:
    v1_style = {key: value for key, value in V2_REFUND.items() if key != "reason_code"}

    result = both.call("refund_order_v2", {**v1_style, "reason": "customer_request"})

    assert result["code"] == "INVALID_ARGUMENTS"
    assert "reason_code" in result["message"]
    assert ledger.state() == (0, 0)


def test_v2_needs_its_own_allowlist_entry(api: AgentClient, ledger: Ledger) -> None:
    result = api.call("refund_order_v2", V2_REFUND)

    assert result["code"] == "TOOL_NOT_ALLOWED"
    assert ledger.state() == (0, 0)


def test_a_call_to_a_retired_version_is_refused_naming_its_successor(
    both: AgentClient, ledger: Ledger, retired_v1: None
) -> None:
    result = both.refund(1000)

    assert result["code"] == "TOOL_RETIRED"
    assert result["ok"] is False and result["retryable"] is False
    assert result["data"] == {"successor": "refund_order_v2", "successor_allowed": True}
    assert result["model_text"].startswith("ERROR TOOL_RETIRED refund_order: ")
    assert "call refund_order_v2 instead" in result["model_text"]
    assert ledger.state() == (0, 0)
    record = AuditRecord.objects.get(call_id=result["call_id"])
    assert (record.tool, record.code) == ("refund_order", "TOOL_RETIRED")
    # The model switches: the successor passes.
    assert both.call("refund_order_v2", V2_REFUND)["code"] == "OK"
    assert ledger.state() == (1, 1000)


def test_a_retired_version_without_its_successor_allowed_sends_to_a_human(
    api: AgentClient, ledger: Ledger, retired_v1: None
) -> None:
    result = api.refund(1000)

    assert result["code"] == "TOOL_RETIRED"
    assert result["data"] == {"successor": "refund_order_v2", "successor_allowed": False}
    assert "hand the conversation over to a human" in result["message"]
    assert ledger.state() == (0, 0)


def test_a_held_call_of_a_version_retired_since_is_still_decided_by_its_reviewer(
    both: AgentClient,
    ledger: Ledger,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    held = both.refund(9000)
    assert held["code"] == "CONFIRMATION_REQUIRED"
    reviewer = User.objects.create_user("ana", password="pw")
    tool_registry.set_retired("refund_order")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            confirmation_approve(confirmation_id=held["data"]["confirmation_id"], reviewer=reviewer)
    finally:
        tool_registry.set_retired("refund_order", retired=False)

    confirmation = Confirmation.objects.get(pk=held["data"]["confirmation_id"])
    assert (confirmation.tool, confirmation.status) == ("refund_order", "executed")
    assert ledger.state() == (1, 9000)
    assert Refund.objects.get().reason == "damaged"


# Start-up ----------------------------------------------------------------------------------------


def order_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for spec in order_tools(InMemoryOrderBook()):
        registry.register(spec)
    return registry


def test_start_up_retires_what_the_setting_names() -> None:
    registry = order_registry()

    tools_retire_and_check(["refund_order"], registry)

    assert [spec.name for spec in registry.listed()] == ["get_order", "refund_order_v2"]


def test_start_up_refuses_to_retire_a_tool_it_does_not_know() -> None:
    with pytest.raises(ImproperlyConfigured, match="cannot retire 'refund_ordr'"):
        tools_retire_and_check(["refund_ordr"], order_registry())


def test_start_up_refuses_a_version_of_an_unknown_tool() -> None:
    registry = ToolRegistry()
    for spec in order_tools(InMemoryOrderBook()):
        if spec.name != "refund_order":
            registry.register(spec)

    with pytest.raises(ImproperlyConfigured, match="replaces 'refund_order', which is not"):
        tools_retire_and_check([], registry)


def test_the_services_registry_holds_together() -> None:
    tool_registry.check_versions()
    assert tool_registry.successor_of("refund_order") == "refund_order_v2"
