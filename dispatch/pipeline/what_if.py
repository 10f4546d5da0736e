"""What a draft policy would have done: recorded money-moving calls judged again, in their order,
by stage 7's own judgement (allowance_judge) and the policy's per-call limit and reviewer count.

The draft judges each call on the same sum the pipeline judges it on (allowance.py): the
customer's money in the currency moved or on its way, by any agent. The replay reads every
money-moving call, of every agent, in the order they arrived, once: the calls it judges (one
agent's, within the range) go where the draft sends them, and every other call (other agents',
and those before the range that warm the sums up) counts by what really happened to it. Each
call's money enters running sums per customer and currency when it is made and leaves them when
it stops counting (held money by a heap of those moments, moved money by a queue, as it ends in
the order it began), and a call's twins are found in an index of that money: a replay costs
O(n log n) for n calls and holds only the money live at the moment it has reached. How long each
call's money counts, and as what (money_phases):

- auto-executed (by the draft, or as recorded): moved without a human, for the window from its
  time, and in its agent's UTC day for the daily cap;
- held, and really held: held from its time until its confirmation let it go (rejected, expired
  or invalidated: when decided, never past its expiry; failed: when the execution ended; still
  pending: its expiry); approved, it is on its way until executed, then moved with a reviewer for
  the window from its execution;
- held by the draft but not really held (it ran without a human, or was refused): a reviewer is
  assumed to approve it at once, so it is moved with a reviewer for the window from its time;
- refused: nothing.

Calls the draft lets through count for the ones after them, as they would have. Nothing is
written anywhere: the caller gives the calls and gets the tallies.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

from dispatch.pipeline.allowance import (
    APPROVED,
    HELD,
    ON_ITS_WAY,
    POLICY,
    REVIEWER,
    SHOWN,
    AllowanceHistory,
    AllowanceRequest,
    HoldReason,
    Movement,
    allowance_judge,
    allowance_pass,
    always_judge,
    never_reason,
    reviewers_reason,
)
from dispatch.pipeline.engine import over_maximum
from dispatch.pipeline.policy import CurrencyLimits, HumanRule, Policy

# The ways a money-moving call goes, in the order a page shows them.
AUTO_EXECUTED = "auto_executed"
ONE_REVIEWER = "one_reviewer"
TWO_REVIEWERS = "two_reviewers"
REFUSED = "refused"
OUTCOMES = (AUTO_EXECUTED, ONE_REVIEWER, TWO_REVIEWERS, REFUSED)
HELD_OUTCOMES = frozenset({ONE_REVIEWER, TWO_REVIEWERS})

# Why the draft refuses a call (the holds have allowance_judge's kinds).
OVER_MAXIMUM = "over_maximum"

# A held call's confirmation, by what its status says of its money (dispatch.models'
# ConfirmationStatus): let go by a decision, still held, or approved.
LET_GO = frozenset({"rejected", "expired", "invalidated"})
PENDING = "pending"
EXECUTED = "executed"
FAILED = "failed"

# The money thresholds a draft may change, with the values each may take; None, where allowed,
# means the policy has no such limit. The window is the policy's; the others are per currency.
MAX_CENTS = 2**63 - 1
LIMIT_FIELDS: Mapping[str, tuple[int, int, bool]] = {
    "auto_approve_below_cents": (0, MAX_CENTS, False),
    "two_reviewers_from_cents": (1, MAX_CENTS, True),
    "max_amount_cents": (1, MAX_CENTS, False),
    "daily_cap_cents": (0, MAX_CENTS, True),
}
DRAFT_FIELDS: Mapping[str, tuple[int, int, bool]] = {
    **LIMIT_FIELDS,
    "auto_approve_window_seconds": (60, 2**31 - 1, False),
}


class DraftError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def draft_of(
    policy: Policy,
    changes: Mapping[str, int | None],
    currency_changes: Mapping[str, Mapping[str, int | None]] | None = None,
) -> Policy:
    """`policy` with some of its money thresholds changed; DraftError names a value out of range.

    `currency_changes` changes one currency's thresholds (minor units of that currency), and may
    give thresholds to a currency the policy has none for (its maximum amount, at least). A
    threshold in `changes` changes it in every currency of the policy alike."""
    for name, value in changes.items():
        _check(name, name, value)
    for currency, values in (currency_changes or {}).items():
        for name, value in values.items():
            if name not in LIMIT_FIELDS:
                raise DraftError(f"{currency} {name}", "is not a threshold of a currency")
            _check(f"{currency} {name}", name, value)
    window = changes.get("auto_approve_window_seconds")
    every: dict[str, Any] = {name: value for name, value in changes.items() if name in LIMIT_FIELDS}
    draft = (
        policy
        if window is None
        else dataclasses.replace(policy, auto_approve_window_seconds=window)
    )
    if draft.currencies is None and not currency_changes:
        # A version with one set of thresholds for every currency stays one.
        return dataclasses.replace(draft, **every)
    currencies = dict(draft.currencies or {})
    if draft.currencies is None:
        # Drafted per currency: the one set becomes each currency's that the draft names.
        shared = draft.limits("")
        assert shared is not None
        currencies = {currency.upper(): shared for currency in currency_changes or {}}
    currencies = {currency: limits._replace(**every) for currency, limits in currencies.items()}
    for currency, values in (currency_changes or {}).items():
        code = currency.upper()
        existing = currencies.get(code)
        if existing is None:
            if values.get("max_amount_cents") is None:
                raise DraftError(
                    f"{code} max_amount_cents", "give the maximum amount of a new currency"
                )
            existing = CurrencyLimits(int(values["max_amount_cents"] or 0))
        currencies[code] = existing._replace(**dict(values))  # type: ignore[arg-type]
    return dataclasses.replace(draft, currencies=currencies)


def _check(label: str, name: str, value: int | None) -> None:
    low, high, nullable = DRAFT_FIELDS[name]
    if value is None and nullable:
        return
    if value is None or not low <= value <= high:
        raise DraftError(
            label,
            f"must be a whole number from {low} to {high}"
            + (", or empty for no such limit" if nullable else ""),
        )


def replay_from(policy: Policy, since: datetime) -> datetime:
    """How far before the range a replay reads every call for its sums to be whole at `since`:
    the window's money, the held money still waiting for a reviewer (a confirmation lives at most
    the policy's confirmation time), and the UTC day's money for the daily cap. A held call older
    still is read too where its money may still count then (held_money_reaches)."""
    back = max(policy.auto_approve_window_seconds, policy.confirmation_ttl_seconds)
    midnight = datetime.combine(_utc_day(since), datetime.min.time(), UTC)
    return min(since - timedelta(seconds=back), midnight)


# A confirmation's statuses whose money has stopped moving or counting for good (money_phases);
# any other (approved, executing, unknown) is still on its way.
SETTLED = frozenset({*LET_GO, PENDING, EXECUTED, FAILED})


def held_money_reaches(confirmation: Confirmed, since: datetime, window: timedelta) -> bool:
    """Whether a held call's money may still count in a sum at `since` or later, however long
    before it the call was made: it is still on its way, or it could be held until then, or its
    execution ended within a window of it (moved with a reviewer, money counts for the window from
    its execution, which may come long after the call). A store's replay reads these calls from
    before replay_from as well; a few more than needed is harmless (their money has ended)."""
    return (
        confirmation.status not in SETTLED
        or confirmation.expires_at >= since
        or (confirmation.finished_at is not None and confirmation.finished_at >= since - window)
    )


class Confirmed(NamedTuple):
    """What became of a held call, as its confirmation records it."""

    # One of dispatch.models.ConfirmationStatus's values.
    status: str
    expires_at: datetime
    # When it was approved, rejected, expired or invalidated; when its execution ended.
    decided_at: datetime | None = None
    finished_at: datetime | None = None
    reviewers_required: int = 1


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
    # Whether the draft judges it; a call it does not judge only counts in the sums, by its
    # outcome (another agent's, or one before the range).
    judged: bool = True
    # Its confirmation, if it was held.
    confirmation: Confirmed | None = None


class Verdict(NamedTuple):
    """Where the draft sends one call, and why, in the pipeline's own terms."""

    call: PastCall
    outcome: str
    # The kind of the rule that held or refused it; "" when it is auto-executed.
    reason: str
    # The rule that decided where it goes: why it is held (allowance_judge's reason), refused
    # (stage 6's), or let through (allowance_pass); and for a held call, why one reviewer or two.
    rule: HoldReason | None = None
    reviewers: HoldReason | None = None


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
    # Each tool's own outcomes, recorded and under the draft: each version of a tool apart.
    by_tool: Mapping[str, ToolOutcomes] = {}


