"""The in-memory state's running sums (dispatch/pipeline/window.py) answer every request as a
reading of every live movement would: the customer's sum, its count, what is on its way and what
a reviewer moved, the latest movements, the repeats (over their own look-back, whatever the
session) and the agent's day, over random histories of
reservations, releases, decisions and executions, with money leaving the window and held money
expiring, and with time that sometimes steps back or windows of another length."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.pipeline.allowance import (
    APPROVED,
    HELD,
    MOVED,
    ON_ITS_WAY,
    POLICY,
    REVIEWER,
    SHOWN,
    AllowanceHistory,
    AllowanceRequest,
    HoldReason,
    Movement,
    execution_key,
)
from dispatch.pipeline.state import InMemoryState

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
HOLD = HoldReason("amount", "held", {})
WINDOWS = (timedelta(hours=1), timedelta(hours=3), timedelta(hours=24))
# How far back possible duplicates are sought, where longer than the window.
LOOKBACKS = (timedelta(hours=2), timedelta(hours=48))


@dataclass
class BruteForce:
    """The allowance's figures read from every live movement at each request."""

    # key -> (customer, currency, movement, expires_at), in the order of reservation.
    movements: dict[str, tuple[str, str, Movement, datetime | None]] = field(default_factory=dict)

    def history(self, request: AllowanceRequest) -> AllowanceHistory:
        own = {request.key, request.held_key}
        window = [
            movement
            for key, (customer, currency, movement, expires_at) in self.movements.items()
            if customer == request.customer_id
            and currency == request.currency
            and key not in own
            and _counts(movement, expires_at, request)
        ]
        same = (request.tool, request.subject, request.amount_cents)
        # Possible duplicates are sought over the request's look-back, in any session.
        repeats = tuple(
            movement
            for key, (customer, currency, movement, expires_at) in self.movements.items()
            if customer == request.customer_id
            and currency == request.currency
            and key not in own
            and (movement.tool, movement.subject, movement.amount_cents) == same
            and _counts(movement, expires_at, request, since=request.twins_since)
        )
        day = sum(
            movement.amount_cents
            for _, currency, movement, _ in self.movements.values()
            if movement.approval == POLICY
            and movement.agent_id == request.agent_id
            and currency == request.currency
            and movement.at.date() == request.at.date()
        )
        return AllowanceHistory(
            customer_window_cents=sum(m.amount_cents for m in window),
            customer_window_count=len(window),
            customer_window=tuple(sorted(window, key=lambda m: m.at)[-SHOWN:]),
            agent_day_cents=day,
            repeats=repeats,
            customer_held_cents=sum(m.amount_cents for m in window if m.approval in ON_ITS_WAY),
            customer_reviewed_cents=sum(m.amount_cents for m in window if m.approval == REVIEWER),
        )

    def reserve(self, request: AllowanceRequest, hold: HoldReason | None) -> None:
        if hold is None:
            key, approval, expires_at = request.key, POLICY, None
        elif request.confirmation_id:
            key, approval, expires_at = request.held_key, HELD, request.held_until
        else:
            return
        movement = Movement(
            key,
            request.agent_id,
            request.session_id,
            request.tool,
            request.subject,
            request.amount_cents,
            request.at,
            approval,
            request.confirmation_id if approval != POLICY else "",
        )
        self.movements.pop(key, None)
        self.movements[key] = (request.customer_id, request.currency, movement, expires_at)

    def release(self, key: str) -> None:
        self.movements.pop(key, None)

    def decided(self, confirmation_id: str, *, approved: bool) -> None:
        key = execution_key(confirmation_id)
        if key not in self.movements:
            return
        if not approved:
            del self.movements[key]
            return
        customer, currency, movement, _ = self.movements[key]
        self.movements[key] = (customer, currency, movement._replace(approval=APPROVED), None)

    def executed(self, confirmation_id: str, at: datetime) -> None:
        key = execution_key(confirmation_id)
        if key not in self.movements:
            return
        customer, currency, movement, expires_at = self.movements[key]
        executed = movement._replace(approval=REVIEWER, at=at)
        self.movements[key] = (customer, currency, executed, expires_at)


def _counts(
    movement: Movement,
    expires_at: datetime | None,
    request: AllowanceRequest,
    since: datetime | None = None,
) -> bool:
    if movement.approval in MOVED:
        return movement.at >= (since or request.since)
    if movement.approval == HELD:
        return expires_at is None or expires_at > request.at
    return True


# One step of a history: what happens, and the choices it takes (each a small number).
Step = tuple[str, tuple[int, ...]]

_reserve = st.tuples(
    st.just("reserve"),
    st.tuples(
        st.integers(0, 1),  # customer
        st.integers(0, 1),  # currency
        st.integers(0, 1),  # agent
        st.integers(0, 2),  # session
        st.integers(0, 2),  # subject
        st.integers(0, 2),  # amount
        st.integers(0, 7),  # key, from a small pool: keys are reserved again
        st.integers(0, 5),  # confirmation, from a small pool; 0: none
        st.integers(0, 2),  # 0 moved, 1 held, 2 held without its confirmation's money
        st.integers(0, 2),  # window
        st.integers(1, 300),  # the confirmation's life, in minutes
        st.integers(0, 2),  # the duplicates' look-back
    ),
)
_time = st.tuples(
    st.just("time"),
    # Mostly forward, sometimes back (the frontier's other path), in minutes.
    st.tuples(st.one_of(st.integers(0, 240), st.integers(-120, 0))),
)
_release = st.tuples(st.just("release"), st.tuples(st.integers(0, 13)))
_decide = st.tuples(st.just("decide"), st.tuples(st.integers(1, 5), st.integers(0, 1)))
_execute = st.tuples(st.just("execute"), st.tuples(st.integers(1, 5)))
histories = st.lists(
    st.one_of(_reserve, _reserve, _reserve, _time, _time, _release, _decide, _execute),
    max_size=120,
)


