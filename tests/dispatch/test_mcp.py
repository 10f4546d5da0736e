"""The MCP server, driven by the SDK's own client over both transports, with only what
docs/mcp.md's configurations send: over stdio the token in the environment and the customer (and the
conversation, where the host names it); over HTTP `Authorization: Bearer` and the customer's
header. The client negotiates as it does by default (mode "auto": protocol 2026-07-28 where the
server offers it, the initialize handshake otherwise) unless a test says "legacy".

stdio: `manage.py mcp_serve` in a process of its own, as a desktop client starts it. HTTP: the
streamable-HTTP app under uvicorn in a thread of this process, on a port of its own. Both serve the
test database, so the tests commit (transaction=True): the server's connections cannot see a
test's transaction. The stdio server is another process, which sees the test database only on
PostgreSQL (SQLite's test database lives in this process's memory).

Every answer to a tools/call that these tests read is checked against the result contract's JSON
Schema, the tools' outputSchema (assert_the_contract).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import jsonschema
import pytest
import requests
import uvicorn
from django.core.management import CommandError
from django.db import connection
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION
from pytest_django.fixtures import Settings

from dispatch import mcp
from dispatch.envelopes import RESULT_FIELDS, CallResultDoc
from dispatch.models import (
    Agent,
    AuditRecord,
    CallChannel,
    Confirmation,
    SecurityEvent,
    Session,
)
from dispatch.registry import tool_registry
from dispatch.security import Origin
from dispatch.services import agent_authenticate, token_hash
from orders.tools import GetOrderArguments, RefundOrderArguments
from tests.conftest import Ledger, MakeAgent, Run, require_service
from tests.dispatch.apis.test_failures import database_away

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = ["get_order", "refund_order", "get_confirmation_status"]
REFUND_TOOL = "refund_order"
REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}

T = TypeVar("T")
# Opens a connected client as the host of that token, customer (or none) and session (or none),
# negotiating in that mode ("auto", the SDK's default, or "legacy").
Connect = Callable[..., AbstractAsyncContextManager[Client]]

_CONTRACT = jsonschema.Draft202012Validator(mcp.result_schema())


def assert_the_contract(structured_content: Any) -> None:
    """An answer to a tools/call carries the result contract, as its tool's outputSchema says."""
    _CONTRACT.validate(structured_content)


class CheckedClient(Client):
    """The SDK's client, each of whose tools/call answers is checked against the contract."""

    async def call_tool(self, name: str, *args: Any, **kwargs: Any) -> CallToolResult:
        result = await super().call_tool(name, *args, **kwargs)
        assert_the_contract(result.structured_content)
        return result


def drive(connect: Connect, steps: Callable[[Client], Awaitable[T]], token: str, **host: Any) -> T:
    """Connect as that host, run the steps on the client, and disconnect."""

    async def run() -> T:
        async with connect(token, **host) as client:
            return await steps(client)

    return anyio.run(run)


def audit(agent: Agent) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(agent=agent).order_by("at", "id"))


# stdio ------------------------------------------------------------------------------------------


def server_database_url() -> str:
    """The test database, for a server in another process: on PostgreSQL only."""
    settings = connection.settings_dict
    require_service(
        connection.vendor == "postgresql",
        "needs PostgreSQL: the stdio server is another process, which cannot see SQLite's "
        "in-memory test database",
    )
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return (
        f"postgres://{settings['USER']}{password}@{settings['HOST'] or '127.0.0.1'}:"
        f"{settings['PORT'] or 5432}/{settings['NAME']}"
    )


def server_env(token: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.test",
        "DATABASE_URL": server_database_url(),
    }
    env.pop(mcp.TOKEN_VARIABLE, None)
    if token is not None:
        env[mcp.TOKEN_VARIABLE] = token
    return env


def stdio_args(customer: str | None, session: str | None) -> list[str]:
    return [
        "manage.py",
        "mcp_serve",
        *(["--customer", customer] if customer else []),
        *(["--session", session] if session else []),
    ]


@asynccontextmanager
async def over_stdio(
    token: str,
    *,
    customer: str | None = "CUS-1",
    session: str | None = None,
    mode: str = "auto",
    env: dict[str, str] | None = None,
) -> AsyncIterator[Client]:
    """A server started for this client, as a desktop host starts one; `session` names the
    conversation (--session), which a server started again for it keeps."""
    parameters = StdioServerParameters(
        command=sys.executable,
        args=stdio_args(customer, session),
        cwd=ROOT,
        env={**server_env(token), **(env or {})},
    )
    async with CheckedClient(parameters, mode=mode) as client:
        yield client


# streamable HTTP --------------------------------------------------------------------------------