class ToolOutcomes(NamedTuple):
    """One tool's calls by outcome, as recorded and under the draft."""

    actual: Mapping[str, Tally]
    draft: Mapping[str, Tally]


# How long a call's money counts ----------------------------------------------------------------


class Phase(NamedTuple):
    """A stretch of time over which a call's money counts in its customer's sum as one thing."""

    approval: str
    # The movement's time in this phase, as a store keeps it (money moved with a reviewer is
    # kept from its execution).
    at: datetime
    # When it stops counting as this; None: it still counts.
    until: datetime | None
    # Whether it still counts at `until` itself: moved money counts while the window reaches
    # back to its time; held money stops when its confirmation lets it go.
    through: bool = False


def money_phases(call: PastCall, outcome: str, window: timedelta) -> tuple[Phase, ...]:
    """How a call's money counts once it went `outcome`, in order (see the module's docstring)."""
    if outcome == AUTO_EXECUTED:
        return (Phase(POLICY, call.at, call.at + window, True),)
    if outcome not in HELD_OUTCOMES:
        return ()
    held = call.confirmation
    if held is None or call.outcome not in HELD_OUTCOMES:
        # Not really held: what a reviewer would have done is unknown; approved at once.
        return (Phase(REVIEWER, call.at, call.at + window, True),)
    if held.status == PENDING:
        return (Phase(HELD, call.at, held.expires_at),)
    if held.status in LET_GO:
        return (Phase(HELD, call.at, min(held.decided_at or held.expires_at, held.expires_at)),)
    approved_at = max(held.decided_at or call.at, call.at)
    waiting = Phase(HELD, call.at, approved_at)
    if held.status == EXECUTED:
        executed_at = max(held.finished_at or approved_at, approved_at)
        return (
            waiting,
            Phase(APPROVED, call.at, executed_at),
            Phase(REVIEWER, executed_at, executed_at + window, True),
        )
    # Failed: on its way until its execution ended. Approved, executing or unknown (it may have
    # happened): on its way still.
    return (waiting, Phase(APPROVED, call.at, held.finished_at if held.status == FAILED else None))


