"""Each version of a tool has its own analytics: the metrics API, the dashboard's versions side by
side, the tool filter's marks, and the what-if's outcomes by tool."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from dispatch.models import Agent
from dispatch.services import call_dispatch
from tests.analytics import test_apis
from tests.conftest import MakeAgent
from tests.dispatch.apis import test_versions

# test_apis' signed-in manager; the API tests' refund_order retired for one test.
manager = test_apis.manager
retired_v1 = test_versions.retired_v1

pytestmark = pytest.mark.usefixtures("orders")

V1 = {"order_id": "ORD-1001", "currency": "BRL", "reason": "damaged"}
V2 = {"order_id": "ORD-1001", "currency": "BRL", "reason_code": "returned"}


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    # From 50.00 a refund is held for a reviewer.
    return make_agent(
        allowed_tools=["get_order", "refund_order", "refund_order_v2"],
        auto_approve_below_cents=5_000,
    )[0]


def call(agent: Agent, tool: str, arguments: dict[str, Any], session: str = "s-1") -> str:
    result = call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool=tool,
        arguments=json.dumps(arguments),
    )
    return result.code


@pytest.fixture
def traffic(agent: Agent) -> Agent:
    """v1: one refund, one rejected for its schema (a float, not fixed). v2: one refund, two
    rejected sending v1's reason (one of them fixed next), then one held."""
    assert call(agent, "refund_order", {**V1, "amount_cents": 1000}) == "OK"
    assert call(agent, "refund_order", {**V1, "amount_cents": 10.5}) == "INVALID_ARGUMENTS"
    assert call(agent, "refund_order_v2", {**V2, "amount_cents": 1100}) == "OK"
    v1_reason = {**V1, "amount_cents": 700}
    assert call(agent, "refund_order_v2", v1_reason, session="s-2") == "INVALID_ARGUMENTS"
    assert call(agent, "refund_order_v2", v1_reason, session="s-3") == "INVALID_ARGUMENTS"
    assert call(agent, "refund_order_v2", {**V2, "amount_cents": 700}, session="s-3") == "OK"
    assert call(agent, "refund_order_v2", {**V2, "amount_cents": 6000}) == "CONFIRMATION_REQUIRED"
    return agent


def test_the_metrics_count_each_version_apart_and_say_where_it_stands(
    traffic: Agent, manager: Client
) -> None:
    body = manager.get("/api/v1/metrics").json()

    by_tool = body["calls"]["by_tool"]
    assert (by_tool["refund_order"]["calls"], by_tool["refund_order"]["rejected"]) == (2, 1)
    v2 = by_tool["refund_order_v2"]
    assert (v2["calls"], v2["rejected"], v2["correctable"], v2["recovered"]) == (5, 2, 2, 1)
    assert body["tool_versions"] == [
        {
            "tool": "refund_order",
            "replaces": None,
            "replaced_by": "refund_order_v2",
            "retired": False,
        },
        {
            "tool": "refund_order_v2",
            "replaces": "refund_order",
            "replaced_by": None,
            "retired": False,
        },
    ]


def test_the_metrics_say_a_version_is_retired(manager: Client, retired_v1: None) -> None:
    versions = manager.get("/api/v1/metrics").json()["tool_versions"]

    assert versions[0] == {
        "tool": "refund_order",
        "replaces": None,
        "replaced_by": "refund_order_v2",
        "retired": True,
    }


def versions_table(html: str) -> list[list[str]]:
    section = html.split('id="versions-title"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", section.split("<tbody>", 1)[1], re.S)
    return [
        [
            " ".join(re.sub(r"<[^>]+>", " ", cell).split())
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
        ]
        for row in rows
    ]


def test_the_dashboard_shows_the_versions_side_by_side(traffic: Agent, manager: Client) -> None:
    response = manager.get("/analytics/")

    assert response.status_code == 200
    rows = versions_table(response.content.decode())
    assert [row[:6] for row in rows] == [
        ["refund_order", "replaced by refund_order_v2", "2", "50.0 % 1 of 2", "0.0 % 0 of 1", "0"],
        ["refund_order_v2", "replaces refund_order", "5", "40.0 % 2 of 5", "50.0 % 1 of 2", "1"],
    ]


def test_a_retired_version_is_marked_and_its_calls_still_counted(
    traffic: Agent, manager: Client, retired_v1: None
) -> None:
    html = manager.get("/analytics/").content.decode()

    assert versions_table(html)[0][:3] == [
        "refund_order",
        "retired · replaced by refund_order_v2",
        "2",
    ]
    assert '<tr class="an-retired">' in html
    assert (
        '<option value="refund_order">refund_order (retired · replaced by refund_order_v2)</option>'
        in html
    )


def test_the_versions_lead_to_each_ones_own_calls(traffic: Agent, manager: Client) -> None:
    html = manager.get("/analytics/", {"range": "24h"}).content.decode()
    section = html.split('id="versions-title"', 1)[1].split("</section>", 1)[0]

    assert "tool=refund_order_v2" in section and "outcome=held" in section
    mine = manager.get("/analytics/", {"range": "24h", "tool": "refund_order_v2"})
    page = mine.content.decode()
    assert "tool <code>refund_order_v2</code> (replaces refund_order)" in page
    # One tool chosen: its own figures, no side-by-side table.
    assert 'id="versions-title"' not in page


def test_the_what_if_judges_each_version_apart(traffic: Agent, manager: Client) -> None:
    body = manager.get(
        "/api/v1/metrics/what-if", {"agent": str(traffic.pk), "BRL_auto_approve_below": "100.00"}
    ).json()

    v1 = {row["outcome"]: row for row in body["by_tool"]["refund_order"]}
    v2 = {row["outcome"]: row for row in body["by_tool"]["refund_order_v2"]}
    assert v1["auto_executed"]["actual"]["calls"] == v1["auto_executed"]["what_if"]["calls"] == 1
    assert (v2["auto_executed"]["actual"]["calls"], v2["auto_executed"]["what_if"]["calls"]) == (
        2,
        3,
    )
    assert (v2["one_reviewer"]["actual"]["calls"], v2["one_reviewer"]["what_if"]["calls"]) == (1, 0)
    page = manager.get(
        "/analytics/what-if/", {"agent": str(traffic.pk), "BRL_auto_approve_below": "100.00"}
    ).content.decode()
    assert 'id="tools-title"' in page
    assert (
        '<code>refund_order_v2</code> <small class="an-muted">replaces refund_order</small>' in page
    )
