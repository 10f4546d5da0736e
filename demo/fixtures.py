"""The demo's fixed data: what `seed_demo` creates and what `simulate_agents` uses by default.

Everything here is public on purpose: the demo token and password protect nothing but a local
database seeded for trying Toolgate out, and `seed_demo` refuses to run without DEBUG.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEMO_AGENT_NAME = "demo-agent"
DEMO_TOKEN = "tg_demo_local_only_0123456789abcdef"
DEMO_PASSWORD = "toolgate-demo"
DEMO_BASE_URL = "http://127.0.0.1:8000"
# refund_order_v2 beside refund_order: hosts move to the new version at their own pace.
DEMO_TOOLS = ("get_order", "refund_order", "refund_order_v2", "get_confirmation_status")
# The retail desk's agent (docs/retail.md), beside the refund agent: every retail tool.
RETAIL_AGENT_NAME = "retail-agent"
RETAIL_TOKEN = "tg_retail_demo_local_only_0123456789"
# A customer of the retail data with a pending order of $182.03, paid with PayPal: a cancellation
# the demo policy holds for a human (from $50).
RETAIL_CUSTOMER = "fatima_anderson_2157"
RETAIL_ORDER = "#W2974929"


def demo_token() -> str:
    return os.environ.get("TOOLGATE_DEMO_TOKEN") or DEMO_TOKEN


@dataclass(frozen=True, slots=True)
class DemoOrder:
    order_id: str
    customer_id: str
    total_cents: int
    currency: str


DEMO_ORDERS = (
    DemoOrder("ORD-1001", "CUS-1", 12_000, "BRL"),
    DemoOrder("ORD-1002", "CUS-2", 4_500, "USD"),
    DemoOrder("ORD-1003", "CUS-1", 45_000, "BRL"),
    DemoOrder("ORD-1004", "CUS-2", 19_990, "USD"),
    DemoOrder("ORD-1005", "CUS-3", 7_500, "EUR"),
    DemoOrder("ORD-1006", "CUS-3", 120_000, "EUR"),
    DemoOrder("ORD-1007", "CUS-4", 3_200, "USD"),
    DemoOrder("ORD-1008", "CUS-4", 64_000, "BRL"),
)


@dataclass(frozen=True, slots=True)
class DemoUser:
    username: str
    group: str | None
    superuser: bool
    # What members of the group may see in the admin.
    group_permissions: tuple[str, ...] = ()
    # The page to open after logging in, and what the user does there.
    start: str = "/"
    role: str = ""
    # A reviewer's approval limit, the same in every currency; None for no limit.
    limit_cents: int | None = None


DEMO_USERS = (
    DemoUser("admin", None, True, start="/admin/", role="agents, policies, users"),
    DemoUser(
        "reviewer",
        "reviewers",
        False,
        ("dispatch.view_confirmation",),
        start="/approvals/",
        role="decides held refunds, no approval limit",
    ),
    DemoUser(
        "reviewer2",
        "reviewers",
        False,
        ("dispatch.view_confirmation",),
        start="/approvals/",
        role="decides held refunds up to 200.00 in each currency",
        limit_cents=20_000,
    ),
    DemoUser(
        "manager",
        "managers",
        False,
        (
            "dispatch.view_confirmation",
            "dispatch.view_agent",
            "dispatch.view_policy",
            "dispatch.view_session",
            "dispatch.view_auditrecord",
            "dispatch.view_securityevent",
            "orders.view_order",
            "orders.view_refund",
        ),
        start="/analytics/",
        role="where calls fail and whether models recover; calls, confirmations, orders",
    ),
    DemoUser(
        "manager2",
        "managers",
        False,
        ("dispatch.view_agent", "dispatch.view_policy"),
        start="/analytics/",
        role="a second manager: approves the policy changes the other drafts",
    ),
)
