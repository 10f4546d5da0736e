"""The what-if's sums are the pipeline's: everything moved or on its way for the customer, by any
agent, held money until its confirmation lets it go, with the window warmed up before the range."""

from __future__ import annotations

import heapq
import itertools
import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from dispatch.pipeline.allowance import (
    APPROVED,
    HELD,
    POLICY,
    REVIEWER,
    AllowanceRequest,
)
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.state import AuditEntry
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    TWO_REVIEWERS,
    Confirmed,
    PastCall,
    Phase,
    RunningSums,
    Verdict,
    money_phases,
    policy_replay,
    replay_from,
    what_if_of,
)
from tests.dispatch.pipeline.conftest import Harness, build_harness, default_policy

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
WINDOW = timedelta(hours=24)
# Auto-approve below 5000 within 24 hours; two reviewers from 20000; confirmations live an hour.
POLICY_IN_FORCE = default_policy()
_ids = itertools.count()


def call(
    at: datetime,
    amount: int,
    outcome: str = AUTO_EXECUTED,
    *,
    agent: str = "agent-1",
    session: str | None = None,
    order: str | None = None,
    judged: bool = False,
    confirmation: Confirmed | None = None,
) -> PastCall:
    number = next(_ids)
    return PastCall(
        at,
        agent,
        session or f"s-{number}",
        "CUS-1",
        "refund_order",
        order or f"ORD-{number}",
        "BRL",
        amount,
        outcome,
        call_id=f"call-{number}",
        judged=judged,
        confirmation=confirmation,
    )


def probe(
    at: datetime,
    amount: int = 1_500,
    outcome: str = AUTO_EXECUTED,
    *,
    order: str | None = None,
    session: str | None = None,
    confirmation: Confirmed | None = None,
) -> PastCall:
    """A call the draft judges: 1500 passes alone, and with 3500 or more in the sum it does not."""
    return call(
        at,
        amount,
        outcome,
        order=order,
        session=session,
        confirmation=confirmation,
        judged=True,
    )


def judged(*calls: PastCall, policy: Policy = POLICY_IN_FORCE) -> list[tuple[str, str]]:
    return [(verdict.outcome, verdict.reason) for verdict in policy_replay(policy, calls)]


def held(
    status: str,
    *,
    expires_at: datetime = T0 + HOUR,
    decided_at: datetime | None = None,
    finished_at: datetime | None = None,
) -> Confirmed:
    return Confirmed(status, expires_at, decided_at, finished_at)


AUTO = (AUTO_EXECUTED, "")
WINDOW_SUM = (ONE_REVIEWER, "window_sum")


# How long a call's money counts, and as what ----------------------------------------------------


@pytest.mark.parametrize(
    ("confirmation", "phases"),
    [
        pytest.param(held("pending"), [(HELD, T0 + HOUR)], id="pending: until its expiry"),
        pytest.param(
            held("rejected", decided_at=T0 + 10 * MINUTE),
            [(HELD, T0 + 10 * MINUTE)],
            id="rejected: until the decision",
        ),
        pytest.param(
            held("invalidated", decided_at=T0 + 10 * MINUTE),
            [(HELD, T0 + 10 * MINUTE)],
            id="invalidated: until the re-check",
        ),
        pytest.param(
            held("expired", decided_at=T0 + 2 * HOUR),
            [(HELD, T0 + HOUR)],
            id="expired: until its expiry, not the late sweep",
        ),
        pytest.param(
            held("failed", decided_at=T0 + 10 * MINUTE, finished_at=T0 + 11 * MINUTE),
            [(HELD, T0 + 10 * MINUTE), (APPROVED, T0 + 11 * MINUTE)],
            id="failed: until the execution ended",
        ),
        pytest.param(
            held("unknown", decided_at=T0 + 10 * MINUTE, finished_at=T0 + 11 * MINUTE),
            [(HELD, T0 + 10 * MINUTE), (APPROVED, None)],
            id="unknown: on its way still, it may have happened",
        ),
        pytest.param(
            held("executing", decided_at=T0 + 10 * MINUTE),
            [(HELD, T0 + 10 * MINUTE), (APPROVED, None)],
            id="executing: on its way still",
        ),
    ],
)
def test_held_money_counts_until_its_confirmation_lets_it_go(
    confirmation: Confirmed, phases: list[tuple[str, datetime | None]]
) -> None:
    past = call(T0, 4_000, ONE_REVIEWER, confirmation=confirmation)

    counted = money_phases(past, ONE_REVIEWER, WINDOW)

    assert [(phase.approval, phase.until) for phase in counted] == phases
    assert all(phase.at == T0 and not phase.through for phase in counted)