# The running sums -----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _CustomerSum:
    """One customer's money in one currency that counts now."""

    cents: int = 0
    held_cents: int = 0
    reviewed_cents: int = 0
    # By key, in the order each began to count as it is now (the latest last).
    live: dict[str, Movement] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class _Live:
    """A call's money while it counts: its phases, the one it is in, and the sums it is in."""

    movement: Movement
    phases: tuple[Phase, ...]
    sums: _CustomerSum
    customer: tuple[str, str]
    twins: dict[str, _Live]
    twin: tuple[str, str, str, str, int]
    phase: int = 0


class RunningSums:
    """The customers' sums as a replay advances through time, calls added in time order: each
    call's money enters once and leaves once, and changes phase at most twice in between.

    Money on its way ends when its confirmation says, kept in a heap by that moment; moved money
    ends a window after it began, and begins in time order, so a queue keeps it in order of its
    end. `changes` counts the entries, phase changes and exits, and `most_live` the most money
    that counted at once: what a replay costs, and what it holds."""

    def __init__(self) -> None:
        self._held_ends: list[tuple[datetime, int, _Live]] = []
        self._moved_ends: collections.deque[tuple[datetime, _Live]] = collections.deque()
        self._order = itertools.count()
        self._customers: dict[tuple[str, str], _CustomerSum] = {}
        # The live money by customer, currency, tool, subject and amount: a call's twins.
        self._twins: dict[tuple[str, str, str, str, int], dict[str, _Live]] = {}
        self.live = 0
        self.changes = 0
        self.most_live = 0

    def advance(self, now: datetime) -> None:
        """Let every phase that is over by `now` end: held money at its end, moved money once
        its end is past (the window still reaches back to it at its end)."""
        held, moved = self._held_ends, self._moved_ends
        # Held money first: an execution it ends with begins moved money, which may be over too.
        while held and held[0][0] <= now:
            self._next_phase(heapq.heappop(held)[2])
        while moved and moved[0][0] < now:
            self._next_phase(moved.popleft()[1])

    def add(self, key: str, call: PastCall, phases: tuple[Phase, ...]) -> None:
        """A call's money, from its time, for its phases."""
        first = phases[0]
        customer = (call.customer_id, call.currency)
        sums = self._customers.get(customer)
        if sums is None:
            sums = self._customers[customer] = _CustomerSum()
        twin = (call.customer_id, call.currency, call.tool, call.subject, call.amount_cents)
        twins = self._twins.get(twin)
        if twins is None:
            twins = self._twins[twin] = {}
        movement = Movement(
            key,
            call.agent_id,
            call.session_id,
            call.tool,
            call.subject,
            call.amount_cents,
            first.at,
            first.approval,
        )
        live = twins[key] = _Live(movement, phases, sums, customer, twins, twin)
        self.live += 1
        if self.live > self.most_live:
            self.most_live = self.live
        self._count(live, first)

    def history(self, request: AllowanceRequest, agent_day_cents: int) -> AllowanceHistory:
        """What a call is judged by now: its customer's sum and its twins, as a store gives them."""
        customer = self._customers.get((request.customer_id, request.currency))
        twins = self._twins.get(
            (
                request.customer_id,
                request.currency,
                request.tool,
                request.subject,
                request.amount_cents,
            )
        )
        repeats = tuple(live.movement for live in twins.values()) if twins else ()
        if customer is None:
            return AllowanceHistory(0, 0, (), agent_day_cents, repeats)
        latest = tuple(itertools.islice(reversed(customer.live.values()), SHOWN))
        return AllowanceHistory(
            customer_window_cents=customer.cents,
            customer_window_count=len(customer.live),
            customer_window=latest[::-1],
            agent_day_cents=agent_day_cents,
            repeats=repeats,
            customer_held_cents=customer.held_cents,
            customer_reviewed_cents=customer.reviewed_cents,
        )

    def _count(self, live: _Live, phase: Phase) -> None:
        """Count a call's money as `phase` says, until its end."""
        movement, sums = live.movement, live.sums
        sums.cents += movement.amount_cents
        if phase.approval in ON_ITS_WAY:
            sums.held_cents += movement.amount_cents
        elif phase.approval == REVIEWER:
            sums.reviewed_cents += movement.amount_cents
        sums.live[movement.key] = movement
        self.changes += 1
        if phase.until is None:
            return
        if phase.through:
            self._moved_ends.append((phase.until, live))
        else:
            heapq.heappush(self._held_ends, (phase.until, next(self._order), live))

    def _next_phase(self, live: _Live) -> None:
        movement, sums = live.movement, live.sums
        sums.cents -= movement.amount_cents
        if movement.approval in ON_ITS_WAY:
            sums.held_cents -= movement.amount_cents
        elif movement.approval == REVIEWER:
            sums.reviewed_cents -= movement.amount_cents
        del sums.live[movement.key]
        live.phase += 1
        if live.phase < len(live.phases):
            phase = live.phases[live.phase]
            live.movement = movement._replace(approval=phase.approval, at=phase.at)
            self._count(live, phase)
            return
        self.changes += 1
        self.live -= 1
        if not sums.live:
            del self._customers[live.customer]
        del live.twins[movement.key]
        if not live.twins:
            del self._twins[live.twin]


