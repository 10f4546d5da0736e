"""toolgate_client.aio against a live server: the same typed results and exceptions as the sync
client, and a held refund awaited while a reviewer approves it over the approvals API."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Group, User
from pytest_django.live_server_helper import LiveServer

from approvals.reviewers import REVIEWERS_GROUP, reviewer_token_create
from tests.conftest import Ledger, MakeAgent
from toolgate_client import (
    AuthenticationError,
    CallResult,
    ConnectionFailedError,
    MalformedRequestError,
    WaitTimeoutError,
)
from toolgate_client.aio import AsyncToolgate

pytestmark = pytest.mark.usefixtures("orders")

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}
HELD_REFUND = {**REFUND, "amount_cents": 6000}


@pytest.fixture
def token(make_agent: MakeAgent) -> str:
    return make_agent()[1]


@pytest.fixture
def reviewer_token(db: None) -> str:
    user = User.objects.create_user("rita", password="pw-rita")
    user.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    return reviewer_token_create(user=user)


def client(live_server: LiveServer, token: str | None) -> AsyncToolgate:
    return AsyncToolgate(live_server.url, token, session_id="a-1", customer_id="CUS-1")


def test_a_call_answers_a_typed_result(live_server: LiveServer, token: str, ledger: Ledger) -> None:
    async def scenario() -> tuple[CallResult, CallResult, list[dict[str, Any]]]:
        async with client(live_server, token) as toolgate:
            first = await toolgate.call("refund_order", json.dumps(REFUND))
            again = await toolgate.call("refund_order", json.dumps(REFUND))
            tools = await toolgate.tools(format="openai")
            return first, again, tools

    first, again, tools = asyncio.run(scenario())

    assert (first.ok, first.code, first.replayed, first.data["amount_cents"]) == (
        True,
        "OK",
        False,
        1000,
    )
    assert (again.ok, again.replayed) == (True, True)
    assert {tool["function"]["name"] for tool in tools} >= {"refund_order"}
    assert ledger.state() == (1, 1000)


def test_a_refusal_is_a_result_and_a_bad_token_an_exception(
    live_server: LiveServer, token: str, ledger: Ledger
) -> None:
    async def scenario() -> tuple[CallResult, Exception, Exception]:
        async with client(live_server, token) as toolgate:
            floated = await toolgate.call("refund_order", '{"order_id": "ORD-1001", "x": 1.5}')
            try:
                await toolgate.tools(format="not-a-format")
            except MalformedRequestError as error:
                malformed: Exception = error
        async with client(live_server, "tg_not_a_token") as stranger:
            try:
                await stranger.tools()
            except AuthenticationError as error:
                return floated, malformed, error
        raise AssertionError("a bad token was served")

    floated, malformed, refused = asyncio.run(scenario())

    assert (floated.ok, floated.code) == (False, "INVALID_ARGUMENTS")
    assert isinstance(malformed, MalformedRequestError) and malformed.status == 400
    assert isinstance(refused, AuthenticationError) and refused.status == 401
    assert ledger.state() == (0, 0)


def test_wait_awaits_the_approval_of_a_held_refund_and_its_result(
    live_server: LiveServer, token: str, reviewer_token: str, ledger: Ledger
) -> None:
    async def scenario() -> tuple[Any, int]:
        async def approve_while_waiting(seconds: float) -> None:
            if not approvals:
                async with httpx.AsyncClient() as reviewer:
                    answer = await reviewer.post(
                        f"{live_server.url}/api/v1/confirmations/{held.confirmation_id}/approve",
                        headers={"Authorization": f"Token {reviewer_token}"},
                    )
                approvals.append(answer.status_code)
            await asyncio.sleep(seconds)

        approvals: list[int] = []
        async with client(live_server, token) as toolgate:
            held = await toolgate.call("refund_order", HELD_REFUND)
            assert held.held and held.confirmation_id is not None
            final = await toolgate.wait(
                held.confirmation_id, timeout=30, interval=0.2, sleep=approve_while_waiting
            )
        return final, approvals[0]

    final, approved = asyncio.run(scenario())

    assert approved == 200
    assert (final.status, final.final) == ("executed", True)
    assert final.result is not None and final.result.ok is True
    assert ledger.state() == (1, 6000)


def test_wait_gives_up_after_its_timeout_with_the_last_state(
    live_server: LiveServer, token: str, ledger: Ledger
) -> None:
    async def scenario() -> WaitTimeoutError:
        async with client(live_server, token) as toolgate:
            held = await toolgate.call("refund_order", HELD_REFUND)
            assert held.confirmation_id is not None
            try:
                await toolgate.wait(held.confirmation_id, timeout=0.3, interval=0.1)
            except WaitTimeoutError as error:
                return error
        raise AssertionError("the wait did not time out")

    timed_out = asyncio.run(scenario())

    assert timed_out.confirmation.status == "pending"
    assert ledger.state() == (0, 0)


def test_a_server_that_is_not_there_is_a_retryable_connection_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]

    async def scenario() -> ConnectionFailedError:
        async with AsyncToolgate(f"http://127.0.0.1:{port}", "tg_x", customer_id="C") as tg:
            try:
                await tg.tools()
            except ConnectionFailedError as error:
                return error
        raise AssertionError("nothing answered, yet no error")

    error = asyncio.run(scenario())

    assert (error.code, error.retryable) == ("connection_failed", True)