def test_an_executed_held_call_becomes_a_reviewer_s_money_from_its_execution() -> None:
    confirmation = held("executed", decided_at=T0 + 10 * MINUTE, finished_at=T0 + 12 * MINUTE)
    past = call(T0, 4_000, TWO_REVIEWERS, confirmation=confirmation)

    counted = money_phases(past, TWO_REVIEWERS, WINDOW)

    assert counted == (
        Phase(HELD, T0, T0 + 10 * MINUTE),
        Phase(APPROVED, T0, T0 + 12 * MINUTE),
        Phase(REVIEWER, T0 + 12 * MINUTE, T0 + 12 * MINUTE + WINDOW, True),
    )


def test_money_moved_without_a_human_counts_for_the_window_and_refused_money_never() -> None:
    past = call(T0, 4_000)

    assert money_phases(past, AUTO_EXECUTED, WINDOW) == (Phase(POLICY, T0, T0 + WINDOW, True),)
    assert money_phases(past, REFUSED, WINDOW) == ()


@pytest.mark.parametrize("really", [AUTO_EXECUTED, REFUSED])
def test_a_call_the_draft_holds_that_was_not_held_is_approved_at_once(really: str) -> None:
    past = call(T0, 4_000, really)

    counted = money_phases(past, ONE_REVIEWER, WINDOW)

    assert counted == (Phase(REVIEWER, T0, T0 + WINDOW, True),)


# The sum a call is judged by --------------------------------------------------------------------


def test_held_money_counts_in_the_sum_until_its_release_and_not_after() -> None:
    def background() -> PastCall:
        return call(T0, 4_000, ONE_REVIEWER, confirmation=held("pending"))

    # 4000 held until T0 + 1h: with 1500 the sum is 5500, not below 5000.
    assert judged(background(), probe(T0 + 59 * MINUTE)) == [WINDOW_SUM]
    assert judged(background(), probe(T0 + HOUR)) == [AUTO]


def test_a_rejection_lets_the_money_go_at_once() -> None:
    rejected = held("rejected", decided_at=T0 + 5 * MINUTE)

    verdicts = judged(
        call(T0, 4_000, ONE_REVIEWER, confirmation=rejected),
        probe(T0 + 5 * MINUTE),
    )

    assert verdicts == [AUTO]


def test_an_executed_held_call_counts_for_the_window_from_its_execution() -> None:
    policy = default_policy(auto_approve_window_seconds=3600)
    executed = held("executed", decided_at=T0 + 10 * MINUTE, finished_at=T0 + 2 * HOUR)

    def background() -> PastCall:
        return call(T0, 4_000, ONE_REVIEWER, confirmation=executed)

    # Held, then approved (on its way), then moved with a reviewer until T0 + 3h.
    assert judged(background(), probe(T0 + 90 * MINUTE), policy=policy) == [WINDOW_SUM]
    assert judged(background(), probe(T0 + 3 * HOUR), policy=policy) == [WINDOW_SUM]
    assert judged(background(), probe(T0 + 3 * HOUR + MINUTE), policy=policy) == [AUTO]


def test_another_agent_s_money_counts_for_the_same_customer() -> None:
    verdicts = judged(call(T0, 4_000, agent="agent-2"), probe(T0 + MINUTE))

    assert verdicts == [WINDOW_SUM]


def test_the_window_is_warmed_up_by_calls_before_the_range() -> None:
    # Not judged: before `since`, counted by what really happened to them.
    earlier = [call(T0 - 30 * HOUR, 4_000), call(T0 - 2 * HOUR, 3_500)]

    verdicts = judged(*earlier, probe(T0))

    # The first left the 24-hour window; the second is still in it.
    assert verdicts == [WINDOW_SUM]


def test_a_warm_up_call_counts_by_its_recorded_outcome_not_the_draft_s() -> None:
    looser = default_policy(auto_approve_below_cents=50_000)
    rejected = held("rejected", decided_at=T0 - 50 * MINUTE)

    verdicts = judged(
        call(T0 - HOUR, 4_000, ONE_REVIEWER, confirmation=rejected),
        probe(T0, 47_000),
        policy=looser,
    )

    # Under the draft it would have run (and counted); it was really rejected, and does not.
    assert verdicts == [AUTO]


def test_a_refused_call_counts_nothing() -> None:
    verdicts = judged(call(T0, 4_000, REFUSED), probe(T0 + MINUTE))

    assert verdicts == [AUTO]


