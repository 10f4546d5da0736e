"""The read endpoints of the agent API: tools, codes, a session's calls, a held call's state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from dispatch.formats import anthropic_strict_accepts, openai_strict_accepts
from dispatch.models import Agent, Confirmation
from dispatch.registry import tool_registry
from retail.book import RETAIL_CODES
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

pytestmark = pytest.mark.usefixtures("orders")


# GET /api/v1/tools ---------------------------------------------------------------------------


def tools(api: AgentClient, shape: str) -> list[dict[str, Any]]:
    response = api.get("/api/v1/tools", format=shape)
    assert response.status_code == 200, response.text
    assert response.json()["format"] == shape
    listed: list[dict[str, Any]] = response.json()["tools"]
    return listed


def test_the_neutral_format_lists_each_tool_with_its_flags(api: AgentClient) -> None:
    listed = {tool["name"]: tool for tool in tools(api, "neutral")}

    assert set(listed) == {"get_order", "refund_order"}
    refund = listed["refund_order"]
    assert refund["writes"] is True
    assert refund["risk"] == "high"
    assert refund["amount_field"] == "amount_cents"
    assert refund["codes"] == ["ORDER_NOT_FOUND", "CURRENCY_MISMATCH", "AMOUNT_EXCEEDS_REFUNDABLE"]
    assert listed["get_order"]["writes"] is False
    assert listed["get_order"]["risk"] == "low"


def test_neutral_is_the_default_format(api: AgentClient) -> None:
    response = api.get("/api/v1/tools")

    assert response.json()["format"] == "neutral"
    assert response.json()["tools"] == tools(api, "neutral")


def test_the_openai_format_is_a_list_of_function_tools(api: AgentClient) -> None:
    listed = tools(api, "openai")

    assert [tool["type"] for tool in listed] == ["function", "function"]
    for tool in listed:
        assert set(tool) == {"type", "function"}
        function = tool["function"]
        assert set(function) <= {"name", "description", "parameters", "strict"}
        assert function["parameters"]["type"] == "object"
        assert function["description"]
    by_name = {tool["function"]["name"]: tool["function"] for tool in listed}
    refund = tool_registry.get("refund_order")
    assert refund is not None
    assert by_name["refund_order"]["parameters"] == refund.json_schema()


def test_the_openai_format_says_strict_exactly_where_strict_mode_accepts_the_schema(
    make_agent: MakeAgent, client_for: ClientFor
) -> None:
    everything = ["get_order", "refund_order", "get_confirmation_status"]
    api = client_for(make_agent(allowed_tools=everything)[1])

    listed = {tool["function"]["name"]: tool["function"] for tool in tools(api, "openai")}

    assert sorted(listed) == sorted(everything)
    for function in listed.values():
        assert function.get("strict", False) is openai_strict_accepts(function["parameters"])
    # Every declared tool is one strict mode takes: the provider constrains the arguments too.
    assert all(function["strict"] is True for function in listed.values())


def test_the_responses_format_is_a_list_of_flat_function_tools(api: AgentClient) -> None:
    listed = tools(api, "responses")

    assert sorted(tool["name"] for tool in listed) == ["get_order", "refund_order"]
    for tool in listed:
        assert set(tool) == {"type", "name", "description", "parameters", "strict"}
        assert tool["type"] == "function"
        assert tool["strict"] is openai_strict_accepts(tool["parameters"])


def test_the_anthropic_format_is_a_list_of_tools_with_an_input_schema(api: AgentClient) -> None:
    listed = tools(api, "anthropic")

    for tool in listed:
        assert set(tool) <= {"name", "description", "input_schema", "strict"}
        assert tool.get("strict", False) is anthropic_strict_accepts(tool["input_schema"])
        assert tool["input_schema"]["type"] == "object"
    assert sorted(tool["name"] for tool in listed) == ["get_order", "refund_order"]


@pytest.mark.parametrize("shape", ["neutral", "openai", "anthropic"])
def test_every_format_forbids_extra_properties_and_states_units(
    api: AgentClient, shape: str
) -> None:
    def schema_of(tool: dict[str, Any]) -> dict[str, Any]:
        schema: dict[str, Any] = (
            tool["function"]["parameters"] if shape == "openai" else tool["input_schema"]
        )
        return schema

    for tool in tools(api, shape):
        schema = schema_of(tool)
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) == set(schema["properties"])
        for field in schema["properties"].values():
            assert field["description"]
    schema = next(
        schema_of(tool) for tool in tools(api, shape) if schema_of(tool)["title"] == "refund_order"
    )
    amount = schema["properties"]["amount_cents"]
    assert amount["type"] == "integer"
    assert (amount["minimum"], amount["maximum"]) == (1, 100_000_000)
    assert "minor units" in amount["description"]
    assert "25.90 is 2590" in amount["description"]
    assert schema["properties"]["order_id"]["pattern"] == "^ORD-[0-9]{1,12}$"
    assert schema["properties"]["currency"]["enum"] == ["BRL", "USD", "EUR", "JPY", "KWD"]


@pytest.mark.parametrize("shape", ["neutral", "openai", "anthropic"])
def test_it_lists_only_the_tools_on_the_agents_allowlist(
    make_agent: MakeAgent, client_for: ClientFor, shape: str
) -> None:
    api = client_for(make_agent(allowed_tools=["get_order"])[1])

    listed = tools(api, shape)

    assert len(listed) == 1
    assert "refund_order" not in str(listed)


def test_an_unknown_format_is_a_400(api: AgentClient) -> None:
    response = api.get("/api/v1/tools", format="gemini")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == 400
    assert error["message"] == (
        "format: must be one of anthropic, neutral, openai, responses, not 'gemini'"
    )


# GET /api/v1/codes ---------------------------------------------------------------------------


def test_the_code_catalogue_lists_every_code_with_its_meaning(api: AgentClient) -> None:
    response = api.get("/api/v1/codes")

    assert response.status_code == 200
    codes = {code["code"]: code for code in response.json()["codes"]}
    assert set(codes) == {
        "OK",
        "STEP_LIMIT",
        "UNKNOWN_TOOL",
        "TOOL_NOT_ALLOWED",
        "TOOL_RETIRED",
        "INVALID_JSON",
        "INVALID_ARGUMENTS",
        "LOOP_DETECTED",
        "CALL_IN_PROGRESS",
        "ORDER_NOT_FOUND",
        "CURRENCY_MISMATCH",
        "AMOUNT_EXCEEDS_REFUNDABLE",
        "POLICY_LIMIT",
        "CONFIRMATION_REQUIRED",
        "CONFIRMATION_REJECTED",
        "CONFIRMATION_NOT_FOUND",
        "UPSTREAM_UNAVAILABLE",
        "INTERNAL_ERROR",
        # The retail desk's business rules (docs/retail.md).
        *(code.name for code in RETAIL_CODES),
    }
    for code in codes.values():
        assert set(code) == {"code", "stage", "meaning", "model_fixable", "retryable"}
        assert code["meaning"]
    assert codes["ORDER_NOT_FOUND"]["stage"] == 5
    assert codes["ORDER_NOT_FOUND"]["model_fixable"] is True
    assert codes["INVALID_ARGUMENTS"]["model_fixable"] is True
    assert codes["UPSTREAM_UNAVAILABLE"]["retryable"] is True
    assert codes["LOOP_DETECTED"]["model_fixable"] is False
    assert (codes["TOOL_RETIRED"]["stage"], codes["TOOL_RETIRED"]["retryable"]) == (1, False)
    stages = [code["stage"] for code in response.json()["codes"]]
    assert stages == sorted(stages)


# GET /api/v1/sessions/{id}/calls -------------------------------------------------------------


def test_a_sessions_calls_are_listed_in_order(api: AgentClient) -> None:
    answers = [
        api.call("get_order", {"order_id": "ORD-1001"}),
        api.call("refund_order", "not json"),
        api.refund(1000),
        api.refund(1000),
    ]
    api.call("get_order", {"order_id": "ORD-1001"}, session="s-other")

    response = api.get("/api/v1/sessions/s-1/calls")

    assert response.status_code == 200
    body = response.json()
    assert (body["session_id"], body["customer_id"], body["count"]) == ("s-1", "CUS-1", 4)
    calls = body["results"]
    assert [c["call_id"] for c in calls] == [a["call_id"] for a in answers]
    assert [c["step"] for c in calls] == [1, 2, 3, 4]
    assert [c["code"] for c in calls] == ["OK", "INVALID_JSON", "OK", "OK"]
    assert [c["replayed"] for c in calls] == [False, False, False, True]
    assert calls[1]["arguments"] is None
    assert calls[2]["arguments"]["amount_cents"] == 1000


def test_a_sessions_calls_are_paginated_with_limit_and_offset(api: AgentClient) -> None:
    answers = [api.call("get_order", {"order_id": f"ORD-{n}"}) for n in range(1, 6)]

    first = api.get("/api/v1/sessions/s-1/calls", limit=2).json()
    middle = api.get("/api/v1/sessions/s-1/calls", limit=2, offset=2).json()
    last = api.get("/api/v1/sessions/s-1/calls", limit=2, offset=4).json()

    assert first["count"] == 5
    assert first["previous"] is None
    assert "offset=2" in first["next"]
    assert "offset=4" in middle["next"]
    assert last["next"] is None
    pages = first["results"] + middle["results"] + last["results"]
    assert [c["call_id"] for c in pages] == [a["call_id"] for a in answers]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"limit": "abc"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "\u0662"}, "limit"),
        ({"offset": "1.5"}, "offset"),
        ({"offset": ""}, "offset"),
        ({"limt": "5"}, "query"),
    ],
)
def test_a_page_size_or_offset_that_is_not_one_is_a_400_naming_it(
    api: AgentClient, query: dict[str, str], named: str
) -> None:
    api.call("get_order", {"order_id": "ORD-1001"})

    response = api.get("/api/v1/sessions/s-1/calls", **query)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["retryable"]) == ("invalid", False)
    assert error["message"].startswith(f"{named}:"), error["message"]


@pytest.mark.parametrize(
    "path", ["/api/v1/codes", "/api/v1/tools", "/api/v1/confirmations/nothing"]
)
def test_a_query_parameter_an_operation_does_not_take_is_a_400(api: AgentClient, path: str) -> None:
    response = api.get(path, formt="openai")

    assert response.status_code == 400, response.text
    assert "unknown parameter 'formt'" in response.json()["error"]["message"]


def test_another_agents_session_is_a_404_like_a_missing_one(
    api: AgentClient, make_agent: MakeAgent, client_for: ClientFor
) -> None:
    api.call("get_order", {"order_id": "ORD-1001"}, session="mine")
    other = client_for(make_agent()[1])

    theirs = other.get("/api/v1/sessions/mine/calls")
    missing = other.get("/api/v1/sessions/nobodys/calls")

    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert theirs.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "path",
    ["/api/v1/sessions/s%00/calls", "/api/v1/confirmations/c%00"],
    ids=["a session", "a confirmation"],
)
def test_an_id_with_a_nul_is_a_404_like_a_missing_one(api: AgentClient, path: str) -> None:
    response = api.get(path)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


# GET /api/v1/confirmations/{id} --------------------------------------------------------------


def test_a_held_call_shows_its_state(api: AgentClient, ledger: Ledger) -> None:
    held = api.refund(6000)
    confirmation_id = held["data"]["confirmation_id"]

    response = api.get(f"/api/v1/confirmations/{confirmation_id}")

    assert response.status_code == 200
    state = response.json()
    assert state["confirmation_id"] == confirmation_id
    assert (state["status"], state["final"]) == ("pending", False)
    assert state["tool"] == "refund_order"
    assert state["arguments"] == {
        "order_id": "ORD-1001",
        "amount_cents": 6000,
        "currency": "BRL",
        "reason": "damaged",
    }
    assert state["reviewers_required"] == 1
    assert state["decided_at"] is None
    assert state["result"] is None
    assert ledger.state() == (0, 0)


def test_a_held_call_is_summed_up_in_its_tools_words(api: AgentClient, ledger: Ledger) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]

    state = api.get(f"/api/v1/confirmations/{confirmation_id}").json()

    assert state["summary"] == "Refund order: 6000 BRL for ORD-1001"


def test_another_agents_confirmation_is_a_404_like_a_missing_one(
    api: AgentClient, make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    other = client_for(make_agent()[1])

    theirs = other.get(f"/api/v1/confirmations/{confirmation_id}")
    missing = other.get("/api/v1/confirmations/0123456789abcdef0123456789abcdef")

    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert confirmation_id not in theirs.text
    assert ledger.state() == (0, 0)


def test_a_pending_confirmation_past_its_expiry_shows_expired(
    api: AgentClient, ledger: Ledger
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    Confirmation.objects.filter(pk=confirmation_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    state = api.get(f"/api/v1/confirmations/{confirmation_id}").json()

    assert (state["status"], state["final"]) == ("expired", True)
    assert Confirmation.objects.get(pk=confirmation_id).status == "pending"
    assert ledger.state() == (0, 0)


# Every endpoint needs a token ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/calls"),
        ("GET", "/api/v1/tools"),
        ("GET", "/api/v1/tools?format=openai"),
        ("GET", "/api/v1/codes"),
        ("GET", "/api/v1/sessions/s-1/calls"),
        ("GET", "/api/v1/confirmations/{confirmation_id}"),
    ],
)
def test_every_endpoint_refuses_a_request_without_a_token(
    api: AgentClient, client_for: ClientFor, ledger: Ledger, method: str, path: str
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    anonymous = client_for(None)

    response = anonymous.http.request(
        method,
        anonymous.base_url + path.format(confirmation_id=confirmation_id),
        data=b'{"session_id": "s-1", "customer_id": "CUS-1", "tool": "get_order", '
        b'"arguments": {"order_id": "ORD-1001"}}',
        timeout=30,
    )

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert "pending" not in response.text
    assert ledger.state() == (0, 0)


def test_a_disabled_agent_can_read_nothing(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger
) -> None:
    confirmation_id = api.refund(6000)["data"]["confirmation_id"]
    Agent.objects.filter(pk=agent[0].pk).update(is_active=False)

    for path in ("/api/v1/tools", "/api/v1/codes", f"/api/v1/confirmations/{confirmation_id}"):
        assert api.get(path).status_code == 401
    assert ledger.state() == (0, 0)