@pytest.fixture
def mcp_url(transactional_db: None) -> Iterator[str]:
    """The streamable-HTTP server under uvicorn in a thread; its URL. TOOLGATE_TEST_MCP_PORT
    chooses its port (by default any free one)."""
    config = uvicorn.Config(
        mcp.http_app(host="127.0.0.1"),
        host="127.0.0.1",
        port=int(os.environ.get("TOOLGATE_TEST_MCP_PORT", "0")),
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}{mcp.HTTP_PATH}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def http_connect(url: str) -> Connect:
    @asynccontextmanager
    async def over_http(
        token: str,
        *,
        customer: str | None = "CUS-1",
        session: str | None = None,
        mode: str = "auto",
    ) -> AsyncIterator[Client]:
        # docs/mcp.md's headers; the host's conversation only where a test names one.
        headers = {"Authorization": f"Bearer {token}"}
        if customer is not None:
            headers[mcp.CUSTOMER_HEADER] = customer
        if session is not None:
            headers[mcp.SESSION_HEADER] = session
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            CheckedClient(streamable_http_client(url, http_client=http), mode=mode) as client,
        ):
            yield client

    return over_http


def connect_over(request: pytest.FixtureRequest, transport: str, mode: str) -> Connect:
    if transport == "stdio":
        server_database_url()
        return partial(over_stdio, mode=mode)
    return partial(http_connect(request.getfixturevalue("mcp_url")), mode=mode)


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest) -> Connect:
    """A client in the SDK's default mode, over each transport."""
    return connect_over(request, request.param, "auto")


@pytest.fixture(
    params=[("stdio", "auto"), ("stdio", "legacy"), ("http", "auto"), ("http", "legacy")],
    ids=["stdio-default", "stdio-legacy", "http-default", "http-legacy"],
)
def connect_in_each_mode(request: pytest.FixtureRequest) -> Connect:
    """A client in the SDK's default mode and in its legacy one, over each transport."""
    transport, mode = request.param
    return connect_over(request, transport, mode)


@pytest.fixture
def token(make_agent: MakeAgent) -> str:
    return make_agent(allowed_tools=TOOLS)[1]


def agent_of(token: str) -> Agent:
    return Agent.objects.get(token_prefix=token[:10])


# Both transports --------------------------------------------------------------------------------


def test_it_lists_only_the_agents_allowed_tools_with_their_schemas_and_annotations(
    connect: Connect, make_agent: MakeAgent
) -> None:
    _, reader = make_agent(allowed_tools=["get_order", "get_confirmation_status"])
    _, refunder = make_agent(allowed_tools=["refund_order"])

    async def listed(client: Client) -> list[Any]:
        return (await client.list_tools()).tools

    read_tools = drive(connect, listed, reader)
    refund_tools = drive(connect, listed, refunder)

    assert [tool.name for tool in read_tools] == ["get_order", "get_confirmation_status"]
    get_order = read_tools[0]
    assert get_order.input_schema == GetOrderArguments.model_json_schema()
    assert get_order.annotations.read_only_hint is True
    assert get_order.annotations.destructive_hint is False
    assert get_order.annotations.idempotent_hint is True
    assert [tool.name for tool in refund_tools] == ["refund_order"]
    refund = refund_tools[0]
    assert refund.input_schema == RefundOrderArguments.model_json_schema()
    assert refund.input_schema["properties"]["amount_cents"]["type"] == "integer"
    assert refund.annotations.read_only_hint is False
    assert refund.annotations.destructive_hint is True
    assert refund.annotations.idempotent_hint is True


def test_over_http_a_retired_version_is_not_listed_and_its_call_names_the_successor(
    mcp_url: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    _, token = make_agent(allowed_tools=["get_order", "refund_order", "refund_order_v2"])
    refund = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}

    async def list_and_call(client: Client) -> tuple[list[str], CallToolResult]:
        names = [tool.name for tool in (await client.list_tools()).tools]
        return names, await client.call_tool("refund_order", refund)

    tool_registry.set_retired("refund_order")
    try:
        names, result = drive(http_connect(mcp_url), list_and_call, token)
    finally:
        tool_registry.set_retired("refund_order", retired=False)

    assert names == ["get_order", "refund_order_v2"]
    assert result.is_error
    assert result.structured_content is not None
    assert result.structured_content["code"] == "TOOL_RETIRED"
    assert result.structured_content["data"]["successor"] == "refund_order_v2"
    assert ledger.state() == (0, 0)


def test_every_tools_output_schema_is_the_result_contract_the_api_documents(
    connect: Connect, token: str
) -> None:
    async def listed(client: Client) -> list[Any]:
        return (await client.list_tools()).tools

    tools = drive(connect, listed, token)

    assert [tool.name for tool in tools] == TOOLS
    assert all(tool.output_schema == CallResultDoc.model_json_schema() for tool in tools)
    assert tools[0].output_schema["type"] == "object"
    assert set(tools[0].output_schema["required"]) == set(RESULT_FIELDS)


def test_a_valid_read_answers_model_text_and_the_result_contract(
    connect: Connect, token: str, ledger: Ledger
) -> None:
    async def read(client: Client) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"})

    result = drive(connect, read, token)

    assert result.is_error is False
    contract = result.structured_content
    assert contract["ok"] is True
    assert contract["data"]["refundable_cents"] == 12_000
    assert result.content[0].text == contract["model_text"]
    [record] = audit(agent_of(token))
    assert (record.tool, record.code, record.channel) == ("get_order", "OK", CallChannel.MCP)
    assert record.customer_id == "CUS-1"
    assert ledger.state() == (0, 0)


