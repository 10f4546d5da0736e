"""Judged again under the policy that judged them, a range's calls go every way they went, however
short the range: the money of calls made before its read-back start counts in its sums where it
counted live (a held refund approved, then executed long after, counts for the window from its
execution)."""

from __future__ import annotations

import heapq
import json
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch.pipeline.allowance import APPROVED as APPROVED_MONEY
from dispatch.pipeline.allowance import REVIEWER
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.state import AuditEntry
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    TWO_REVIEWERS,
    Confirmed,
    PastCall,
    WhatIf,
    held_money_reaches,
    replay_from,
    what_if_of,
)
from tests.dispatch.pipeline.conftest import Harness, build_harness, default_policy

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
CUSTOMERS = ("CUS-11", "CUS-12", "CUS-13")
AMOUNTS = (500, 1_200, 2_500, 4_000, 6_000, 7_500)
# Auto-approve below 5000 over 24 hours; two reviewers from 20000; refused above 7000; a daily
# cap of 6000; a confirmation lives an hour, so a read-back of a day misses a call approved and
# executed a day or more after it.
POLICY = default_policy(max_amount_cents=7_000, daily_cap_cents=6_000)
WINDOW = timedelta(seconds=POLICY.auto_approve_window_seconds)
RECORDED = {"OK": AUTO_EXECUTED, "CONFIRMATION_REQUIRED": ONE_REVIEWER, "POLICY_LIMIT": REFUSED}


class Step(NamedTuple):
    """One call, and what a reviewer and the workers then do if it is held."""

    gap_minutes: int
    customer: int
    amount: int
    other_agent: bool
    # None: left pending until it expires; else approved (True) or rejected, minutes after.
    approve: bool | None
    decide_after_minutes: int
    # How long after its approval it executes: None, never (approved, on its way still).
    execute_after_minutes: int | None


steps = st.builds(
    Step,
    gap_minutes=st.integers(5, 12 * 60),
    customer=st.integers(0, len(CUSTOMERS) - 1),
    amount=st.sampled_from(AMOUNTS),
    other_agent=st.booleans(),
    approve=st.sampled_from([True, True, True, False, None]),
    decide_after_minutes=st.integers(1, 59),
    # Up to three days late: a worker that was down.
    execute_after_minutes=st.one_of(st.none(), st.integers(0, 60), st.integers(60, 3 * 24 * 60)),
)


class History(NamedTuple):
    harness: Harness
    # What became of each held call: status, decided at, finished at.
    fates: dict[str, tuple[str, datetime | None, datetime | None]]
    started: datetime
    ended: datetime


