"""The MCP server driven by clients nobody here wrote, each pinned, with docs/mcp.md's
configurations and nothing else: fastmcp's client (pyproject's dev extras) and the MCP Inspector's
CLI (tests/dispatch/inspector/, installed with `npm ci` where Node is present: CI has it).

The configurations are read from docs/mcp.md's own JSON blocks, with the paths, the token and
the port of this run put in, so that what the page says is what is tested.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.contrib.auth.models import User
from fastmcp import Client
from mcp import MCPError

from approvals.services import confirmation_approve
from dispatch import mcp
from dispatch.models import CallChannel, SecurityEvent
from tests.conftest import Ledger, MakeAgent, require_service
from tests.dispatch.test_mcp import (
    REFUND,
    ROOT,
    TOOLS,
    agent_of,
    assert_the_contract,
    audit,
    mcp_url,
    server_database_url,
)
from tests.dispatch.test_status_polls import reviewer

__all__ = ["mcp_url", "reviewer"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

T = TypeVar("T")
FastMCPClient = Client[Any]
INSPECTOR = ROOT / "tests" / "dispatch" / "inspector"
DOC_TOKEN = "<the agent's token>"
DOC_URL = "http://127.0.0.1:8001/mcp"
HELD = {**REFUND, "amount_cents": 9000}


def documented_configuration(marker: str) -> dict[str, Any]:
    """docs/mcp.md's JSON configuration block that contains `marker`."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    [block] = [block for block in blocks if marker in block]
    configuration: dict[str, Any] = json.loads(block)
    return configuration


def claude_desktop(token: str, *args: str) -> dict[str, Any]:
    """docs/mcp.md's Claude Desktop configuration, for this checkout and the test database (its
    "add DATABASE_URL and the rest of the configuration to env"); `args` are what a host
    adds, such as the conversation it starts the server for."""
    configuration = documented_configuration('"command"')
    server = configuration["mcpServers"]["toolgate"]
    server["command"] = server["command"].replace("/path/to/toolgate", str(ROOT))
    server["args"] = [arg.replace("/path/to/toolgate", str(ROOT)) for arg in server["args"]]
    server["args"] += list(args)
    assert server["env"] == {mcp.TOKEN_VARIABLE: DOC_TOKEN}
    server["env"] = {
        mcp.TOKEN_VARIABLE: token,
        "DATABASE_URL": server_database_url(),
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.test",
    }
    return configuration


def claude_code(url: str, token: str, *, customer: str = "CUS-1") -> dict[str, Any]:
    """docs/mcp.md's configuration for a client that takes a URL and headers."""
    configuration = documented_configuration('"type": "http"')
    server = configuration["mcpServers"]["toolgate"]
    assert server["url"] == DOC_URL
    server["url"] = url
    headers = server["headers"]
    assert set(headers) == {"Authorization", mcp.CUSTOMER_HEADER}
    headers["Authorization"] = headers["Authorization"].replace(DOC_TOKEN, token)
    headers[mcp.CUSTOMER_HEADER] = customer
    return configuration


@pytest.fixture
def token(make_agent: MakeAgent) -> str:
    return make_agent(allowed_tools=TOOLS)[1]


# fastmcp ----------------------------------------------------------------------------------------


def with_fastmcp(
    configuration: dict[str, Any], steps: Callable[[FastMCPClient], Awaitable[T]]
) -> T:
    async def run() -> T:
        async with Client(configuration, timeout=120) as client:
            return await steps(client)

    return asyncio.run(run())


async def refund_retry_and_hold(client: FastMCPClient) -> list[Any]:
    """A refund, the client's identical retry, a refund held for a human and its status."""
    first = await client.call_tool("refund_order", REFUND, raise_on_error=False)
    retry = await client.call_tool("refund_order", REFUND, raise_on_error=False)
    held = await client.call_tool("refund_order", HELD, raise_on_error=False)
    assert held.structured_content is not None
    status = await client.call_tool(
        "get_confirmation_status",
        {"confirmation_id": held.structured_content["data"]["confirmation_id"]},
        raise_on_error=False,
    )
    return [first, retry, held, status]


def assert_refund_retry_and_hold(results: list[Any], token: str, ledger: Ledger) -> None:
    first, retry, held, status = results
    for result in results:
        assert_the_contract(result.structured_content)
    assert (first.structured_content["code"], first.structured_content["replayed"]) == ("OK", False)
    assert retry.is_error is False
    assert retry.structured_content["replayed"] is True
    assert held.is_error is False
    assert held.structured_content["code"] == "CONFIRMATION_REQUIRED"
    assert status.structured_content["data"]["status"] == "pending"
    records = audit(agent_of(token))
    assert [(r.code, r.replayed) for r in records][:2] == [("OK", False), ("OK", True)]
    assert {r.channel for r in records} == {CallChannel.MCP}
    assert ledger.state() == (1, 1000)