def test_a_float_amount_is_rejected_with_its_hint_as_an_error(
    connect: Connect, token: str, ledger: Ledger
) -> None:
    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", {**REFUND, "amount_cents": 25.9})

    result = drive(connect, refund, token)

    assert result.is_error is True
    assert result.structured_content["code"] == "INVALID_ARGUMENTS"
    assert "2590 for 25.90" in result.content[0].text
    [record] = audit(agent_of(token))
    assert (record.code, record.channel) == ("INVALID_ARGUMENTS", CallChannel.MCP)
    assert ledger.state() == (0, 0)


def test_a_large_refund_is_held_not_an_error_and_its_status_can_be_checked(
    connect_in_each_mode: Connect, token: str, ledger: Ledger
) -> None:
    connect = connect_in_each_mode

    async def refund_then_check(client: Client) -> tuple[Any, Any]:
        held = await client.call_tool("refund_order", {**REFUND, "amount_cents": 9000})
        confirmation_id = held.structured_content["data"]["confirmation_id"]
        status = await client.call_tool(
            "get_confirmation_status", {"confirmation_id": confirmation_id}
        )
        return held, status

    held, status = drive(connect, refund_then_check, token)

    assert held.is_error is False
    assert held.structured_content["code"] == "CONFIRMATION_REQUIRED"
    confirmation_id = held.structured_content["data"]["confirmation_id"]
    assert confirmation_id in held.content[0].text
    assert status.is_error is False
    assert status.structured_content["data"]["status"] == "pending"
    assert status.structured_content["data"]["arguments"]["amount_cents"] == 9000
    confirmation = Confirmation.objects.get(pk=confirmation_id)
    assert (confirmation.agent, confirmation.customer_id) == (agent_of(token), "CUS-1")
    records = audit(agent_of(token))
    assert [(r.code, r.channel) for r in records] == [
        ("CONFIRMATION_REQUIRED", CallChannel.MCP),
        ("OK", CallChannel.MCP),
    ]
    assert records[0].confirmation_id == confirmation_id
    assert ledger.state() == (0, 0)


def test_a_repeated_refund_in_the_session_is_replayed_without_touching_the_ledger(
    connect_in_each_mode: Connect, token: str, ledger: Ledger
) -> None:
    connect = connect_in_each_mode

    async def refund_twice(client: Client) -> tuple[Any, Any]:
        first = await client.call_tool("refund_order", REFUND)
        again = await client.call_tool("refund_order", REFUND)
        return first, again

    # The host names its conversation: over stdio, without a name each call is a session.
    first, again = drive(connect, refund_twice, token, session="conv-retry")

    assert first.structured_content["ok"] is True
    assert first.structured_content["replayed"] is False
    assert again.is_error is False
    assert again.structured_content["replayed"] is True
    assert again.structured_content["data"] == first.structured_content["data"]
    records = audit(agent_of(token))
    assert [(r.replayed, r.step, r.channel) for r in records] == [
        (False, 1, CallChannel.MCP),
        (True, 2, CallChannel.MCP),
    ]
    # The conversation is one Toolgate session, bound to the host's customer.
    assert records[0].session_id == records[1].session_id == "conv-retry"
    session = Session.objects.get(agent=agent_of(token), session_id=records[0].session_id)
    assert (session.customer_id, session.steps) == ("CUS-1", 2)
    assert ledger.state() == (1, 1000)


def test_a_call_without_a_customer_is_refused_with_its_code_and_nothing_is_dispatched(
    connect_in_each_mode: Connect, token: str, ledger: Ledger
) -> None:
    async def refund(client: Client) -> tuple[list[str], Any]:
        listed = [tool.name for tool in (await client.list_tools()).tools]
        return listed, await client.call_tool("refund_order", REFUND)

    listed, result = drive(connect_in_each_mode, refund, token, customer=None)

    assert listed == TOOLS
    assert result.is_error is True
    assert "gave no customer" in result.content[0].text
    refusal = result.structured_content
    assert (refusal["ok"], refusal["code"], refusal["tool"]) == (
        False,
        "customer_missing",
        REFUND_TOOL,
    )
    assert (refusal["call_id"], refusal["data"]) == ("", {"status": 400})
    assert refusal["model_text"] == result.content[0].text
    assert audit(agent_of(token)) == []
    assert not Session.objects.filter(agent=agent_of(token)).exists()
    assert ledger.state() == (0, 0)


def test_a_call_without_a_customer_is_a_security_event_of_the_mcp_channel(
    connect: Connect, token: str, ledger: Ledger
) -> None:
    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", REFUND)

    drive(connect, refund, token, customer=None)

    event = SecurityEvent.objects.get()
    assert (event.channel, event.status, event.reason, event.agent) == (
        CallChannel.MCP,
        400,
        "customer_missing",
        agent_of(token),
    )
    assert (event.method, event.path) in {("tools/call", "stdio"), ("POST", mcp.HTTP_PATH)}
    assert "gave no customer" in event.detail
    assert ledger.state() == (0, 0)


