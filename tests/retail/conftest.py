"""The retail desk on the database: τ²-bench's data loaded in the test's transaction, an agent
whose policy lets every retail tool run without a human, and a host that calls through the API."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from django.test import Client

from dispatch.models import Agent
from dispatch.pipeline.policy import CurrencyLimits
from dispatch.services import agent_create
from retail.loader import read_db, retail_load
from retail.tools import RETAIL_TOOLS

# More than any order of the data moves: no call is held or over the maximum.
UNLIMITED = CurrencyLimits(max_amount_cents=10**10, auto_approve_below_cents=10**10)
WRITES = (
    "cancel_pending_order",
    "modify_pending_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "modify_user_address",
    "transfer_to_human_agents",
)


@pytest.fixture(scope="session")
def retail_data() -> dict[str, Any]:
    """τ²-bench's retail database as the installed package ships it."""
    return read_db()


@pytest.fixture
def retail_db(db: None, retail_data: dict[str, Any]) -> dict[str, Any]:
    """The retail tables loaded with the data, in this test's transaction."""
    retail_load(retail_data)
    return retail_data


@pytest.fixture
def retail_agent(db: None) -> tuple[Agent, str]:
    """An agent that may call every retail tool, none of them held for a human."""
    return agent_create(
        name="retail-desk",
        allowed_tools=RETAIL_TOOLS,
        currencies={"USD": UNLIMITED},
        humans=dict.fromkeys(WRITES, "never"),
        step_budget=200,
        repeat_limit=10,
    )


RetailCall = Callable[..., dict[str, Any]]


@pytest.fixture
def retail_call(client: Client, retail_agent: tuple[Agent, str]) -> RetailCall:
    """POST /api/v1/calls as the agent's host, for the customer it authenticated."""
    token = retail_agent[1]

    def call(
        tool: str, arguments: Mapping[str, Any], *, customer: str, session: str = "s-1"
    ) -> dict[str, Any]:
        envelope = {
            "session_id": session,
            "customer_id": customer,
            "tool": tool,
            "arguments": arguments,
        }
        response = client.post(
            "/api/v1/calls",
            data=json.dumps(envelope),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Token {token}",
        )
        assert response.status_code in (200, 409, 422), response.content
        body: dict[str, Any] = response.json()
        return body

    return call