class _AgentDays:
    """What each agent moved without a human per currency on the UTC day the replay is in."""

    def __init__(self) -> None:
        self.day_ends: datetime | None = None
        self.cents: dict[tuple[str, str], int] = {}

    def of(self, agent_id: str, currency: str, at: datetime) -> int:
        self._turn(at)
        return self.cents.get((agent_id, currency), 0)

    def add(self, call: PastCall) -> None:
        self._turn(call.at)
        key = (call.agent_id, call.currency)
        self.cents[key] = self.cents.get(key, 0) + call.amount_cents

    def _turn(self, at: datetime) -> None:
        # The replay goes forward in time: a new day forgets the last one.
        if self.day_ends is None or at >= self.day_ends:
            midnight = datetime.combine(_utc_day(at), datetime.min.time(), UTC)
            self.day_ends, self.cents = midnight + timedelta(days=1), {}


# The replay ----------------------------------------------------------------------------------


def policy_replay(
    policy: Policy, calls: Iterable[PastCall], *, sums: RunningSums | None = None
) -> Iterator[Verdict]:
    """Each judged call's outcome under `policy`, as the calls come: in the order they arrived
    (a ValueError otherwise). `sums` is for a caller that wants to see what the replay kept."""
    window = timedelta(seconds=policy.auto_approve_window_seconds)
    sums = RunningSums() if sums is None else sums
    days = _AgentDays()
    latest: datetime | None = None
    for index, call in enumerate(calls):
        if latest is not None and call.at < latest:
            raise ValueError(f"calls must come in the order they arrived: {call.at} < {latest}")
        latest = call.at
        sums.advance(call.at)
        outcome = call.outcome
        if call.judged:
            verdict = _judged(policy, window, call, sums, days)
            outcome = verdict.outcome
            yield verdict
        phases = money_phases(call, outcome, window)
        if phases:
            sums.add(call.call_id or f"#{index}", call, phases)
        if outcome == AUTO_EXECUTED:
            days.add(call)


