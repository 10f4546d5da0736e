"""Thirty days of agent traffic for the demo's dashboards.

simulate_agents' conversations are played in this process rather than over HTTP: each call goes
through the pipeline (call_dispatch) with the pipeline's clock set to its moment in the past, so
its audit record and held confirmation carry that time, and so do the rollups once filled. The
refunds held for a human are decided by the demo reviewers through the approval services, at
their decision's time (an approved one executes then too, as a worker would), in time order with
the calls: a call is judged after every decision made before its moment and before every one
made after, as it would have been, so the customer's sum it saw is the one the what-if's replay
of the recorded facts sees. Orders of its own keep the
README's orders as they were.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.services import (
    ConfirmationError,
    confirmation_approve,
    confirmation_execute,
    confirmation_expire,
    confirmation_reject,
)
from demo.simulation import DEFAULT_MIX, OrderFact, run_simulation
from dispatch.models import Agent, AuditRecord, Confirmation, ConfirmationStatus
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch
from orders.models import Order
from orders.services import order_create

RUN_ID = "history"
SESSION_PREFIX = f"sim-{RUN_ID}-"
DAYS = 30
SESSIONS = 600
SEED = 2026
CUSTOMERS = 30
ORDERS = 120
CURRENCIES = ("BRL", "BRL", "USD", "EUR")
SESSION_GAP = timedelta(minutes=15)
# What reviewers do with the held refunds: approve most, reject some, let a few expire.
APPROVE, REJECT = 0.72, 0.16
REJECTION_REASONS = (
    "Outside the return window: offer store credit instead.",
    "The customer already got a replacement for this order.",
    "Not the amount the customer asked for: ask them again.",
    "Needs a photo of the damage first.",
)

Say = Callable[[str], None]


@dataclass(order=True)
class _Decision:
    """What a demo reviewer does to a held refund, and when."""

    at: datetime
    seq: int
    confirmation_id: str = field(compare=False)
    # "approve" (one reviewer's approval; another follows if it is still pending), "reject".
    action: str = field(compare=False)
    reviewers: list[User] = field(compare=False, default_factory=list)


class _Reviewers:
    """The demo reviewers' decisions, made in time order with the calls."""

    def __init__(self, reviewers: list[User], rng: random.Random, now: datetime) -> None:
        self.reviewers = reviewers
        self.rng = rng
        self.now = now
        self.due: list[_Decision] = []
        self.seq = itertools.count()
        self.decided = 0

    def held(self, confirmation_id: str, held_at: datetime) -> None:
        """Plan the decision of a refund held at that moment: most approved, some rejected, a few
        left to expire; minutes to hours later (a log-normal wait, with a median of about 20
        minutes)."""
        draw = self.rng.random()
        wait = timedelta(minutes=min(self.rng.lognormvariate(math.log(20), 1.1), 20 * 60))
        at = min(held_at + wait, self.now - timedelta(minutes=1))
        if draw < APPROVE:
            # One approval, or a vote and then another reviewer's: the sum or the policy may
            # need two, or a reviewer whose limit covers the sum.
            order = self.rng.sample(self.reviewers, len(self.reviewers))
            self._plan(_Decision(at, next(self.seq), confirmation_id, "approve", order))
        elif draw < APPROVE + REJECT:
            self._plan(_Decision(at, next(self.seq), confirmation_id, "reject"))

    def until(self, moment: datetime) -> None:
        """Make every decision due by `moment`, in order."""
        while self.due and self.due[0].at <= moment:
            self._make(heapq.heappop(self.due))

    def _plan(self, decision: _Decision) -> None:
        heapq.heappush(self.due, decision)

    def _make(self, decision: _Decision) -> None:
        try:
            if decision.action == "reject":
                confirmation_reject(
                    confirmation_id=decision.confirmation_id,
                    reviewer=self.rng.choice(self.reviewers),
                    reason=self.rng.choice(REJECTION_REASONS),
                    now=decision.at,
                )
                self.decided += 1
                return
            reviewer, *others = decision.reviewers
            with transaction.atomic():
                confirmation = confirmation_approve(
                    confirmation_id=decision.confirmation_id,
                    reviewer=reviewer,
                    now=decision.at,
                    # The history's reviewers decided with a second look where one was asked.
                    confirmed=True,
                )
                if confirmation.status == ConfirmationStatus.APPROVED:
                    # Executed at once, as a worker would: its money moved at the decision's
                    # time, not when the demo was seeded. The execution the approval sends on
                    # commit then finds it done.
                    confirmation = confirmation_execute(
                        confirmation_id=decision.confirmation_id, now=decision.at
                    )
        except ConfirmationError:
            return
        if confirmation.status != ConfirmationStatus.PENDING:
            self.decided += 1
        elif others:
            later = min(decision.at + timedelta(minutes=self.rng.randint(2, 30)), self.now)
            self._plan(
                _Decision(later, next(self.seq), decision.confirmation_id, "approve", others)
            )


