"""What a draft policy would have done: recorded money-moving calls judged again, in their order,
by stage 7's own judgement (allowance_judge) and the policy's per-call limit and reviewer count.

Calls the draft lets through count for the ones after them, as they would have. Nothing is
written anywhere: the caller gives the calls and gets the tallies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from dispatch.pipeline.allowance import (
    AllowanceHistory,
    AllowanceRequest,
    Movement,
    allowance_judge,
)
from dispatch.pipeline.policy import Policy

# The ways a money-moving call goes, in the order a page shows them.
AUTO_EXECUTED = "auto_executed"
ONE_REVIEWER = "one_reviewer"
TWO_REVIEWERS = "two_reviewers"
REFUSED = "refused"
OUTCOMES = (AUTO_EXECUTED, ONE_REVIEWER, TWO_REVIEWERS, REFUSED)

# Why the draft refuses a call (the holds have allowance_judge's kinds).
OVER_MAXIMUM = "over_maximum"

# The money thresholds a draft may change, with the values each may take; None, where allowed,
# means the policy has no such limit.
MAX_CENTS = 2**63 - 1
DRAFT_FIELDS: Mapping[str, tuple[int, int, bool]] = {
    "auto_approve_below_cents": (0, MAX_CENTS, False),
    "auto_approve_window_seconds": (60, 2**31 - 1, False),
    "two_reviewers_from_cents": (1, MAX_CENTS, True),
    "max_amount_cents": (1, MAX_CENTS, False),
    "daily_cap_cents": (0, MAX_CENTS, True),
}


class DraftError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def draft_of(policy: Policy, changes: Mapping[str, int | None]) -> Policy:
    """`policy` with some of its money thresholds changed; DraftError names a value out of range."""
    for name, value in changes.items():
        low, high, nullable = DRAFT_FIELDS[name]
        if value is None and nullable:
            continue
        if value is None or not low <= value <= high:
            raise DraftError(
                name,
                f"must be a whole number from {low} to {high}"
                + (", or empty for no such limit" if nullable else ""),
            )
    fields: dict[str, Any] = dict(changes)
    return dataclasses.replace(policy, **fields)


class PastCall(NamedTuple):
    """A call that moved, or asked to move, money, as the audit records keep it."""

    at: datetime
    agent_id: str
    session_id: str
    customer_id: str
    tool: str
    subject: str
    currency: str
    amount_cents: int
    # What happened to it: one of OUTCOMES.
    outcome: str
    call_id: str = ""


class Verdict(NamedTuple):
    """Where the draft sends one call, and why when it is not auto-executed."""

    call: PastCall
    outcome: str
    reason: str


class Tally(NamedTuple):
    """Calls, and their money per currency (minor units do not add up across currencies)."""

    calls: int
    cents: Mapping[str, int]


class Move(NamedTuple):
    """Calls that went one way and would go another under the draft."""

    actual: str
    draft: str
    tally: Tally
    examples: tuple[Verdict, ...]


class WhatIf(NamedTuple):
    calls: int
    actual: Mapping[str, Tally]
    draft: Mapping[str, Tally]
    # Only the calls whose outcome changes, largest first.
    moves: tuple[Move, ...]
    # Why the draft holds or refuses calls, with how many.
    reasons: Mapping[str, int]


def policy_replay(policy: Policy, calls: Iterable[PastCall]) -> list[Verdict]:
    """Each call's outcome under `policy`, in the calls' order."""
    moved: list[tuple[PastCall, Movement]] = []
    verdicts = []
    for call in sorted(calls, key=lambda c: c.at):
        if call.amount_cents > policy.max_amount_cents:
            verdicts.append(Verdict(call, REFUSED, OVER_MAXIMUM))
            continue
        since = call.at - timedelta(seconds=policy.auto_approve_window_seconds)
        window = [
            movement
            for past, movement in moved
            if (past.customer_id, past.currency) == (call.customer_id, call.currency)
            and movement.at >= since
        ]
        history = AllowanceHistory(
            customer_window_cents=sum(movement.amount_cents for movement in window),
            customer_window_count=len(window),
            customer_window=tuple(window),
            agent_day_cents=sum(
                movement.amount_cents
                for past, movement in moved
                if movement.agent_id == call.agent_id
                and past.currency == call.currency
                and movement.at.date() == call.at.date()
            ),
            repeats=tuple(
                movement
                for movement in window
                if (movement.tool, movement.subject, movement.amount_cents)
                == (call.tool, call.subject, call.amount_cents)
            ),
        )
        request = AllowanceRequest(
            call.call_id,
            call.agent_id,
            call.session_id,
            call.customer_id,
            call.tool,
            call.subject,
            call.currency,
            call.amount_cents,
            call.at,
            since,
        )
        hold = allowance_judge(policy, request, history)
        if hold is None:
            verdicts.append(Verdict(call, AUTO_EXECUTED, ""))
            movement = Movement(
                call.call_id,
                call.agent_id,
                call.session_id,
                call.tool,
                call.subject,
                call.amount_cents,
                call.at,
                "policy",
            )
            moved.append((call, movement))
        # As stage 7 does: the sum it makes with the window's money decides the reviewers.
        elif policy.reviewers_required(history.customer_window_cents + call.amount_cents) == 2:
            verdicts.append(Verdict(call, TWO_REVIEWERS, hold.kind))
        else:
            verdicts.append(Verdict(call, ONE_REVIEWER, hold.kind))
    return verdicts


def what_if_of(policy: Policy, calls: Iterable[PastCall], *, examples: int = 5) -> WhatIf:
    """The recorded outcomes beside the draft's, and the calls that would move between them."""
    verdicts = policy_replay(policy, calls)
    actual = _tallies((v.call.outcome, v.call) for v in verdicts)
    draft = _tallies((v.outcome, v.call) for v in verdicts)
    changed: dict[tuple[str, str], list[Verdict]] = {}
    reasons: dict[str, int] = {}
    for verdict in verdicts:
        if verdict.reason:
            reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
        if verdict.outcome != verdict.call.outcome:
            changed.setdefault((verdict.call.outcome, verdict.outcome), []).append(verdict)
    moves = [
        Move(before, after, _tally(v.call for v in moving), tuple(moving[:examples]))
        for (before, after), moving in changed.items()
    ]
    moves.sort(key=lambda move: (-move.tally.calls, OUTCOMES.index(move.actual)))
    return WhatIf(len(verdicts), actual, draft, tuple(moves), reasons)


def _tally(calls: Iterable[PastCall]) -> Tally:
    cents: dict[str, int]
    count, cents = 0, {}
    for call in calls:
        count += 1
        cents[call.currency] = cents.get(call.currency, 0) + call.amount_cents
    return Tally(count, dict(sorted(cents.items())))


def _tallies(pairs: Iterable[tuple[str, PastCall]]) -> dict[str, Tally]:
    grouped: dict[str, list[PastCall]] = {outcome: [] for outcome in OUTCOMES}
    for outcome, call in pairs:
        grouped[outcome].append(call)
    return {outcome: _tally(calls) for outcome, calls in grouped.items()}