def play(plan: list[Step]) -> History:
    """The calls through the pipeline at their moments, each after the decisions and executions
    due by then, as live."""
    harness = build_harness()
    for number, customer in enumerate(CUSTOMERS):
        harness.book.add(_order(number), customer, 10**9, "BRL")
    started = harness.clock.now
    due: list[tuple[datetime, int, str, str]] = []
    fates: dict[str, tuple[str, datetime | None, datetime | None]] = {}
    for number, step in enumerate(plan):
        harness.clock.now += step.gap_minutes * MINUTE
        _settle(harness, due, fates, harness.clock.now)
        customer = CUSTOMERS[step.customer]
        result = harness.call(
            "refund_order",
            json.dumps(
                {
                    "order_id": _order(step.customer),
                    "amount_cents": step.amount,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
            session=f"s-{number}",
            customer=customer,
            agent="agent-2" if step.other_agent else "agent-1",
            policy=POLICY,
        )
        if result.code != "CONFIRMATION_REQUIRED" or step.approve is None:
            continue
        confirmation_id = str(result.data["confirmation_id"])
        decided = harness.clock.now + step.decide_after_minutes * MINUTE
        if not step.approve:
            heapq.heappush(due, (decided, number, "reject", confirmation_id))
            continue
        heapq.heappush(due, (decided, number, "approve", confirmation_id))
        if step.execute_after_minutes is not None:
            executed = decided + step.execute_after_minutes * MINUTE
            heapq.heappush(due, (executed, number, "execute", confirmation_id))
    ended = harness.clock.now + MINUTE
    _settle(harness, due, fates, ended)
    return History(harness, fates, started, ended)


def _order(customer: int) -> str:
    return f"ORD-{9_001 + customer}"


def _settle(
    harness: Harness,
    due: list[tuple[datetime, int, str, str]],
    fates: dict[str, tuple[str, datetime | None, datetime | None]],
    now: datetime,
) -> None:
    while due and due[0][0] <= now:
        at, _, action, confirmation_id = heapq.heappop(due)
        if action == "execute":
            harness.state.held_executed(confirmation_id, at=at)
            fates[confirmation_id] = ("executed", fates[confirmation_id][1], at)
        else:
            harness.state.held_decided(confirmation_id, approved=action == "approve", at=at)
            fates[confirmation_id] = ("approved" if action == "approve" else "rejected", at, None)


def read(history: History, since: datetime, policy: Policy = POLICY) -> list[PastCall]:
    """The calls a store's replay reads for a range from `since` to the end: every call from
    replay_from on, and the held calls before it whose money may still count in the range."""
    start = replay_from(policy, since)
    window = timedelta(seconds=policy.auto_approve_window_seconds)
    calls = []
    for entry in history.harness.state.audit:
        call = _recorded(entry, history, since)
        if call is None:
            continue
        if call.at >= start or (
            call.confirmation is not None and held_money_reaches(call.confirmation, since, window)
        ):
            calls.append(call)
    return calls


def _recorded(entry: AuditEntry, history: History, since: datetime) -> PastCall | None:
    if entry.replayed or entry.code not in RECORDED or entry.arguments is None:
        return None
    outcome, confirmation = RECORDED[entry.code], None
    if entry.confirmation_id:
        held = history.harness.state.confirmations[entry.confirmation_id]
        status, decided_at, finished_at = history.fates.get(
            entry.confirmation_id, ("pending", None, None)
        )
        confirmation = Confirmed(
            status, held.expires_at, decided_at, finished_at, held.reviewers_required
        )
        if held.reviewers_required == 2:
            outcome = TWO_REVIEWERS
    return PastCall(
        entry.at,
        entry.agent_id,
        entry.session_id,
        entry.customer_id,
        entry.tool,
        str(entry.arguments["order_id"]),
        str(entry.arguments["currency"]),
        int(entry.arguments["amount_cents"]),
        outcome,
        entry.call_id,
        judged=entry.agent_id == "agent-1" and entry.at >= since,
        confirmation=confirmation,
    )


def replayed(history: History, since: datetime) -> WhatIf:
    return what_if_of(POLICY, read(history, since))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=st.lists(steps, min_size=10, max_size=90), middle=st.floats(0.0, 1.0))
def test_under_the_policy_in_force_no_call_of_any_range_moves(
    plan: list[Step], middle: float
) -> None:
    history = play(plan)
    ended = history.ended
    # The last day, the last 7, everything, and one starting anywhere (within a window too).
    starts = [ended - DAY, ended - 7 * DAY, history.started, ended - 31 * DAY]
    starts.append(history.started + (ended - history.started) * middle)

    for since in starts:
        result = replayed(history, since)

        assert result.moves == (), f"since {since}"
        assert result.actual == result.draft
    # Every call of the agent was judged again: each one a refund that moves money.
    whole = replayed(history, history.started)
    assert whole.calls == sum(not step.other_agent for step in plan)


def test_a_refund_approved_long_ago_and_executed_in_the_window_counts_in_a_short_range() -> None:
    # 6000 held for its amount, approved within its hour and executed two days later; a refund of
    # 2500 for the same customer an hour after the execution is held live for the window's sum,
    # and so it must be in a replay of a range that starts with it.
    plan = [
        Step(10, 0, 6_000, False, True, 30, 2 * 24 * 60),
        Step(2 * 24 * 60 + 60 + 30, 0, 2_500, False, None, 1, None),
    ]
    history = play(plan)
    second = history.harness.state.audit[-1]
    first_confirmation = str(history.harness.state.audit[0].confirmation_id)
    executed_at = history.fates[first_confirmation][2]
    assert executed_at is not None and second.at - executed_at < WINDOW
    # The call is older than the read-back start of a range starting at the second one.
    assert history.harness.state.audit[0].at < replay_from(POLICY, second.at)
    assert second.code == "CONFIRMATION_REQUIRED"

    result = replayed(history, second.at)

    assert result.calls == 1
    assert result.moves == ()
    assert result.draft[ONE_REVIEWER].calls == 1


def test_a_held_call_before_the_read_back_is_read_while_its_money_may_count() -> None:
    since = datetime(2026, 3, 10, tzinfo=UTC)
    expires = since - 2 * HOUR

    def reaches(status: str, finished_at: datetime | None = None) -> bool:
        held = Confirmed(status, expires, expires - HOUR, finished_at)
        return held_money_reaches(held, since, WINDOW)

    # On its way still, whenever it was held.
    assert reaches("approved") and reaches("executing") and reaches("unknown")
    # Executed within a window before the range: its money counts in it.
    assert reaches("executed", since - WINDOW + MINUTE)
    assert not reaches("executed", since - WINDOW - MINUTE)
    # Let go, failed or expired before the range: nothing of it counts there.
    assert not reaches("rejected") and not reaches("pending")
    assert not reaches("failed", since - WINDOW - MINUTE)
    assert held_money_reaches(Confirmed("pending", since, None, None), since, WINDOW)


def test_money_approved_and_executed_late_counts_as_the_in_memory_store_keeps_it() -> None:
    history = play([Step(10, 0, 6_000, False, True, 1, None)])
    [(customer, currency, movement)] = history.harness.state.movements.values()
    assert (customer, currency, movement.approval) == ("CUS-11", "BRL", APPROVED_MONEY)
    confirmation_id = str(history.harness.state.audit[0].confirmation_id)
    later = history.ended + DAY

    history.harness.state.held_executed(confirmation_id, at=later)

    [(_, _, executed)] = history.harness.state.movements.values()
    assert (executed.approval, executed.at) == (REVIEWER, later)