def test_the_draft_s_own_verdicts_count_for_the_calls_after_them() -> None:
    stricter = default_policy(auto_approve_below_cents=3_000)

    verdicts = judged(
        # Really held and rejected; the draft runs it: its money counts from then on.
        probe(T0, 2_000, outcome=ONE_REVIEWER, confirmation=held("rejected", decided_at=T0)),
        # Really run without a human; the draft holds it: approved at once, it counts too.
        probe(T0 + MINUTE, 2_000),
        probe(T0 + 2 * MINUTE, 500),
        policy=stricter,
    )

    assert verdicts == [AUTO, WINDOW_SUM, WINDOW_SUM]


# Possible duplicates -----------------------------------------------------------------------------


def test_a_live_twin_from_another_session_makes_a_possible_duplicate() -> None:
    twin = call(T0, 1_500, ONE_REVIEWER, order="ORD-7", confirmation=held("pending"))

    verdicts = judged(twin, probe(T0 + MINUTE, order="ORD-7"))

    assert verdicts == [(ONE_REVIEWER, "possible_duplicate")]


def test_a_twin_no_longer_live_is_no_duplicate_and_one_of_the_same_session_is() -> None:
    policy = default_policy(auto_approve_window_seconds=3600, auto_approve_below_cents=10_000)

    gone = judged(
        call(T0, 1_500, order="ORD-7"), probe(T0 + 2 * HOUR, order="ORD-7"), policy=policy
    )
    # Another call of the same session (another key): the same money, whatever the session.
    same_session = judged(
        call(T0, 1_500, order="ORD-7", session="s-a"),
        probe(T0 + MINUTE, order="ORD-7", session="s-a"),
        policy=policy,
    )

    assert gone == [AUTO]
    assert same_session == [(ONE_REVIEWER, "possible_duplicate")]


# Reviewers and the daily cap -------------------------------------------------------------------


def test_held_money_counts_toward_two_reviewers() -> None:
    pending = call(T0, 15_000, ONE_REVIEWER, confirmation=held("pending"))

    verdicts = judged(pending, probe(T0 + MINUTE, 6_000))

    # 6000 alone needs one reviewer; with the 15000 held it makes 21000, from 20000 two.
    assert verdicts == [(TWO_REVIEWERS, "amount")]


def test_the_daily_cap_counts_the_agent_s_own_money_of_the_utc_day() -> None:
    capped = default_policy(daily_cap_cents=3_000, auto_approve_below_cents=50_000)
    midnight = datetime(2026, 1, 2, tzinfo=UTC)

    same_day = judged(call(midnight - HOUR, 2_000), probe(midnight - MINUTE), policy=capped)
    next_day = judged(call(midnight - HOUR, 2_000), probe(midnight), policy=capped)
    other_agent = judged(
        call(midnight - HOUR, 2_000, agent="agent-2"), probe(midnight - MINUTE), policy=capped
    )

    assert same_day == [(ONE_REVIEWER, "agent_daily_cap")]
    assert next_day == [AUTO]
    assert other_agent == [AUTO]


# What the replay reads, holds and touches ------------------------------------------------------


def test_the_history_fills_held_and_reviewed_money_as_a_store_does() -> None:
    sums = RunningSums()
    executed = held("executed", decided_at=T0, finished_at=T0 + MINUTE)
    calls = [
        call(T0, 1_000),
        call(T0, 2_000, ONE_REVIEWER, confirmation=executed),
        call(T0, 4_000, ONE_REVIEWER, confirmation=held("pending")),
    ]
    for past in calls:
        sums.add(past.call_id, past, money_phases(past, past.outcome, WINDOW))
    sums.advance(T0 + 2 * MINUTE)
    request = AllowanceRequest(
        "k", "agent-1", "s", "CUS-1", "refund_order", "ORD-x", "BRL", 100, T0, T0 - WINDOW
    )

    history = sums.history(request, 0)

    assert (history.customer_window_cents, history.customer_window_count) == (7_000, 3)
    assert (history.customer_held_cents, history.customer_reviewed_cents) == (4_000, 2_000)
    # The latest last: the executed one counts from its execution.
    assert [m.approval for m in history.customer_window] == [POLICY, HELD, REVIEWER]


def test_the_replay_reads_back_to_the_window_the_confirmations_and_the_utc_day() -> None:
    since = datetime(2026, 1, 10, 6, tzinfo=UTC)

    assert replay_from(default_policy(), since) == since - WINDOW
    short = default_policy(auto_approve_window_seconds=600, confirmation_ttl_seconds=600)
    assert replay_from(short, since) == datetime(2026, 1, 10, tzinfo=UTC)