@dataclass
class Replay:
    state: InMemoryState = field(default_factory=InMemoryState)
    brute: BruteForce = field(default_factory=BruteForce)
    now: datetime = T0
    judged: int = 0
    # The calls' keys are k0 to k{keys - 1}; the held money's, c1 to c{confirmations}'s.
    keys: int = 8
    confirmations: int = 5

    def run(self, steps: list[Step]) -> None:
        for name, choices in steps:
            getattr(self, name)(*choices)

    def time(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)

    def reserve(
        self,
        customer: int,
        currency: int,
        agent: int,
        session: int,
        subject: int,
        amount: int,
        key: int,
        confirmation: int,
        kind: int,
        window: int,
        life: int,
        lookback: int = 0,
    ) -> None:
        request = AllowanceRequest(
            key=f"k{key}",
            agent_id=f"agent-{agent}",
            session_id=f"s-{session}",
            customer_id=f"CUS-{customer}",
            tool="refund_order",
            subject=f"ORD-{subject}",
            currency=("BRL", "USD")[currency],
            amount_cents=(100, 250, 1000)[amount],
            at=self.now,
            since=self.now - WINDOWS[window],
            confirmation_id=f"c{confirmation}" if confirmation and kind != 2 else "",
            held_until=self.now + timedelta(minutes=life),
            twins_from=None if not lookback else self.now - LOOKBACKS[lookback - 1],
        )
        expected = self.brute.history(request)
        seen: list[AllowanceHistory] = []
        hold = None if kind == 0 else HOLD

        def judge(history: AllowanceHistory) -> HoldReason | None:
            seen.append(history)
            return hold

        history, _ = self.state.reserve_allowance(request, judge)

        assert seen == [history]
        assert history == expected
        self.brute.reserve(request, hold)
        self.judged += 1

    def release(self, key: int) -> None:
        name = f"k{key}" if key < self.keys else execution_key(f"c{key - self.keys + 1}")
        self.state.release_allowance(name)
        self.brute.release(name)

    def decide(self, confirmation: int, approved: int) -> None:
        self.state.held_decided(f"c{confirmation}", approved=bool(approved), at=self.now)
        self.brute.decided(f"c{confirmation}", approved=bool(approved))

    def execute(self, confirmation: int) -> None:
        self.state.held_executed(f"c{confirmation}", at=self.now)
        self.brute.executed(f"c{confirmation}", self.now)


@settings(max_examples=300, deadline=None)
@given(histories)
def test_the_running_sums_equal_a_reading_of_every_live_movement(steps: list[Step]) -> None:
    replay = Replay()

    replay.run(steps)

    assert {key: kept[:3] for key, kept in replay.brute.movements.items()} == (
        replay.state.movements
    )


KEYS, CONFIRMATIONS = 400, 200


def _long_history(rng: random.Random, length: int, back: float) -> list[Step]:
    """Many calls of two customers: hundreds count at once, and leave the window or expire by
    the hundred."""
    choose: dict[str, Callable[[], tuple[int, ...]]] = {
        "reserve": lambda: (
            rng.randrange(2),
            0,
            rng.randrange(2),
            rng.randrange(3),
            rng.randrange(3),
            rng.randrange(3),
            rng.randrange(KEYS),
            rng.randrange(CONFIRMATIONS + 1),
            rng.choice((0, 0, 0, 1, 2)),
            2 if rng.random() < 0.95 else rng.randrange(3),
            rng.randrange(1, 300),
        ),
        "time": lambda: (rng.randrange(-30, 0) if rng.random() < back else rng.randrange(0, 20),),
        "release": lambda: (rng.randrange(KEYS + CONFIRMATIONS),),
        "decide": lambda: (rng.randrange(1, CONFIRMATIONS + 1), rng.randrange(2)),
        "execute": lambda: (rng.randrange(1, CONFIRMATIONS + 1),),
    }
    names = ["reserve"] * 6 + ["time"] * 3 + ["release", "decide", "execute"]
    steps: list[Step] = []
    for _ in range(length):
        name = rng.choice(names)
        steps.append((name, choose[name]()))
    return steps


def test_the_running_sums_hold_over_long_histories() -> None:
    for seed, back in ((1, 0.0), (2, 0.02), (3, 0.2)):
        replay = Replay(keys=KEYS, confirmations=CONFIRMATIONS)

        replay.run(_long_history(random.Random(seed), 3_000, back))

        assert replay.judged > 1_000
        assert {key: kept[:3] for key, kept in replay.brute.movements.items()} == (
            replay.state.movements
        )


def test_a_repeat_past_the_window_within_the_look_back_is_found_in_its_own_session() -> None:
    replay = Replay()
    # customer, currency, agent, session, subject, amount, key, confirmation, kind, window, life
    replay.reserve(0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 60)
    replay.time(90)

    # The same refund in the same session under another key, 90 minutes later: past the 1 h
    # window, within the 2 h look-back (Replay.reserve asserts the state's history is the
    # brute force's).
    replay.reserve(0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 60, 1)

    (twin,) = replay.brute.history(
        AllowanceRequest(
            key="k3",
            agent_id="agent-0",
            session_id="s-0",
            customer_id="CUS-0",
            tool="refund_order",
            subject="ORD-0",
            currency="BRL",
            amount_cents=100,
            at=replay.now,
            since=replay.now - WINDOWS[0],
            twins_from=replay.now - LOOKBACKS[0],
        )
    ).repeats[:1]
    assert twin.key == "k1" and twin.session_id == "s-0"