def test_fastmcp_over_http_with_the_documented_configuration(
    mcp_url: str, token: str, ledger: Ledger
) -> None:
    results = with_fastmcp(claude_code(mcp_url, token), refund_retry_and_hold)

    assert_refund_retry_and_hold(results, token, ledger)


def test_fastmcp_over_stdio_with_the_documented_configuration(token: str, ledger: Ledger) -> None:
    # A host that starts a server for each conversation names it (docs/mcp.md).
    results = with_fastmcp(claude_desktop(token, "--session", "conv-9"), refund_retry_and_hold)

    assert_refund_retry_and_hold(results, token, ledger)


def test_fastmcp_over_stdio_as_claude_desktop_shares_nothing_between_calls(
    token: str, ledger: Ledger
) -> None:
    async def refund_twice(client: FastMCPClient) -> list[Any]:
        return [
            await client.call_tool("refund_order", REFUND, raise_on_error=False) for _ in range(2)
        ]

    first, again = with_fastmcp(claude_desktop(token), refund_twice)

    # One server for all of Claude Desktop's conversations: each call is a session of its own,
    # so the same refund again is a new call, held for a human as a possible duplicate.
    assert first.structured_content["code"] == "OK"
    assert again.structured_content["code"] == "CONFIRMATION_REQUIRED"
    assert again.structured_content["data"]["reason"]["kind"] == "possible_duplicate"
    assert len({r.session_id for r in audit(agent_of(token))}) == 2
    assert ledger.state() == (1, 1000)


def test_fastmcp_reads_a_refusals_code(mcp_url: str, token: str, ledger: Ledger) -> None:
    async def read(client: FastMCPClient) -> Any:
        return await client.call_tool("get_order", {"order_id": "ORD-1001"}, raise_on_error=False)

    refused = with_fastmcp(claude_code(mcp_url, token, customer="CUS 1"), read)

    assert refused.is_error is True
    assert_the_contract(refused.structured_content)
    assert refused.structured_content["code"] == "customer_invalid"
    assert SecurityEvent.objects.get().reason == "customer_invalid"
    assert ledger.state() == (0, 0)


def test_fastmcp_lists_the_agents_tools_with_their_schemas(mcp_url: str, token: str) -> None:
    async def listed(client: FastMCPClient) -> Any:
        return await client.list_tools()

    tools = with_fastmcp(claude_code(mcp_url, token), listed)

    assert [tool.name for tool in tools] == TOOLS
    assert all(tool.output_schema == mcp.result_schema() for tool in tools)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_fastmcp_shows_a_wrong_tokens_reason(
    request: pytest.FixtureRequest, token: str, transport: str
) -> None:
    if transport == "stdio":
        configuration = claude_desktop(token + "x")
    else:
        configuration = claude_code(request.getfixturevalue("mcp_url"), token + "x")

    async def listed(client: FastMCPClient) -> Any:
        return await client.list_tools()

    with pytest.raises(MCPError) as refused:
        with_fastmcp(configuration, listed)

    assert refused.value.error.data["code"] == "authentication_failed"
    assert "not the token of an active agent" in refused.value.error.message or (
        "runs no OAuth" in refused.value.error.message
    )


# The MCP Inspector's CLI ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inspector() -> Path:
    """The Inspector's CLI as package-lock.json pins it, installed on first use."""
    npm = shutil.which("npm")
    require_service(
        npm is not None and shutil.which("node") is not None,
        "needs Node.js and npm for the MCP Inspector's CLI",
    )
    assert npm is not None
    binary = INSPECTOR / "node_modules" / ".bin" / "mcp-inspector"
    installed = INSPECTOR / "node_modules" / ".package-lock.json"
    lock = INSPECTOR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=INSPECTOR,
            check=True,
            timeout=900,
        )
    return binary


