"""The figures against small hand-computed cases, counted live as calls are written, and the same
after a rebuild from the audit records."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dispatch.metrics import (
    audit_in_session_order,
    call_figures,
    policy_what_if,
    recovery_rate,
    rollups_from_audit,
    rollups_live,
)
from dispatch.models import Agent
from dispatch.pipeline.what_if import AUTO_EXECUTED, TWO_REVIEWERS, Tally, draft_of
from dispatch.services import call_dispatch
from tests.conftest import MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

GOOD_READ = {"order_id": "ORD-1001"}
BAD_READ = {"order_id": 1001}  # INVALID_ARGUMENTS, which the model can fix
UNKNOWN_ORDER = {"order_id": "ORD-9999"}  # ORDER_NOT_FOUND, which it cannot
REFUND = {"order_id": "ORD-1001", "currency": "BRL", "reason": "damaged"}
HELD_REFUND = {**REFUND, "amount_cents": 9_000}
BAD_REFUND = {**REFUND, "amount_cents": 90.0}


def send(agent: Agent, session: str, tool: str, arguments: object) -> str:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool=tool,
        arguments=json.dumps(arguments),
    ).code


def figures() -> dict[str, object]:
    now = timezone.now()
    return call_figures(since=now - timedelta(hours=2), until=now + timedelta(hours=1)).as_dict()


def test_rejected_is_not_ok_and_not_held(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    codes = [
        send(agent, "s-1", "get_order", GOOD_READ),
        send(agent, "s-1", "get_order", BAD_READ),
        send(agent, "s-1", "refund_order", HELD_REFUND),
        send(agent, "s-1", "get_order", UNKNOWN_ORDER),
    ]

    total = figures()["total"]

    assert codes == ["OK", "INVALID_ARGUMENTS", "CONFIRMATION_REQUIRED", "ORDER_NOT_FOUND"]
    assert isinstance(total, dict)
    assert (total["calls"], total["rejected"], total["rejection_rate"]) == (4, 2, 0.5)


def test_a_fix_within_the_next_three_calls_recovers(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    send(agent, "s-1", "refund_order", BAD_REFUND)  # another tool: does not fix the read
    send(agent, "s-1", "get_order", GOOD_READ)

    by_code = figures()["by_code"]

    assert isinstance(by_code, dict)
    assert by_code["INVALID_ARGUMENTS"]["correctable"] == 2
    assert by_code["INVALID_ARGUMENTS"]["recovered"] == 1
    assert by_code["INVALID_ARGUMENTS"]["recovery_rate"] == 0.5


def test_a_fix_after_three_other_calls_does_not_count(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    for _ in range(3):
        send(agent, "s-1", "refund_order", BAD_REFUND)
    send(agent, "s-1", "get_order", GOOD_READ)

    by_tool = figures()["by_tool"]

    assert isinstance(by_tool, dict)
    assert by_tool["get_order"]["correctable"] == 1
    assert by_tool["get_order"]["recovered"] == 0


def test_a_fix_in_another_session_does_not_count(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    send(agent, "s-2", "get_order", GOOD_READ)

    total = figures()["total"]

    assert isinstance(total, dict)
    assert (total["correctable"], total["recovered"]) == (1, 0)


def test_a_fix_held_for_confirmation_counts(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "refund_order", BAD_REFUND)
    code = send(agent, "s-1", "refund_order", HELD_REFUND)

    by_tool = figures()["by_tool"]

    assert code == "CONFIRMATION_REQUIRED"
    assert isinstance(by_tool, dict)
    assert by_tool["refund_order"]["recovery_rate"] == 1.0


def test_a_rejection_the_model_cannot_fix_is_not_in_the_denominator(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent(allowed_tools=["get_order"])
    code = send(agent, "s-1", "refund_order", HELD_REFUND)
    send(agent, "s-1", "get_order", GOOD_READ)

    total = figures()["total"]

    assert code == "TOOL_NOT_ALLOWED"
    assert isinstance(total, dict)
    assert (total["rejected"], total["correctable"], total["recovery_rate"]) == (1, 0, None)


def test_loops_replays_and_step_limits_are_counted_per_tool(make_agent: MakeAgent) -> None:
    agent, _ = make_agent(step_budget=6, repeat_limit=2)
    small = {**HELD_REFUND, "amount_cents": 1_000}
    for _ in range(3):
        send(agent, "s-1", "refund_order", small)  # OK, replayed, LOOP_DETECTED
    for order_id in ("ORD-1001", "ORD-1002", "ORD-9999", "ORD-1003"):
        # Three within the budget of 6 steps, then STEP_LIMIT.
        send(agent, "s-1", "get_order", {"order_id": order_id})

    result = figures()

    assert result["replays_by_tool"] == {"get_order": 0, "refund_order": 1}
    assert result["loop_detections_by_tool"] == {"refund_order": 1}
    assert result["step_limits_by_tool"] == {"get_order": 1}


def test_the_rebuild_agrees_with_the_live_rollups(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    for session in ("s-1", "s-2"):
        send(agent, session, "get_order", BAD_READ)
        send(agent, session, "refund_order", BAD_REFUND)
        send(agent, session, "get_order", GOOD_READ)
        send(agent, session, "refund_order", HELD_REFUND)
    live = rollups_live()

    rebuilt, waiting = rollups_from_audit(audit_in_session_order())
    out = StringIO()
    call_command("rebuild_rollups", "--check", stdout=out)

    assert rebuilt == live
    assert waiting == []
    assert "agree" in out.getvalue()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL: concurrent writers"
)
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_count_every_call_once_and_a_rebuild_agrees(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent(step_budget=200, repeat_limit=200)
    barrier = threading.Barrier(8)

    def session(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            # Each session's calls one after another, as an agent sends them; the sessions at once.
            for round_ in range(5):
                send(agent, f"s-{index}", "get_order", BAD_READ)
                send(agent, f"s-{index}", "get_order", GOOD_READ)
                send(agent, f"s-{index}-{round_}", "refund_order", BAD_REFUND)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(session, range(8)))
    live = rollups_live()
    out = StringIO()

    call_command("rebuild_rollups", stdout=out)

    assert sum(row[0] for row in live.values()) == 8 * 5 * 3
    assert rollups_live() == live
    assert "Rebuilt" in out.getvalue()


def test_the_what_if_reads_the_records_and_writes_nothing(make_agent: MakeAgent) -> None:
    agent, _ = make_agent(two_reviewers_from_cents=5_500)
    send(agent, "s-1", "refund_order", {**REFUND, "amount_cents": 3_000})
    send(agent, "s-2", "refund_order", {**REFUND, "amount_cents": 1_500})
    send(agent, "s-3", "refund_order", {**REFUND, "amount_cents": 6_000})
    send(agent, "s-3", "refund_order", {**REFUND, "amount_cents": 6_000})  # a replay: not judged
    send(agent, "s-4", "get_order", GOOD_READ)  # moves no money: not judged
    assert agent.current_policy is not None
    draft = draft_of(
        agent.current_policy.snapshot(),
        {"auto_approve_below_cents": 20_000, "two_reviewers_from_cents": None},
    )
    now = timezone.now()

    with CaptureQueriesContext(connection) as queries:
        result = policy_what_if(
            agent_id=agent.pk,
            since=now - timedelta(hours=1),
            until=now + timedelta(hours=1),
            draft=draft,
        )

    assert result.calls == 3
    assert result.actual[AUTO_EXECUTED] == Tally(2, {"BRL": 4_500})
    assert result.actual[TWO_REVIEWERS] == Tally(1, {"BRL": 6_000})
    assert result.draft[AUTO_EXECUTED] == Tally(3, {"BRL": 10_500})
    assert [(m.actual, m.draft, m.tally.calls) for m in result.moves] == [
        (TWO_REVIEWERS, AUTO_EXECUTED, 1)
    ]
    assert result.moves[0].examples[0].call.session_id == "s-3"
    assert all(query["sql"].lstrip().upper().startswith("SELECT") for query in queries)


def test_the_rollups_recovery_is_the_recovery_rate_of_the_records(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    for session in ("s-1", "s-2", "s-3"):
        send(agent, session, "get_order", BAD_READ)
        send(agent, session, "refund_order", BAD_REFUND)
        if session != "s-3":
            send(agent, session, "get_order", GOOD_READ)
    send(agent, "s-1", "refund_order", HELD_REFUND)
    now = timezone.now()

    from_rollups = figures()["by_tool_and_code"]
    from_records = recovery_rate(start=now - timedelta(hours=2), end=now + timedelta(hours=1))

    assert isinstance(from_rollups, list)
    assert {
        (row["tool"], row["code"]): (row["correctable"], row["recovered"])
        for row in from_rollups
        if row["correctable"]
    } == {
        key: (recovery.rejected, recovery.recovered)
        for key, recovery in from_records.by_tool_and_code.items()
    }
