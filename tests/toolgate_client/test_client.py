"""toolgate_client against a live server: typed results, the envelope errors as exceptions, and
a held refund waited for while a reviewer decides it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, User
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from approvals.reviewers import REVIEWERS_GROUP
from approvals.services import confirmation_approve, confirmation_reject
from dispatch.models import AuditRecord
from tests.conftest import Ledger, MakeAgent
from toolgate_client import (
    AuthenticationError,
    CallResult,
    ConflictError,
    ConnectionFailedError,
    MalformedRequestError,
    NotFoundError,
    ThrottledError,
    Toolgate,
    WaitTimeoutError,
)

pytestmark = pytest.mark.usefixtures("orders")

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}
HELD_REFUND = {**REFUND, "amount_cents": 6000}


@pytest.fixture
def toolgate(live_server: LiveServer, make_agent: MakeAgent) -> Iterator[Toolgate]:
    with Toolgate(live_server.url, make_agent()[1], session_id="c-1", customer_id="CUS-1") as tg:
        yield tg


@pytest.fixture
def reviewer(db: None) -> User:
    user = User.objects.create_user("rita", password="pw-rita")
    user.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    return user


def test_a_call_answers_a_typed_result(toolgate: Toolgate, ledger: Ledger) -> None:
    result = toolgate.call("refund_order", json.dumps(REFUND))

    assert isinstance(result, CallResult)
    assert (result.ok, result.code, result.tool, result.replayed) == (
        True,
        "OK",
        "refund_order",
        False,
    )
    assert result.data["amount_cents"] == 1000
    assert result.model_text.startswith("OK refund_order: ")
    assert result.confirmation_id is None
    assert ledger.state() == (1, 1000)


def test_a_rejected_call_is_a_result_with_its_hint_not_an_exception(
    toolgate: Toolgate, ledger: Ledger
) -> None:
    result = toolgate.call("refund_order", json.dumps({**REFUND, "amount_cents": 25.90}))

    assert (result.ok, result.code, result.retryable) == (False, "INVALID_ARGUMENTS", False)
    assert "such as 2590 for 25.90" in result.model_text
    assert ledger.state() == (0, 0)


def test_the_same_call_again_is_a_replay_that_moves_no_money(
    toolgate: Toolgate, ledger: Ledger
) -> None:
    first = toolgate.call("refund_order", REFUND)

    again = toolgate.call("refund_order", json.dumps(REFUND, indent=2))

    assert again.replayed is True
    assert again.data == first.data
    assert ledger.state() == (1, 1000)


def test_tools_lists_the_agents_tools_in_each_format(toolgate: Toolgate) -> None:
    neutral = toolgate.tools()
    openai = toolgate.tools("openai")
    anthropic = toolgate.tools(format="anthropic")

    assert sorted(tool["name"] for tool in neutral) == ["get_order", "refund_order"]
    assert sorted(tool["function"]["name"] for tool in openai) == ["get_order", "refund_order"]
    assert all(set(tool) <= {"name", "description", "input_schema", "strict"} for tool in anthropic)


def test_an_unknown_format_raises_the_400_with_the_apis_message(toolgate: Toolgate) -> None:
    with pytest.raises(MalformedRequestError) as raised:
        toolgate.tools("gemini")

    assert raised.value.status == 400
    assert "must be one of anthropic, neutral, openai" in raised.value.message
    assert raised.value.retryable is False


def test_a_bad_token_raises_an_authentication_error(
    live_server: LiveServer, ledger: Ledger
) -> None:
    toolgate = Toolgate(live_server.url, "tg_not_a_token", customer_id="CUS-1")

    with pytest.raises(AuthenticationError) as raised:
        toolgate.call("refund_order", REFUND)

    assert raised.value.status == 401
    assert raised.value.code
    assert ledger.state() == (0, 0)


def test_a_malformed_envelope_raises_and_reaches_no_pipeline(
    toolgate: Toolgate, ledger: Ledger
) -> None:
    with pytest.raises(MalformedRequestError) as raised:
        toolgate.call("refund_order", REFUND, session_id="not a session id!")

    assert (raised.value.status, raised.value.code) == (400, "malformed_envelope")
    assert "session_id" in raised.value.message
    assert AuditRecord.objects.count() == 0
    assert ledger.state() == (0, 0)


def test_a_session_of_another_customer_raises_a_conflict(toolgate: Toolgate) -> None:
    toolgate.call("get_order", {"order_id": "ORD-1001"})

    with pytest.raises(ConflictError) as raised:
        toolgate.call("get_order", {"order_id": "ORD-1002"}, customer_id="CUS-2")

    assert raised.value.status == 409


def test_a_confirmation_of_no_one_raises_not_found(toolgate: Toolgate) -> None:
    with pytest.raises(NotFoundError) as raised:
        toolgate.confirmation("0" * 32)

    assert raised.value.status == 404


def test_an_agent_token_cannot_approve_its_own_call(toolgate: Toolgate, ledger: Ledger) -> None:
    held = toolgate.call("refund_order", HELD_REFUND)
    assert held.confirmation_id is not None

    response = toolgate.request("POST", f"/api/v1/confirmations/{held.confirmation_id}/approve")

    assert response.status_code == 403
    assert response.json()["error"]["status"] == 403
    assert toolgate.confirmation(held.confirmation_id).status == "pending"
    assert ledger.state() == (0, 0)


def test_throttling_raises_with_how_long_to_wait(toolgate: Toolgate, settings: Settings) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "2/min"
    toolgate.codes()
    toolgate.codes()

    with pytest.raises(ThrottledError) as raised:
        toolgate.codes()

    assert raised.value.status == 429
    assert raised.value.retryable is True
    assert raised.value.retry_after is not None and raised.value.retry_after > 0


def test_a_server_that_is_not_there_raises_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    toolgate = Toolgate(f"http://127.0.0.1:{port}", "tg_x", customer_id="CUS-1", timeout=5)

    with pytest.raises(ConnectionFailedError) as raised:
        toolgate.codes()

    assert (raised.value.status, raised.value.code) == (0, "connection_failed")


def test_an_answer_that_is_not_the_apis_raises_with_its_status(live_server: LiveServer) -> None:
    # A base URL that is not Toolgate's: Django's own HTML 404, as a proxy's page would be.
    toolgate = Toolgate(f"{live_server.url}/elsewhere", "tg_x", customer_id="CUS-1")

    with pytest.raises(NotFoundError) as raised:
        toolgate.codes()

    assert (raised.value.status, raised.value.code) == (404, "unexpected_answer")
    assert "/elsewhere/api/v1/codes" in raised.value.message


def test_a_call_without_a_customer_is_refused_before_it_is_sent(live_server: LiveServer) -> None:
    toolgate = Toolgate(live_server.url, "tg_x")

    with pytest.raises(ValueError, match="customer_id"):
        toolgate.call("get_order", {"order_id": "ORD-1001"})


def test_wait_sees_the_approval_of_a_held_refund_and_its_result(
    toolgate: Toolgate, reviewer: User, ledger: Ledger
) -> None:
    held = toolgate.call("refund_order", json.dumps(HELD_REFUND))
    assert (held.held, held.ok) == (True, False)
    assert held.confirmation_id is not None
    pending = toolgate.confirmation(held.confirmation_id)
    assert (pending.status, pending.final, pending.result) == ("pending", False, None)
    naps: list[float] = []

    def approve_while_waiting(seconds: float) -> None:
        # The reviewer decides while the agent host waits between two polls.
        if not naps:
            confirmation_approve(confirmation_id=str(held.confirmation_id), reviewer=reviewer)
        naps.append(seconds)

    final = toolgate.wait(
        held.confirmation_id, timeout=30, interval=0.5, sleep=approve_while_waiting
    )

    assert naps == [0.5]
    assert (final.status, final.final) == ("executed", True)
    assert final.result is not None and final.result.ok is True
    assert final.model_text == final.result.model_text
    assert final.arguments == HELD_REFUND
    assert ledger.state() == (1, 6000)


def test_wait_returns_a_rejection_with_the_reviewers_reason(
    toolgate: Toolgate, reviewer: User, ledger: Ledger
) -> None:
    held = toolgate.call("refund_order", HELD_REFUND)
    assert held.confirmation_id is not None
    confirmation_reject(
        confirmation_id=held.confirmation_id, reviewer=reviewer, reason="not damaged"
    )

    final = toolgate.wait(held.confirmation_id, timeout=5)

    assert final.status == "rejected"
    assert final.decision_reason == "not damaged"
    assert "not damaged" in final.model_text
    assert ledger.state() == (0, 0)


def test_wait_gives_up_after_its_timeout_with_the_last_state(
    toolgate: Toolgate, ledger: Ledger
) -> None:
    held = toolgate.call("refund_order", HELD_REFUND)
    assert held.confirmation_id is not None

    with pytest.raises(WaitTimeoutError) as raised:
        toolgate.wait(held.confirmation_id, timeout=0.3, interval=0.1)

    assert raised.value.confirmation.status == "pending"
    assert isinstance(raised.value, TimeoutError)
    assert ledger.state() == (0, 0)