def test_a_nul_in_the_arguments_is_a_pipeline_rejection_with_its_audit_record(
    connect: Connect, token: str, ledger: Ledger
) -> None:
    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", {**REFUND, "reason": "damaged\u0000"})

    result = drive(connect, refund, token)

    assert result.structured_content["code"] == "INVALID_JSON"
    [record] = audit(agent_of(token))
    assert (record.code, record.channel) == ("INVALID_JSON", CallChannel.MCP)
    assert "damaged\\u0000" in record.raw_arguments
    assert ledger.state() == (0, 0)


# Transport by transport -------------------------------------------------------------------------


PROTOCOL_VERSION = "2025-06-18"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
# 1.00 and then 49.00: a reader that keeps the last of two keys refunds 49.00, and an audit of
# the parsed arguments shows only that.
KEY_TWICE = (
    '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "refund_order", '
    '"arguments": {"order_id": "ORD-1001", "amount_cents": 100, "amount_cents": 4900, '
    '"currency": "BRL", "reason": "damaged"}}}'
)


# 80.00 where minor units are due: written as money, which the message's hint must follow.
MONEY_WRITTEN = (
    '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "refund_order", '
    '"arguments": {"order_id": "ORD-1001", "amount_cents": 80.00, "currency": "BRL", '
    '"reason": "damaged"}}}'
)
# What the API answers for the same arguments (tests/dispatch/pipeline/test_messages.py).
MONEY_HINT = "80.00 is not an integer (send an integer in minor units, such as 8000 for 80.00)"


def checked_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC answer read off the wire, whose tools/call result carries the contract."""
    if "structuredContent" in answer.get("result", {}):
        assert_the_contract(answer["result"]["structuredContent"])
    return answer


def rpc_answer(response: requests.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a response, sent as JSON or as the last server-sent event."""
    assert response.status_code == 200, response.text
    if response.headers["Content-Type"].startswith("text/event-stream"):
        events = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return checked_answer(json.loads(events[-1]))
    return checked_answer(dict(response.json()))


def assert_refused_as_a_key_twice(answer: dict[str, Any]) -> None:
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32700
    assert "key 'amount_cents' appears more than once" in answer["error"]["message"]
    assert answer["error"]["data"]["code"] == "malformed_message"


def assert_recorded_as_a_key_twice(token: str, method: str, path: str) -> None:
    event = SecurityEvent.objects.get()
    assert (event.channel, event.status, event.reason, event.agent) == (
        CallChannel.MCP,
        400,
        "malformed_message",
        agent_of(token),
    )
    assert (event.method, event.path) == (method, path)


def refusal_of(response: requests.Response, status: int) -> dict[str, Any]:
    """An HTTP refusal's body: a JSON-RPC error, whose data is the API's error."""
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    error: dict[str, Any] = answer["error"]
    assert error["message"] == error["data"]["message"]
    assert error["data"]["status"] == status
    return error


@pytest.mark.parametrize("scheme", ["Bearer", "Token"])
def test_over_http_the_token_is_taken_under_either_scheme(
    mcp_url: str, token: str, scheme: str
) -> None:
    response = requests.post(
        mcp_url,
        json=INITIALIZE,
        headers={**ACCEPT, "Authorization": f"{scheme} {token}"},
        timeout=30,
    )

    assert response.status_code == 200, response.text
    assert not SecurityEvent.objects.exists()


def test_over_http_a_missing_or_wrong_token_is_a_401_that_asks_for_a_static_token(
    mcp_url: str, token: str
) -> None:
    missing = requests.post(mcp_url, json=INITIALIZE, headers=ACCEPT, timeout=30)
    wrong = requests.post(
        mcp_url,
        json=INITIALIZE,
        headers={**ACCEPT, "Authorization": f"Bearer {token}x"},
        timeout=30,
    )

    not_provided = refusal_of(missing, 401)
    assert not_provided["data"]["code"] == "not_authenticated"
    assert "'Authorization: Bearer <token>'" in not_provided["message"]
    assert "runs no OAuth" in not_provided["message"]
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="toolgate"'
    invalid = refusal_of(wrong, 401)
    assert invalid["data"]["code"] == "authentication_failed"
    assert invalid["message"].startswith("Invalid token, or the agent is disabled.")
    challenge = wrong.headers["WWW-Authenticate"]
    assert challenge.startswith('Bearer realm="toolgate", error="invalid_token"')
    assert "resource_metadata" not in challenge