def _judged(
    policy: Policy, window: timedelta, call: PastCall, sums: RunningSums, days: _AgentDays
) -> Verdict:
    limits = policy.limits(call.currency)
    if limits is not None and call.amount_cents > limits.max_amount_cents:
        refusal = over_maximum("amount", call.amount_cents, call.currency, limits.max_amount_cents)
        rule = HoldReason(
            OVER_MAXIMUM,
            refusal.message,
            {"amount_cents": call.amount_cents, "max_amount_cents": limits.max_amount_cents},
        )
        return Verdict(call, REFUSED, OVER_MAXIMUM, rule)
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
        call.at - window,
        limits is not None and limits.daily_cap_cents is not None,
    )
    history = sums.history(request, days.of(call.agent_id, call.currency, call.at))
    # As stage 7 judges a tool that moves money: by the policy's rule for it.
    human = policy.human_rule(call.tool, high_risk=True)
    hold = (
        allowance_judge(policy, request, history)
        if human is HumanRule.BY_AMOUNT
        else always_judge(call.tool, request, history)
        if human is HumanRule.ALWAYS
        else None
    )
    if hold is None:
        passed = (
            allowance_pass(policy, request, history)
            if human is HumanRule.BY_AMOUNT
            else never_reason(call.tool)
        )
        return Verdict(call, AUTO_EXECUTED, "", passed)
    # As stage 7 does: the customer's sum with this call decides the reviewers.
    reviewers = reviewers_reason(
        policy, history.customer_window_cents + call.amount_cents, call.currency
    )
    outcome = (
        TWO_REVIEWERS
        if policy.reviewers_required(
            history.customer_window_cents + call.amount_cents, call.currency
        )
        == 2
        else ONE_REVIEWER
    )
    return Verdict(call, outcome, hold.kind, hold, reviewers)


# The tallies ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Count:
    calls: int = 0
    cents: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, call: PastCall) -> None:
        self.calls += 1
        self.cents[call.currency] = self.cents.get(call.currency, 0) + call.amount_cents

    def tally(self) -> Tally:
        return Tally(self.calls, dict(sorted(self.cents.items())))


def what_if_of(policy: Policy, calls: Iterable[PastCall], *, examples: int = 5) -> WhatIf:
    """The recorded outcomes beside the draft's, and the calls that would move between them.
    Counted as the verdicts come: it holds the tallies and a few examples, never the calls."""
    actual = {outcome: _Count() for outcome in OUTCOMES}
    draft = {outcome: _Count() for outcome in OUTCOMES}
    changed: dict[tuple[str, str], tuple[_Count, list[Verdict]]] = {}
    reasons: dict[str, int] = {}
    tools: dict[str, tuple[dict[str, _Count], dict[str, _Count]]] = {}
    judged = 0
    for verdict in policy_replay(policy, calls):
        call = verdict.call
        judged += 1
        actual[call.outcome].add(call)
        draft[verdict.outcome].add(call)
        tool_actual, tool_draft = tools.setdefault(
            call.tool,
            ({outcome: _Count() for outcome in OUTCOMES}, {o: _Count() for o in OUTCOMES}),
        )
        tool_actual[call.outcome].add(call)
        tool_draft[verdict.outcome].add(call)
        if verdict.reason:
            reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
        if verdict.outcome != call.outcome:
            count, shown = changed.setdefault((call.outcome, verdict.outcome), (_Count(), []))
            count.add(call)
            if len(shown) < examples:
                shown.append(verdict)
    moves = [
        Move(before, after, count.tally(), tuple(shown))
        for (before, after), (count, shown) in changed.items()
    ]
    moves.sort(key=lambda move: (-move.tally.calls, OUTCOMES.index(move.actual)))
    return WhatIf(
        judged,
        {outcome: count.tally() for outcome, count in actual.items()},
        {outcome: count.tally() for outcome, count in draft.items()},
        tuple(moves),
        reasons,
        {
            tool: ToolOutcomes(
                {outcome: count.tally() for outcome, count in tool_actual.items()},
                {outcome: count.tally() for outcome, count in tool_draft.items()},
            )
            for tool, (tool_actual, tool_draft) in sorted(tools.items())
        },
    )


def _utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date() if moment.tzinfo else moment.date()