def inspect(
    inspector: Path, home: Path, configuration: dict[str, Any], *args: str
) -> dict[str, Any]:
    """One run of the Inspector's CLI with that configuration; its JSON answer (or error)."""
    path = home / "mcp.json"
    path.write_text(json.dumps(configuration))
    completed = subprocess.run(
        [str(inspector), "--cli", "--config", str(path), "--server", "toolgate", *args],
        cwd=home,
        # Its catalog and secrets stay in this test's folder, and in memory.
        env={**os.environ, "HOME": str(home), "MCP_INSPECTOR_SECRET_STORE": "memory"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    answer: dict[str, Any] = json.loads(completed.stdout or completed.stderr)
    return answer


def refund_args(arguments: dict[str, Any], tool: str = "refund_order") -> list[str]:
    return [
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        "--tool-args-json",
        json.dumps(arguments),
        "--format",
        "json",
        "-q",
    ]


LIST = ["--method", "tools/list", "--format", "json", "-q"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_lists_and_calls_the_tools_with_the_documented_configuration(
    request: pytest.FixtureRequest,
    inspector: Path,
    tmp_path: Path,
    token: str,
    ledger: Ledger,
    transport: str,
) -> None:
    if transport == "stdio":
        configuration = claude_desktop(token)
    else:
        configuration = claude_code(request.getfixturevalue("mcp_url"), token)

    listed = inspect(inspector, tmp_path, configuration, *LIST)
    called = inspect(inspector, tmp_path, configuration, *refund_args(REFUND))

    tools = listed["result"]["tools"]
    assert [tool["name"] for tool in tools] == TOOLS
    assert all(tool["outputSchema"] == mcp.result_schema() for tool in tools)
    contract = called["result"]["structuredContent"]
    assert_the_contract(contract)
    assert (contract["code"], contract["replayed"]) == ("OK", False)
    assert ledger.state() == (1, 1000)


def test_the_inspector_shows_a_refusal_as_a_result_with_its_code(
    mcp_url: str, inspector: Path, tmp_path: Path, token: str, ledger: Ledger
) -> None:
    configuration = claude_code(mcp_url, token)
    floated = {**REFUND, "amount_cents": 25.9}

    refused = inspect(inspector, tmp_path, configuration, *refund_args(floated))["result"]

    assert refused["isError"] is True
    assert_the_contract(refused["structuredContent"])
    assert refused["structuredContent"]["code"] == "INVALID_ARGUMENTS"
    assert "2590 for 25.90" in refused["content"][0]["text"]
    assert ledger.state() == (0, 0)


def test_the_inspectors_retry_in_a_new_process_of_the_same_conversation_is_replayed(
    inspector: Path, tmp_path: Path, token: str, ledger: Ledger
) -> None:
    # The CLI starts a server per call: the host names the conversation, as docs/mcp.md says.
    configuration = claude_desktop(token, "--session", "conv-inspected")

    first = inspect(inspector, tmp_path, configuration, *refund_args(REFUND))
    retry = inspect(inspector, tmp_path, configuration, *refund_args(REFUND))

    assert first["result"]["structuredContent"]["replayed"] is False
    assert retry["result"]["structuredContent"]["replayed"] is True
    assert [r.session_id for r in audit(agent_of(token))] == ["conv-inspected"] * 2
    assert ledger.state() == (1, 1000)


def test_the_inspector_shows_the_held_text_and_then_the_outcome_once_approved(
    mcp_url: str, inspector: Path, tmp_path: Path, token: str, reviewer: User, ledger: Ledger
) -> None:
    configuration = claude_code(mcp_url, token)

    held = inspect(inspector, tmp_path, configuration, *refund_args(HELD))["result"]
    # What a person (or a model) reading the answer is told: the id to ask about.
    found = re.search(r"as confirmation (\w+) until", held["content"][0]["text"])
    assert found is not None
    confirmation_id = found.group(1)
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    status = {"confirmation_id": confirmation_id}
    outcome = inspect(
        inspector, tmp_path, configuration, *refund_args(status, "get_confirmation_status")
    )["result"]

    assert held.get("isError", False) is False
    assert held["structuredContent"]["code"] == "CONFIRMATION_REQUIRED"
    assert outcome.get("isError", False) is False
    data = outcome["structuredContent"]["data"]
    assert (data["status"], data["final"], data["result"]["code"]) == ("executed", True, "OK")
    assert ledger.state() == (1, 9000)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_inspector_shows_a_wrong_tokens_reason(
    request: pytest.FixtureRequest, inspector: Path, tmp_path: Path, token: str, transport: str
) -> None:
    if transport == "stdio":
        configuration = claude_desktop(token + "x")
    else:
        configuration = claude_code(request.getfixturevalue("mcp_url"), token + "x")

    # Any 401 starts its OAuth; --stored-auth-only makes it print the 401's reason instead.
    answer = inspect(inspector, tmp_path, configuration, "--stored-auth-only", *LIST)

    message = answer["error"]["message"]
    assert "not the token of an active agent" in message or "runs no OAuth" in message