def test_over_http_the_sdk_client_shows_a_wrong_tokens_reason(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    async def read(client: Client) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"})

    # The SDK raises it inside its task groups' exception groups.
    with pytest.raises(BaseException) as refused:
        drive(http_connect(mcp_url), read, token + "x")

    error = only_mcp_error(refused.value)
    assert "runs no OAuth" in error.error.message
    assert error.error.data["code"] == "authentication_failed"
    # The probe for 2026-07-28, then the initialize handshake it falls back to.
    events = SecurityEvent.objects.all()
    assert {(e.status, e.reason) for e in events} == {(401, "authentication_failed")}


def only_mcp_error(raised: BaseException) -> MCPError:
    """The one MCPError inside what the SDK raised (its task groups wrap it)."""
    while isinstance(raised, BaseExceptionGroup):
        [raised] = raised.exceptions
    assert isinstance(raised, MCPError), repr(raised)
    return raised


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
    ],
)
def test_over_http_no_oauth_metadata_is_served_and_no_token_is_asked_for_it(
    mcp_url: str, path: str
) -> None:
    response = requests.get(mcp_url.removesuffix(mcp.HTTP_PATH) + path, timeout=30)

    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert "runs no OAuth" in error["message"]
    assert not SecurityEvent.objects.exists()


def test_over_http_an_agent_without_a_policy_is_answered_403(mcp_url: str) -> None:
    token = "tg_without_a_policy_0123456789"
    Agent.objects.create(name="no-policy", token_prefix=token[:10], token_hash=token_hash(token))

    response = requests.post(
        mcp_url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=30
    )

    assert refusal_of(response, 403)["data"]["code"] == "permission_denied"


def test_over_http_the_agents_requests_are_throttled_as_on_the_api(
    mcp_url: str, token: str, settings: Settings
) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "2/min"
    headers = {**ACCEPT, "Authorization": f"Bearer {token}"}

    answers = [
        requests.post(mcp_url, json=INITIALIZE, headers=headers, timeout=30) for _ in range(3)
    ]

    assert [a.status_code for a in answers] == [200, 200, 429]
    assert refusal_of(answers[2], 429)["data"]["code"] == "throttled"
    assert int(answers[2].headers["Retry-After"]) > 0


def test_over_http_refused_tokens_are_security_events_of_the_mcp_channel(
    mcp_url: str, token: str
) -> None:
    bare = "tg_without_a_policy_0123456789"
    Agent.objects.create(name="no-policy", token_prefix=bare[:10], token_hash=token_hash(bare))

    for authorization in (None, f"Token {token}x", f"Token {bare}"):
        headers = {**ACCEPT, **({"Authorization": authorization} if authorization else {})}
        requests.post(mcp_url, json=INITIALIZE, headers=headers, timeout=30)

    events = SecurityEvent.objects.order_by("pk")
    assert [(e.status, e.reason) for e in events] == [
        (401, "not_authenticated"),
        (401, "authentication_failed"),
        (403, "permission_denied"),
    ]
    assert {(e.channel, e.method, e.path, e.client_address) for e in events} == {
        (CallChannel.MCP, "POST", mcp.HTTP_PATH, "127.0.0.1")
    }
    assert events[2].agent == agent_of(bare)


def test_over_http_a_flood_of_bad_tokens_is_throttled_with_the_apis_and_its_events_bounded(
    mcp_url: str, token: str, settings: Settings
) -> None:
    settings.TOOLGATE_AUTH_FAILURE_RATE = "5/min"
    assert requests.post(
        mcp_url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=30
    ).ok

    flood = [
        requests.post(
            mcp_url,
            json=INITIALIZE,
            headers={**ACCEPT, "Authorization": f"Bearer tg_guess-{n}"},
            timeout=30,
        )
        for n in range(12)
    ]
    known = requests.post(
        mcp_url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=30
    )

    assert [answer.status_code for answer in flood] == [401] * 5 + [429] * 7
    throttled = refusal_of(flood[-1], 429)
    assert (throttled["data"]["code"], throttled["data"]["retryable"]) == (
        "authentication_throttled",
        True,
    )
    assert 1 <= int(flood[-1].headers["Retry-After"]) <= 60
    assert known.status_code == 200, known.text
    events = SecurityEvent.objects.order_by("pk")
    assert [(e.channel, e.status, e.reason) for e in events] == [
        (CallChannel.MCP, 401, "authentication_failed")
    ] * 5 + [(CallChannel.MCP, 429, "authentication_throttled")]


