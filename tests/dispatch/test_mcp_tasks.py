"""Held calls as MCP tasks (protocol 2025-11-25), over streamable HTTP against a live server.

The SDK's client (2.3) has no task-augmented tools/call (its tools/call answer must be a
CallToolResult), so the call that creates a task is raw JSON-RPC, as the spec writes it; the
SDK's client then follows the task on a connection of its own with the spec's types
(tasks/get, tasks/result, tasks/cancel), which also shows that a task outlives the connection
that created it. Reviewers decide through approvals.services, as the queue does.

The in-process server is uvicorn in a thread (tests.dispatch.test_mcp's mcp_url); the restart
test runs `manage.py mcp_serve --transport http` as a process of its own (PostgreSQL only: it
must see the test database).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
import requests
from django.contrib.auth.models import Group, User
from django.utils import timezone
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from approvals.services import (
    confirmation_approve,
    confirmation_edit_approve,
    confirmation_reject,
)
from dispatch import mcp
from dispatch.mcp.tasks import NO_SUCH_TASK, RELATED_TASK_META
from dispatch.models import AnsweredTask, Confirmation, Movement
from dispatch.retention import records_prune
from tests.conftest import Ledger, MakeAgent
from tests.dispatch.test_mcp import ROOT, mcp_url, server_env
from tests.dispatch.test_throttle_processes import free_port

__all__ = ["mcp_url"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

TASKS_VERSION = "2025-11-25"
TOOLS = ["get_order", "refund_order"]
HELD_REFUND = {"order_id": "ORD-1001", "amount_cents": 6000, "currency": "BRL", "reason": "damaged"}


class RawClient:
    """A client speaking the 2025-11-25 revision as raw JSON-RPC over streamable HTTP: the
    initialize handshake, then one POST a message, its answer read as JSON or as a server-sent
    event."""

    def __init__(self, url: str, token: str, customer: str = "CUS-1") -> None:
        self.url = url
        self.http = requests.Session()
        self.http.headers.update(
            {
                "Authorization": f"Bearer {token}",
                mcp.CUSTOMER_HEADER: customer,
                "Accept": "application/json, text/event-stream",
            }
        )
        self.ids = itertools.count(1)
        self.initialize = self.request(
            "initialize",
            {
                "protocolVersion": TASKS_VERSION,
                "capabilities": {"tasks": {"cancel": {}, "requests": {}}},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        )
        self.http.headers["MCP-Protocol-Version"] = TASKS_VERSION
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message: dict[str, Any]) -> requests.Response:
        response = self.http.post(self.url, json=message, timeout=60)
        if session := response.headers.get(mcp.MCP_SESSION_HEADER):
            self.http.headers[mcp.MCP_SESSION_HEADER] = session
        return response

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request: its whole JSON-RPC message (result or error)."""
        request_id = next(self.ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        response = self.post(message)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for line in response.text.splitlines():
                if line.startswith("data:") and line[5:].strip():
                    event: dict[str, Any] = json.loads(line[5:])
                    if event.get("id") == request_id:
                        return event
            raise AssertionError(f"no answer to {method} in {response.text!r}")
        answer: dict[str, Any] = response.json()
        return answer

    def call_as_task(self, tool: str, arguments: dict[str, Any], ttl: int | None = None) -> Any:
        task = {} if ttl is None else {"ttl": ttl}
        return self.request("tools/call", {"name": tool, "arguments": arguments, "task": task})


@pytest.fixture
def reviewer(transactional_db: None) -> User:
    person = User.objects.create_user("ana", password="pw")
    person.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    return person


@pytest.fixture
def agent_token(make_agent: MakeAgent) -> str:
    return make_agent(allowed_tools=TOOLS)[1]


def follow(url: str, token: str, request: Any, result_type: Any, customer: str = "CUS-1") -> Any:
    """One request of the SDK's client (its own connection, handshake revision), its result
    validated into the spec's type, or the MCPError it raised."""

    async def run() -> Any:
        headers = {"Authorization": f"Bearer {token}", mcp.CUSTOMER_HEADER: customer}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            try:
                return await client.session.send_request(request, result_type)
            except MCPError as error:
                return error

    return anyio.run(run)


def task_get(url: str, token: str, task_id: str, customer: str = "CUS-1") -> Any:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return follow(url, token, request, types.GetTaskResult, customer)


def task_result(url: str, token: str, task_id: str) -> Any:
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    return follow(url, token, request, types.CallToolResult)


def task_cancel(url: str, token: str, task_id: str) -> Any:
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    return follow(url, token, request, types.CancelTaskResult)


def held_task(raw: RawClient) -> dict[str, Any]:
    answer = raw.call_as_task("refund_order", HELD_REFUND)
    task: dict[str, Any] = answer["result"]["task"]
    return task


# Declared, and today's answer for who does not ask ---------------------------------------------


def test_the_server_declares_tasks_and_its_tools_take_them(mcp_url: str, agent_token: str) -> None:
    raw = RawClient(mcp_url, agent_token)

    tools = raw.request("tools/list", {})["result"]["tools"]

    capabilities = raw.initialize["result"]["capabilities"]
    assert capabilities["tasks"] == {"cancel": {}, "requests": {"tools": {"call": {}}}}
    assert {tool["execution"]["taskSupport"] for tool in tools} == {"optional"}


def test_a_call_that_asks_for_no_task_gets_todays_answer(
    mcp_url: str, agent_token: str, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)

    answer = raw.request("tools/call", {"name": "refund_order", "arguments": HELD_REFUND})

    result = answer["result"]
    assert "task" not in result
    assert result["structuredContent"]["code"] == "CONFIRMATION_REQUIRED"
    assert result["isError"] is False
    assert not AnsweredTask.objects.exists()
    assert ledger.state() == (0, 0)


# A held call's task follows its confirmation ---------------------------------------------------


def test_a_held_call_as_a_task_completes_with_its_result_once_approved(
    mcp_url: str, agent_token: str, reviewer: User, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)
    assert task["status"] == "working" and task["ttl"] is None and task["pollInterval"]
    assert Confirmation.objects.filter(pk=task["taskId"], status="pending").exists()
    waiting = task_get(mcp_url, agent_token, task["taskId"])
    assert (waiting.status, waiting.task_id) == ("working", task["taskId"])

    confirmation_approve(confirmation_id=task["taskId"], reviewer=reviewer)

    done = task_get(mcp_url, agent_token, task["taskId"])
    assert done.status == "completed"
    result = task_result(mcp_url, agent_token, task["taskId"])
    assert result.is_error is False
    assert result.structured_content["ok"] is True
    assert result.structured_content["code"] == "OK"
    assert result.meta[RELATED_TASK_META] == {"taskId": task["taskId"]}
    # The same result the API gives for the confirmation.
    assert result.structured_content == Confirmation.objects.get(pk=task["taskId"]).result
    assert ledger.state() == (1, 6000)


def test_a_task_follows_the_call_a_reviewer_edited_under_the_id_the_client_knows(
    mcp_url: str, agent_token: str, reviewer: User, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)

    edited = confirmation_edit_approve(
        confirmation_id=task["taskId"], reviewer=reviewer, changes={"amount_cents": 4000}
    )

    done = task_get(mcp_url, agent_token, task["taskId"])
    assert (done.status, done.task_id) == ("completed", task["taskId"])
    result = task_result(mcp_url, agent_token, task["taskId"])
    assert result.structured_content == Confirmation.objects.get(pk=edited.pk).result
    assert result.meta[RELATED_TASK_META] == {"taskId": task["taskId"]}
    assert ledger.state() == (1, 4000)


def test_a_rejected_task_fails_with_the_rejection_and_its_code(
    mcp_url: str, agent_token: str, reviewer: User, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)

    confirmation_reject(confirmation_id=task["taskId"], reviewer=reviewer, reason="not damaged")

    rejected = task_get(mcp_url, agent_token, task["taskId"])
    assert rejected.status == "failed"
    assert rejected.status_message == "not damaged"
    result = task_result(mcp_url, agent_token, task["taskId"])
    assert result.is_error is True
    assert result.structured_content["code"] == "CONFIRMATION_REJECTED"
    assert "not damaged" in result.content[0].text
    assert ledger.state() == (0, 0)


def test_an_expired_task_fails_with_expired(mcp_url: str, agent_token: str, ledger: Ledger) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)

    Confirmation.objects.filter(pk=task["taskId"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert task_get(mcp_url, agent_token, task["taskId"]).status == "failed"
    result = task_result(mcp_url, agent_token, task["taskId"])
    assert result.is_error is True
    assert result.structured_content["code"] == "EXPIRED"
    assert result.structured_content["data"]["status"] == "expired"
    assert ledger.state() == (0, 0)


def test_cancelling_a_waiting_task_withdraws_its_held_call(
    mcp_url: str, agent_token: str, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)

    cancelled = task_cancel(mcp_url, agent_token, task["taskId"])

    assert cancelled.status == "cancelled"
    confirmation = Confirmation.objects.get(pk=task["taskId"])
    assert confirmation.status == "withdrawn"
    assert not Movement.objects.filter(key=confirmation.execution_key, released_at=None).exists()
    result = task_result(mcp_url, agent_token, task["taskId"])
    assert (result.is_error, result.structured_content["code"]) == (True, "WITHDRAWN")
    assert ledger.state() == (0, 0)


# Bad input: a clear error, nothing moves, nothing leaks ----------------------------------------


def test_cancelling_after_a_reviewer_approved_is_refused_and_moves_nothing(
    mcp_url: str, agent_token: str, reviewer: User, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)
    confirmation_approve(confirmation_id=task["taskId"], reviewer=reviewer)

    refused = raw.request("tasks/cancel", {"taskId": task["taskId"]})

    assert refused["error"]["code"] == types.INVALID_PARAMS
    assert refused["error"]["data"] == {"code": "already_approved"}
    assert "approved" in refused["error"]["message"]
    assert Confirmation.objects.get(pk=task["taskId"]).status == "executed"
    assert ledger.state() == (1, 6000)


def test_another_agents_customers_unknown_or_malformed_task_is_the_same_error(
    mcp_url: str, agent_token: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    raw = RawClient(mcp_url, agent_token)
    task = held_task(raw)
    answered = raw.call_as_task("get_order", {"order_id": "ORD-1001"})["result"]["task"]
    other_agent = RawClient(mcp_url, make_agent(allowed_tools=TOOLS)[1])
    other_customer = RawClient(mcp_url, agent_token, customer="CUS-2")

    errors = [
        client.request(method, {"taskId": task_id})["error"]
        for client in (other_agent, other_customer)
        for task_id in (task["taskId"], answered["taskId"])
        for method in ("tasks/get", "tasks/result", "tasks/cancel")
    ] + [
        raw.request(method, {"taskId": task_id})["error"]
        for task_id in ("0123456789abcdef0123456789abcdef", "answered-00", "a b/../c", "x" * 500)
        for method in ("tasks/get", "tasks/result", "tasks/cancel")
    ]

    assert {(error["code"], error["message"]) for error in errors} == {
        (types.INVALID_PARAMS, NO_SUCH_TASK)
    }
    assert task["taskId"] not in json.dumps(errors)
    assert Confirmation.objects.get(pk=task["taskId"]).status == "pending"
    assert raw.request("tasks/get", {})["error"]["code"] == types.INVALID_PARAMS
    assert raw.request("tasks/get", {"taskId": 7})["error"]["code"] == types.INVALID_PARAMS
    assert ledger.state() == (0, 0)


# Tasks answered at once, kept for their ttl ------------------------------------------------------


def test_a_call_answered_at_once_is_a_task_kept_for_its_ttl(mcp_url: str, agent_token: str) -> None:
    raw = RawClient(mcp_url, agent_token)

    read = raw.call_as_task("get_order", {"order_id": "ORD-1001"}, ttl=60_000)["result"]["task"]
    refused = raw.call_as_task("refund_order", {"order_id": "ORD-1001"})["result"]["task"]

    assert (read["status"], read["ttl"]) == ("completed", 60_000)
    assert refused["status"] == "failed"
    result = task_result(mcp_url, agent_token, read["taskId"])
    assert result.structured_content["ok"] is True
    assert result.meta[RELATED_TASK_META] == {"taskId": read["taskId"]}
    failed = task_result(mcp_url, agent_token, refused["taskId"])
    assert (failed.is_error, failed.structured_content["code"]) == (True, "INVALID_ARGUMENTS")
    cancel = raw.request("tasks/cancel", {"taskId": read["taskId"]})["error"]
    assert cancel["code"] == types.INVALID_PARAMS and "already completed" in cancel["message"]
    assert cancel["data"] == {"code": "already_decided"}


def test_a_task_past_its_ttl_is_answered_as_unknown_and_pruned(
    mcp_url: str, agent_token: str
) -> None:
    raw = RawClient(mcp_url, agent_token)
    short = raw.call_as_task("get_order", {"order_id": "ORD-1001"}, ttl=1)["result"]["task"]
    time.sleep(0.05)

    error = raw.request("tasks/get", {"taskId": short["taskId"]})["error"]

    assert (error["code"], error["message"]) == (types.INVALID_PARAMS, NO_SUCH_TASK)
    assert records_prune().tasks == 1
    assert not AnsweredTask.objects.exists()


# The server stops and starts again -------------------------------------------------------------


@pytest.fixture
def serve(transactional_db: None) -> Iterator[Any]:
    """Start `manage.py mcp_serve --transport http` on a free port; returns its URL."""
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "manage.py", "mcp_serve", "--transport", "http", "--port", str(port)],
            cwd=ROOT,
            env={**server_env(None), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}{mcp.HTTP_PATH}"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "mcp_serve ended"
            try:
                requests.get(url, timeout=1)
                return url, process
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "mcp_serve did not start"
                time.sleep(0.1)

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_a_task_outlives_the_server_process(
    serve: Any, agent_token: str, reviewer: User, ledger: Ledger
) -> None:
    url, first = serve()
    task = held_task(RawClient(url, agent_token))
    first.kill()
    first.wait(timeout=10)

    url, _ = serve()
    waiting = task_get(url, agent_token, task["taskId"])
    confirmation_approve(confirmation_id=task["taskId"], reviewer=reviewer)

    assert waiting.status == "working"
    assert task_get(url, agent_token, task["taskId"]).status == "completed"
    result = task_result(url, agent_token, task["taskId"])
    assert result.structured_content["ok"] is True
    assert ledger.state() == (1, 6000)


def test_a_call_refused_on_the_hosts_side_keeps_no_task(mcp_url: str, agent_token: str) -> None:
    raw = RawClient(mcp_url, agent_token, customer="not a customer id")

    answer = raw.call_as_task("get_order", {"order_id": "ORD-1001"})

    assert "task" not in answer["result"]
    assert answer["result"]["structuredContent"]["code"] == "customer_invalid"
    assert not AnsweredTask.objects.exists()


def test_over_stdio_a_held_call_is_a_task_too(agent_token: str, reviewer: User) -> None:
    server = subprocess.Popen(
        [sys.executable, "manage.py", "mcp_serve", "--customer", "CUS-1", "--session", "conv-1"],
        cwd=ROOT,
        env=server_env(agent_token),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None and server.stdout is not None
    ids = itertools.count(1)

    def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        server.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
        server.stdin.flush()  # type: ignore[union-attr]
        while True:
            answer: dict[str, Any] = json.loads(server.stdout.readline())  # type: ignore[union-attr]
            if answer.get("id") == request_id:
                return answer

    try:
        init = request(
            "initialize",
            {
                "protocolVersion": TASKS_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        )
        server.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        server.stdin.flush()
        arguments = {"name": "refund_order", "arguments": HELD_REFUND, "task": {}}
        task = request("tools/call", arguments)["result"]["task"]
        confirmation_approve(confirmation_id=task["taskId"], reviewer=reviewer)
        done = request("tasks/get", {"taskId": task["taskId"]})["result"]
        result = request("tasks/result", {"taskId": task["taskId"]})["result"]
    finally:
        server.stdin.close()
        server.wait(timeout=30)

    assert "tasks" in init["result"]["capabilities"]
    assert (task["status"], done["status"]) == ("working", "completed")
    assert result["structuredContent"]["ok"] is True