class HistoryClient:
    """What a simulated conversation calls: the pipeline in this process, each session at its
    own moment, a few seconds later for each of its calls, after the reviewers' decisions due by
    then."""

    def __init__(
        self,
        agent: Agent,
        starts: Mapping[str, datetime],
        rng: random.Random,
        reviewers: _Reviewers,
    ) -> None:
        self.agent = agent
        self.moments = dict(starts)
        self.rng = rng
        self.reviewers = reviewers

    def codes(self) -> list[dict[str, Any]]:
        return [code.as_dict() for code in tool_registry.catalogue]

    def call(
        self, *, session_id: str, customer_id: str, tool: str, arguments: str | Mapping[str, Any]
    ) -> dict[str, Any]:
        at = self.moments[session_id]
        self.moments[session_id] = at + timedelta(seconds=self.rng.randint(4, 45))
        self.reviewers.until(at)
        result = call_dispatch(
            agent=self.agent,
            session_id=session_id,
            customer_id=customer_id,
            tool=tool,
            arguments=arguments,
            clock=lambda: at,
        )
        if result.code == "CONFIRMATION_REQUIRED" and not result.replayed:
            self.reviewers.held(str(result.data["confirmation_id"]), at)
        return result.as_dict()


def demo_history_seed(
    *, agent: Agent, reviewers: Iterable[User], say: Say, sessions: int = SESSIONS
) -> None:
    """Play the history once; an agent that has it already keeps it."""
    if AuditRecord.objects.filter(agent=agent, session_id__startswith=SESSION_PREFIX).exists():
        say("Traffic of the last 30 days: already there, kept as it is.")
        return
    rng = random.Random(SEED)
    now = timezone.now()
    orders = _orders(rng)
    starts = _moments(rng, now, sessions)
    decisions = _Reviewers(list(reviewers), rng, now)
    client = HistoryClient(agent, starts, rng, decisions)
    step = max(1, sessions // 10)

    def progress(done: int, calls: int) -> None:
        if done % step == 0 or done == sessions:
            say(f"  {done}/{sessions} sessions, {calls} calls")

    say(f"Traffic of the last {DAYS} days: {sessions} simulated sessions through the pipeline...")
    # Each execution a decision enqueues runs in this process and would log a line.
    trace = logging.getLogger("celery.app.trace")
    level = trace.level
    trace.setLevel(logging.WARNING)
    try:
        report = run_simulation(
            client=client,
            orders=orders,
            sessions=sessions,
            mix=DEFAULT_MIX,
            seed=SEED,
            run_id=RUN_ID,
            progress=progress,
        )
        decisions.until(now)
        decided = decisions.decided + _expire(agent, now)
    finally:
        trace.setLevel(level)
    say(f"  {len(report.calls)} calls; {decided} held refunds decided by the demo reviewers.")


def _moments(rng: random.Random, now: datetime, sessions: int) -> dict[str, datetime]:
    """When each session starts: over the last 30 days, more in working hours and on weekdays,
    growing a little over the month; in order, so session N starts before session N + 1."""
    moments: list[datetime] = []
    while len(moments) < sessions:
        age = timedelta(days=rng.uniform(0, DAYS))
        at = now - age
        weekday, hour = at.weekday(), at.hour
        weight = (1.0 if weekday < 5 else 0.45) * (0.25 + math.sin(math.pi * hour / 24) ** 2)
        weight *= 1.0 - 0.4 * age / timedelta(days=DAYS)
        if rng.random() < weight and age > timedelta(minutes=30):
            moments.append(at.replace(microsecond=0))
    # A session lasts minutes: starting each at least a quarter of an hour after the one before
    # keeps their calls in time order, as the decisions between them are.
    ordered: list[datetime] = []
    for at in sorted(moments):
        ordered.append(max(at, ordered[-1] + SESSION_GAP) if ordered else at)
    return {f"{SESSION_PREFIX}{i:05d}": at for i, at in enumerate(ordered) if at < now}


def _orders(rng: random.Random) -> list[OrderFact]:
    """The history's own orders, made once."""
    facts = []
    for number in range(ORDERS):
        order_id = f"ORD-{7001 + number}"
        customer_id = f"CUS-{11 + number % CUSTOMERS}"
        order = Order.objects.filter(order_id=order_id).first()
        if order is None:
            order = order_create(
                order_id=order_id,
                customer_id=customer_id,
                total_cents=rng.randrange(2_000, 60_000, 10),
                currency=rng.choice(CURRENCIES),
            )
        facts.append(
            OrderFact(
                order.order_id,
                order.customer_id,
                order.total_cents,
                order.currency,
                order.refunded_cents,
            )
        )
    return facts


def _expire(agent: Agent, now: datetime) -> int:
    """The held refunds nobody decided, expired at their expiry; how many."""
    due = Confirmation.objects.filter(
        agent=agent,
        session_id__startswith=SESSION_PREFIX,
        status=ConfirmationStatus.PENDING,
        expires_at__lt=now,
    ).order_by("expires_at")
    for confirmation in due:
        confirmation_expire(confirmation_id=confirmation.pk, now=confirmation.expires_at)
    return len(due)