def test_over_http_the_hosts_refusals_are_security_events_of_the_mcp_channel(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    over_http = http_connect(mcp_url)

    async def read(client: Client) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"})

    refusals = [
        drive(over_http, read, token, customer="CUS 1"),
        drive(over_http, read, token, session="conv 9"),
        drive(over_http, read, token, session="conv-9", customer="CUS-1"),
        drive(over_http, read, token, session="conv-9", customer="CUS-2"),
    ]

    codes = [r.structured_content["code"] for r in refusals if r.is_error]
    assert codes == ["customer_invalid", "session_invalid", "session_conflict"]
    events = SecurityEvent.objects.order_by("pk")
    assert [(e.status, e.reason) for e in events] == [
        (400, "customer_invalid"),
        (400, "session_invalid"),
        (409, "session_conflict"),
    ]
    assert {(e.channel, e.agent) for e in events} == {(CallChannel.MCP, agent_of(token))}
    assert [r.customer_id for r in audit(agent_of(token))] == ["CUS-1"]


def http_session(url: str, token: str) -> dict[str, str]:
    """The headers of an MCP session opened over HTTP by hand, as a client opens one."""
    headers = {**ACCEPT, "Authorization": f"Token {token}", mcp.CUSTOMER_HEADER: "CUS-1"}
    opened = requests.post(url, json=INITIALIZE, headers=headers, timeout=30)
    assert opened.status_code == 200, opened.text
    headers |= {
        mcp.MCP_SESSION_HEADER: opened.headers[mcp.MCP_SESSION_HEADER],
        "MCP-Protocol-Version": PROTOCOL_VERSION,
    }
    requests.post(url, json=INITIALIZED, headers=headers, timeout=30)
    return headers


def test_over_http_a_message_with_a_key_twice_is_refused_before_any_tool(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    headers = http_session(mcp_url, token)

    response = requests.post(
        mcp_url,
        data=KEY_TWICE.encode(),
        headers={**headers, "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/json"
    assert_refused_as_a_key_twice(response.json())
    assert audit(agent_of(token)) == []
    assert ledger.state() == (0, 0)
    assert_recorded_as_a_key_twice(token, "POST", mcp.HTTP_PATH)


def test_over_http_the_arguments_are_read_by_the_apis_parser(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    headers = http_session(mcp_url, token)

    response = requests.post(
        mcp_url,
        data=MONEY_WRITTEN.encode(),
        headers={**headers, "Content-Type": "application/json"},
        timeout=30,
    )

    result = rpc_answer(response)["result"]["structuredContent"]
    assert result["code"] == "INVALID_ARGUMENTS"
    assert MONEY_HINT in result["message"]
    assert ledger.state() == (0, 0)


def test_over_http_a_body_over_the_apis_limit_is_a_413(
    mcp_url: str, token: str, settings: Settings, ledger: Ledger
) -> None:
    settings.TOOLGATE_MAX_BODY_BYTES = 1024
    padded = {**INITIALIZE, "id": 2, "pad": "x" * 1024}

    response = requests.post(
        mcp_url, json=padded, headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=30
    )

    assert refusal_of(response, 413)["data"]["code"] == "payload_too_large"
    event = SecurityEvent.objects.get()
    assert (event.channel, event.status, event.reason) == (
        CallChannel.MCP,
        413,
        "payload_too_large",
    )


def test_over_http_the_default_client_falls_back_to_an_mcp_session_and_replays_in_it(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    over_http = http_connect(mcp_url)

    async def refund_twice(client: Client) -> tuple[str, list[Any]]:
        calls = [await client.call_tool("refund_order", REFUND) for _ in range(2)]
        return client.protocol_version, calls

    version, (first, again) = drive(over_http, refund_twice, token)

    # 2026-07-28 has no MCP session: offered only to a host that names its conversation.
    assert version == LATEST_HANDSHAKE_VERSION
    assert (first.structured_content["code"], first.structured_content["replayed"]) == ("OK", False)
    assert again.structured_content["replayed"] is True
    [session] = {r.session_id for r in audit(agent_of(token))}
    assert not session.startswith("conv-")
    assert ledger.state() == (1, 1000)


def test_over_http_a_host_that_names_its_conversation_is_served_2026_07_28_and_replayed(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    over_http = http_connect(mcp_url)

    async def refund(client: Client) -> tuple[str, Any]:
        return client.protocol_version, await client.call_tool("refund_order", REFUND)

    # A retry is another connection of the same conversation: only its name ties the two.
    version, first = drive(over_http, refund, token, session="conv-7")
    _, retry = drive(over_http, refund, token, session="conv-7")

    assert version == LATEST_MODERN_VERSION
    assert first.structured_content["replayed"] is False
    assert retry.structured_content["replayed"] is True
    assert retry.structured_content["data"] == first.structured_content["data"]
    assert [r.session_id for r in audit(agent_of(token))] == ["conv-7", "conv-7"]
    assert ledger.state() == (1, 1000)


def test_over_http_2026_07_28_without_the_hosts_conversation_is_answered_with_the_versions_offered(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "refund_order", "arguments": REFUND},
    }
    headers = {
        **ACCEPT,
        "Authorization": f"Bearer {token}",
        mcp.CUSTOMER_HEADER: "CUS-1",
        "MCP-Protocol-Version": LATEST_MODERN_VERSION,
    }

    response = requests.post(mcp_url, json=call, headers=headers, timeout=30)

    assert response.status_code == 400
    answer = response.json()
    assert answer["id"] == 3
    assert answer["error"]["code"] == -32022
    assert answer["error"]["data"]["requested"] == LATEST_MODERN_VERSION
    assert LATEST_HANDSHAKE_VERSION in answer["error"]["data"]["supported"]
    assert LATEST_MODERN_VERSION not in answer["error"]["data"]["supported"]
    assert mcp.SESSION_HEADER in answer["error"]["message"]
    assert audit(agent_of(token)) == []
    assert ledger.state() == (0, 0)


def test_over_http_a_session_stays_bound_to_its_first_customer(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    over_http = http_connect(mcp_url)

    async def read(client: Client) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"})

    drive(over_http, read, token, session="conv-8", customer="CUS-1")
    other = drive(over_http, read, token, session="conv-8", customer="CUS-2")

    assert other.is_error is True
    assert "bound to another customer" in other.content[0].text
    assert other.structured_content["code"] == "session_conflict"
    assert other.structured_content["data"] == {"status": 409}
    assert [r.customer_id for r in audit(agent_of(token))] == ["CUS-1"]


@pytest.mark.parametrize(
    ("token_of", "message"),
    [
        (lambda token: None, f"Set {mcp.TOKEN_VARIABLE} to the agent's token."),
        (lambda token: token + "x", f"{mcp.TOKEN_VARIABLE} is not the token of an active agent"),
    ],
    ids=["missing", "wrong"],
)
def test_over_stdio_a_missing_or_wrong_token_stops_the_server_with_a_clear_message(
    token: str, token_of: Callable[[str], str | None], message: str
) -> None:
    env = server_env(token_of(token))

    completed = subprocess.run(
        [sys.executable, "manage.py", "mcp_serve", "--customer", "CUS-1"],
        cwd=ROOT,
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 1
    assert message in completed.stderr
    assert completed.stdout == ""


def test_over_stdio_a_message_line_with_a_key_twice_is_answered_with_a_parse_error(
    token: str, ledger: Ledger
) -> None:
    lines = [json.dumps(INITIALIZE), json.dumps(INITIALIZED), KEY_TWICE]

    completed = subprocess.run(
        [sys.executable, "manage.py", "mcp_serve", "--customer", "CUS-1"],
        cwd=ROOT,
        env=server_env(token),
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )

    answers = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [answer["id"] for answer in answers] == [1, 7]
    assert_refused_as_a_key_twice(answers[1])
    assert audit(agent_of(token)) == []
    assert ledger.state() == (0, 0)
    assert_recorded_as_a_key_twice(token, "tools/call", mcp.STDIO_PATH)


def stdio_answer(token: str, lines: list[str], request_id: int) -> dict[str, Any]:
    """Write the lines to a stdio server and read its answers up to the one to `request_id`;
    stdin stays open until then, since a call still running when it ends is dropped."""
    server = subprocess.Popen(
        [sys.executable, "manage.py", "mcp_serve", "--customer", "CUS-1"],
        cwd=ROOT,
        env=server_env(token),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watchdog = threading.Timer(120, server.kill)
    watchdog.start()
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write("\n".join(lines) + "\n")
        server.stdin.flush()
        for line in server.stdout:
            answer = checked_answer(json.loads(line))
            if answer.get("id") == request_id:
                server.stdin.close()
                server.wait(timeout=60)
                return answer
        raise AssertionError(f"the server ended without answering {request_id}")
    finally:
        watchdog.cancel()
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def test_over_stdio_the_arguments_are_read_by_the_apis_parser(token: str, ledger: Ledger) -> None:
    lines = [json.dumps(INITIALIZE), json.dumps(INITIALIZED), MONEY_WRITTEN]

    answer = stdio_answer(token, lines, request_id=8)

    result = answer["result"]["structuredContent"]
    assert result["code"] == "INVALID_ARGUMENTS"
    assert MONEY_HINT in result["message"]
    assert ledger.state() == (0, 0)


def test_over_stdio_a_refused_token_is_a_security_event_of_the_mcp_channel(token: str) -> None:
    env = server_env(token + "x")

    completed = subprocess.run(
        [sys.executable, "manage.py", "mcp_serve", "--customer", "CUS-1"],
        cwd=ROOT,
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 1
    event = SecurityEvent.objects.get()
    assert (event.channel, event.status, event.reason, event.agent) == (
        CallChannel.MCP,
        401,
        "authentication_failed",
        None,
    )
    assert (event.method, event.path, event.client_address) == ("mcp_serve", "stdio", None)


def test_over_http_the_customer_is_not_an_option_of_the_server(run: Run) -> None:
    with pytest.raises(CommandError) as refused:
        run("mcp_serve", "--transport", "http", "--customer", "CUS-1")

    assert mcp.CUSTOMER_HEADER in str(refused.value)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_over_stdio_a_refused_start_is_shown_to_the_client_as_an_initialize_error(
    token: str, mode: str
) -> None:
    server_database_url()

    async def read(client: Client) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"})

    # The SDK raises it inside its task groups' exception groups.
    with pytest.raises(BaseException) as refused:
        drive(partial(over_stdio, mode=mode), read, token + "x")

    error = only_mcp_error(refused.value)
    assert f"{mcp.TOKEN_VARIABLE} is not the token of an active agent" in error.error.message
    assert error.error.data["code"] == "authentication_failed"
    assert error.error.data["status"] == 401
    event = SecurityEvent.objects.get()
    assert (event.reason, event.method) == ("authentication_failed", "mcp_serve")


def test_over_stdio_an_invalid_session_name_refuses_the_start(token: str) -> None:
    server_database_url()

    completed = subprocess.run(
        [sys.executable, *stdio_args("CUS-1", "conv 1")],
        cwd=ROOT,
        env=server_env(token),
        input=json.dumps(INITIALIZE) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 1
    [answer] = [json.loads(line) for line in completed.stdout.splitlines()]
    assert (answer["id"], answer["error"]["data"]["code"]) == (1, "session_invalid")
    assert "--session" in completed.stderr
    assert SecurityEvent.objects.get().reason == "session_invalid"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("named_by", ["option", "environment"])
def test_over_stdio_a_server_started_again_for_the_same_conversation_replays_its_refund(
    token: str, ledger: Ledger, mode: str, named_by: str
) -> None:
    server_database_url()
    conversation: dict[str, Any] = (
        {"session": "conv-41"}
        if named_by == "option"
        else {"env": {mcp.SESSION_VARIABLE: "conv-41"}}
    )
    restartable = partial(over_stdio, mode=mode, **conversation)

    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", REFUND)

    first = drive(restartable, refund, token)
    # The host started the server again for that conversation, and its client retries.
    retry = drive(restartable, refund, token)

    assert first.structured_content["replayed"] is False
    assert retry.is_error is False
    assert retry.structured_content["replayed"] is True
    assert retry.structured_content["data"] == first.structured_content["data"]
    assert [r.session_id for r in audit(agent_of(token))] == ["conv-41", "conv-41"]
    assert ledger.state() == (1, 1000)


def test_over_stdio_a_server_without_a_conversation_has_a_session_of_its_own(
    token: str, ledger: Ledger
) -> None:
    server_database_url()

    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", REFUND)

    first = drive(over_stdio, refund, token)
    again = drive(over_stdio, refund, token)

    # Another process, another session: the same refund is a new call there, which the
    # policy holds as a possible duplicate of the first, and no money moves twice.
    assert first.structured_content["code"] == "OK"
    assert again.structured_content["code"] == "CONFIRMATION_REQUIRED"
    assert len({r.session_id for r in audit(agent_of(token))}) == 2
    assert ledger.state() == (1, 1000)


def test_a_possible_duplicate_is_held_without_showing_the_other_agents_ids(
    connect: Connect, make_agent: MakeAgent, ledger: Ledger
) -> None:
    first_agent, first_token = make_agent(allowed_tools=TOOLS)
    _, second_token = make_agent(allowed_tools=TOOLS)

    async def refund_then_check(client: Client) -> list[Any]:
        held = await client.call_tool("refund_order", REFUND)
        confirmation_id = held.structured_content["data"]["confirmation_id"]
        status = await client.call_tool(
            "get_confirmation_status", {"confirmation_id": confirmation_id}
        )
        return [held, status]

    async def refund(client: Client) -> Any:
        return await client.call_tool("refund_order", REFUND)

    drive(connect, refund, first_token)
    held, status = drive(connect, refund_then_check, second_token)

    assert held.structured_content["code"] == "CONFIRMATION_REQUIRED"
    hold_reason = status.structured_content["data"]["hold_reason"]
    assert hold_reason["kind"] == "possible_duplicate"
    [first_session] = {r.session_id for r in audit(first_agent)}
    seen_by_the_model = json.dumps([r.model_dump(mode="json") for r in (held, status)])
    assert first_session not in seen_by_the_model
    assert first_agent.name not in seen_by_the_model
    # No field names an agent, and no value is the other agent's id (times hold digits too, so
    # the id is looked for as a whole value, not as a digit anywhere in the text).
    assert not any("agent" in name for name in _names(hold_reason))
    assert first_agent.pk not in _values(hold_reason)
    assert str(first_agent.pk) not in _values(hold_reason)
    assert ledger.state() == (1, 1000)


def _names(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for name, item in value.items():
            yield str(name)
            yield from _names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _names(item)


def _values(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _values(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _values(item)]
    return [value]


def test_a_call_while_the_database_is_away_is_a_retryable_tool_error_that_keeps_nothing(
    token: str,
) -> None:
    agent = agent_authenticate(token)
    assert agent is not None
    host = mcp.Host(agent, "s-away", "CUS-1", Origin(CallChannel.MCP, "POST", mcp.HTTP_PATH))

    with database_away():
        if connection.vendor == "postgresql":
            connection.close()  # the next statement connects anew, to a server that is away
        result = mcp.tool_call(host, "get_order", {"order_id": "ORD-1001"})

    assert result.is_error is True
    assert result.structured_content is not None
    assert_the_contract(result.structured_content)
    assert result.structured_content["code"] == "database_unavailable"
    assert result.structured_content["retryable"] is True
    assert result.structured_content["data"] == {"status": 503}
    assert not AuditRecord.objects.exists()
    assert not SecurityEvent.objects.exists()
