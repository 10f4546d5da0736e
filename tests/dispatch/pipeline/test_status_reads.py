"""Reads of a held call's status (ToolSpec.watches) on the in-memory store: free while the call
waits for a human, counted as every call once it is decided, and for anything but the agent's and
customer's own waiting confirmation."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from dispatch.pipeline import InMemoryState
from dispatch.pipeline.codes import Code
from dispatch.pipeline.tools import ExecutionContext, Refused, Rejection, ToolSpec
from tests.dispatch.pipeline.conftest import Harness, build_harness, default_policy

NOT_FOUND = Code("CONFIRMATION_NOT_FOUND", 5, "No such confirmation.", True, False)
STATUS = "watch_status"


class StatusArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    confirmation_id: str


def status_tool(state: InMemoryState) -> ToolSpec[StatusArguments]:
    """The in-memory twin of get_confirmation_status: the agent's and customer's own only."""

    def status(arguments: StatusArguments, context: ExecutionContext) -> Mapping[str, Any]:
        held = state.confirmations.get(arguments.confirmation_id)
        if held is None or (held.agent_id, held.customer_id) != (
            context.agent_id,
            context.customer_id,
        ):
            raise Refused(Rejection(NOT_FOUND, "confirmation_id: no such confirmation"))
        return {"status": held.status}

    return ToolSpec(
        name=STATUS,
        description="A held call's status.",
        arguments=StatusArguments,
        handler=status,
        codes=(NOT_FOUND,),
        watches="confirmation_id",
    )


@pytest.fixture
def watched() -> Harness:
    harness = build_harness()
    harness.pipeline.registry.register(status_tool(harness.state))
    # A small budget and the default repeat limit (3): ten reads pass both.
    harness.policy = default_policy(
        allowed_tools=frozenset({"get_order", "refund_order", STATUS}), step_budget=4
    )
    return harness


def _steps(harness: Harness, session: str = "s-1", agent: str = "agent-1") -> int:
    return harness.state.sessions[agent, session][1]


def _decide(harness: Harness, confirmation_id: str, status: str) -> None:
    held = harness.state.confirmations[confirmation_id]
    harness.state.confirmations[confirmation_id] = held._replace(status=status)


def _poll(harness: Harness, confirmation_id: str, **extra: Any) -> Any:
    return harness.call(STATUS, {"confirmation_id": confirmation_id}, **extra)


def test_reading_a_waiting_call_past_both_limits_costs_nothing(watched: Harness) -> None:
    held = watched.refund(8000)
    confirmation_id = held.data["confirmation_id"]

    polls = [_poll(watched, confirmation_id) for _ in range(12)]

    assert held.code == "CONFIRMATION_REQUIRED"
    assert [poll.code for poll in polls] == ["OK"] * 12
    assert {poll.data["status"] for poll in polls} == {"pending"}
    # The refund was the session's only step; the reads' key was never used.
    assert _steps(watched) == 1
    assert [record.attempts for record in watched.state.keys.values()] == [1, 0]
    assert watched.ledger_rows == 0


def test_once_decided_reads_count_again_and_answer_the_outcome(watched: Harness) -> None:
    confirmation_id = watched.refund(8000).data["confirmation_id"]
    for _ in range(5):
        _poll(watched, confirmation_id)
    _decide(watched, confirmation_id, "executed")

    answers = [_poll(watched, confirmation_id) for _ in range(4)]

    assert answers[0].ok and answers[0].data == {"status": "executed"}
    # The refund and three reads fill the budget of four.
    assert [answer.code for answer in answers] == ["OK", "OK", "OK", "STEP_LIMIT"]
    assert _steps(watched) == 5


def test_a_decided_call_read_again_and_again_loops(watched: Harness) -> None:
    watched.policy = default_policy(allowed_tools=watched.policy.allowed_tools)
    confirmation_id = watched.refund(8000).data["confirmation_id"]
    _decide(watched, confirmation_id, "rejected")

    answers = [_poll(watched, confirmation_id).code for _ in range(4)]

    assert answers == ["OK", "OK", "OK", "LOOP_DETECTED"]


def test_an_expired_confirmation_is_read_as_any_call(watched: Harness) -> None:
    confirmation_id = watched.refund(8000).data["confirmation_id"]
    watched.clock.now += timedelta(hours=2)

    answers = [_poll(watched, confirmation_id).code for _ in range(4)]

    assert answers == ["OK", "OK", "OK", "STEP_LIMIT"]
    assert _steps(watched) == 5


def test_a_read_of_another_customers_or_agents_confirmation_counts(watched: Harness) -> None:
    confirmation_id = watched.refund(8000).data["confirmation_id"]

    other_customer = [
        _poll(watched, confirmation_id, customer="CUS-2", session="s-2").code for _ in range(4)
    ]
    other_agent = [_poll(watched, confirmation_id, agent="agent-2").code for _ in range(4)]

    assert other_customer == ["CONFIRMATION_NOT_FOUND"] * 3 + ["LOOP_DETECTED"]
    assert other_agent == ["CONFIRMATION_NOT_FOUND"] * 3 + ["LOOP_DETECTED"]
    assert _steps(watched, "s-2") == 4
    assert _steps(watched, agent="agent-2") == 4


def test_a_read_of_an_unknown_confirmation_counts(watched: Harness) -> None:
    answers = [_poll(watched, "f" * 32).code for _ in range(5)]

    assert answers == ["CONFIRMATION_NOT_FOUND"] * 3 + ["LOOP_DETECTED", "STEP_LIMIT"]


def test_a_spent_session_still_learns_what_it_waits_for(watched: Harness) -> None:
    confirmation_id = watched.refund(8000).data["confirmation_id"]
    spent = [watched.call("get_order", {"order_id": f"ORD-{n}"}) for n in range(4)]

    poll = _poll(watched, confirmation_id)
    order = watched.call("get_order", {"order_id": "ORD-1001"})

    assert spent[-1].code == "STEP_LIMIT"
    assert poll.ok and poll.data == {"status": "pending"}
    assert order.code == "STEP_LIMIT"


def test_a_new_conversation_reads_its_customers_waiting_call_for_free(watched: Harness) -> None:
    confirmation_id = watched.refund(8000).data["confirmation_id"]

    answers = [_poll(watched, confirmation_id, session="s-new").code for _ in range(6)]

    assert answers == ["OK"] * 6
    assert _steps(watched, "s-new") == 0


def test_the_held_text_says_how_to_learn_the_outcome(watched: Harness) -> None:
    held = watched.refund(8000)

    assert "get_confirmation_status" in held.model_text
    assert held.data["confirmation_id"] in held.model_text