def test_each_call_s_money_is_touched_a_bounded_number_of_times() -> None:
    policy = default_policy(auto_approve_window_seconds=3600)
    calls = []
    for n in range(20_000):
        at = T0 + n * MINUTE
        if n % 4 == 0:
            # Held in turn: executed (three phases), pending (one), rejected (one).
            confirmation = [
                held("executed", decided_at=at + MINUTE, finished_at=at + 2 * MINUTE),
                held("pending", expires_at=at + HOUR),
                held("rejected", decided_at=at + MINUTE),
            ][n % 3]
            calls.append(call(at, 700, ONE_REVIEWER, confirmation=confirmation))
        else:
            calls.append(call(at, 700, judged=n % 4 == 1))
    sums = RunningSums()

    verdicts: list[Verdict] = list(policy_replay(policy, iter(calls), sums=sums))

    assert len(verdicts) == 5_000
    # Each call's money enters, changes phase at most twice and leaves: at most four changes.
    assert sums.changes <= 4 * len(calls)
    # What it holds is what counts at once: about an hour of calls, never the 20,000.
    assert sums.most_live <= 3 * 60


# Against the core itself ---------------------------------------------------------------------

# The codes of the calls a what-if judges again, and the outcome each records (as
# analytics.selectors reads them from the audit records).
RECORDED = {"OK": AUTO_EXECUTED, "CONFIRMATION_REQUIRED": ONE_REVIEWER, "POLICY_LIMIT": REFUSED}


def test_the_core_s_own_history_judged_again_under_its_policy_goes_every_way_it_went() -> None:
    harness = build_harness()
    customers = [f"CUS-{number}" for number in range(11, 17)]
    orders = {
        customer: [f"ORD-{number}{n}" for n in range(3)]
        for number, customer in enumerate(customers, 7)
    }
    for customer, ids in orders.items():
        for order_id in ids:
            harness.book.add(order_id, customer, 10**9, "BRL")
    # Holds for the amount, the sum, a twin and the daily cap; refusals above 7000.
    policy = default_policy(max_amount_cents=7_000, daily_cap_cents=6_000)
    rng = random.Random(7)
    fates: dict[str, tuple[str, datetime]] = {}
    decisions: list[tuple[datetime, str, bool]] = []
    sent: list[tuple[str, str, int]] = []
    kinds: set[str] = set()
    for step in range(600):
        harness.clock.now += rng.randint(1, 40) * MINUTE
        # Reviewers decide at their moment, before the calls that come after it.
        while decisions and decisions[0][0] <= harness.clock.now:
            at, confirmation_id, approved = heapq.heappop(decisions)
            harness.state.held_decided(confirmation_id, approved=approved, at=at)
            fates[confirmation_id] = ("approved" if approved else "rejected", at)
        customer = rng.choice(customers)
        if rng.random() < 0.2 and sent:
            # A twin: an earlier refund's order and amount, from another session.
            customer, order, amount = rng.choice(sent)
        else:
            order = rng.choice(orders[customer])
            amount = rng.choice([500, 1_200, 2_500, 4_000, 6_000, 7_500])
        sent.append((customer, order, amount))
        result = harness.call(
            "refund_order",
            json.dumps(
                {"order_id": order, "amount_cents": amount, "currency": "BRL", "reason": "damaged"}
            ),
            session=f"s-{step}",
            customer=customer,
            agent=rng.choice(["agent-1", "agent-1", "agent-2"]),
            policy=policy,
        )
        if result.code == "CONFIRMATION_REQUIRED":
            kinds.add(result.data["reason"]["kind"])
            draw = rng.random()
            if draw < 0.7:
                # Within the confirmation's hour, or never (it expires).
                decided_at = harness.clock.now + rng.randint(1, 59) * MINUTE
                heapq.heappush(decisions, (decided_at, result.data["confirmation_id"], draw < 0.4))
        elif result.code == "POLICY_LIMIT":
            kinds.add(REFUSED)
    since = T0 + (harness.clock.now - T0) / 2

    calls = [_recorded(entry, harness, fates, since) for entry in harness.state.audit]
    replayed = what_if_of(policy, [past for past in calls if past is not None])

    assert kinds >= {"amount", "window_sum", "possible_duplicate", "agent_daily_cap", REFUSED}
    assert replayed.calls > 100
    assert replayed.actual == replayed.draft
    assert replayed.moves == ()


def _recorded(
    entry: AuditEntry, harness: Harness, fates: dict[str, tuple[str, datetime]], since: datetime
) -> PastCall | None:
    """An audit entry as the what-if reads it, with its confirmation's fate."""
    if entry.replayed or entry.code not in RECORDED or entry.arguments is None:
        return None
    outcome, confirmation = RECORDED[entry.code], None
    if entry.confirmation_id:
        held = harness.state.confirmations[entry.confirmation_id]
        status, decided_at = fates.get(entry.confirmation_id, ("pending", None))
        confirmation = Confirmed(status, held.expires_at, decided_at, None, held.reviewers_required)
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
