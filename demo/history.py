"""Thirty days of agent traffic for the demo's dashboards.

simulate_agents' conversations are played in this process rather than over HTTP: each call goes
through the pipeline (call_dispatch) with the pipeline's clock set to its moment in the past, so
its audit record, rollups and held confirmation carry that time. The refunds held for a human are
then decided by the demo reviewers through the approval services, at their decision's time.
Orders of its own keep the README's orders as they were.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from approvals.services import (
    ConfirmationError,
    confirmation_approve,
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
# What reviewers do with the held refunds: approve most, reject some, let a few expire.
APPROVE, REJECT = 0.72, 0.16
REJECTION_REASONS = (
    "Outside the return window: offer store credit instead.",
    "The customer already got a replacement for this order.",
    "Not the amount the customer asked for: ask them again.",
    "Needs a photo of the damage first.",
)

Say = Callable[[str], None]


class HistoryClient:
    """What a simulated conversation calls: the pipeline in this process, each session at its
    own moment, a few seconds later for each of its calls."""

    def __init__(self, agent: Agent, starts: Mapping[str, datetime], rng: random.Random) -> None:
        self.agent = agent
        self.moments = dict(starts)
        self.rng = rng

    def codes(self) -> list[dict[str, Any]]:
        return [code.as_dict() for code in tool_registry.catalogue]

    def call(
        self, *, session_id: str, customer_id: str, tool: str, arguments: str | Mapping[str, Any]
    ) -> dict[str, Any]:
        at = self.moments[session_id]
        self.moments[session_id] = at + timedelta(seconds=self.rng.randint(4, 45))
        result = call_dispatch(
            agent=self.agent,
            session_id=session_id,
            customer_id=customer_id,
            tool=tool,
            arguments=arguments,
            clock=lambda: at,
        )
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
    client = HistoryClient(agent, starts, rng)
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
        decided = _decide(agent, list(reviewers), rng, now)
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
    return {f"{SESSION_PREFIX}{i:05d}": at for i, at in enumerate(sorted(moments))}


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


def _decide(agent: Agent, reviewers: list[User], rng: random.Random, now: datetime) -> int:
    """Each held refund of the history decided as reviewers do, minutes to hours after it was
    held (a few are left to expire), through the approval services at that moment."""
    held = Confirmation.objects.filter(
        agent=agent, session_id__startswith=SESSION_PREFIX, status=ConfirmationStatus.PENDING
    ).order_by("created_at")
    decided = 0
    for confirmation in held:
        draw = rng.random()
        # Minutes to hours: a log-normal wait, with a median of about 20 minutes.
        wait = timedelta(minutes=min(rng.lognormvariate(math.log(20), 1.1), 20 * 60))
        at = min(confirmation.created_at + wait, now - timedelta(minutes=1))
        try:
            if draw < APPROVE:
                # One approval, or a vote and then another reviewer's: the amount or the
                # policy may need two, or a reviewer whose limit is above the amount.
                for reviewer in rng.sample(reviewers, len(reviewers)):
                    confirmation = confirmation_approve(
                        confirmation_id=confirmation.pk, reviewer=reviewer, now=at
                    )
                    if confirmation.status != ConfirmationStatus.PENDING:
                        break
                    at = min(at + timedelta(minutes=rng.randint(2, 30)), now)
            elif draw < APPROVE + REJECT:
                confirmation_reject(
                    confirmation_id=confirmation.pk,
                    reviewer=rng.choice(reviewers),
                    reason=rng.choice(REJECTION_REASONS),
                    now=at,
                )
            elif confirmation.expires_at < now:
                confirmation_expire(confirmation_id=confirmation.pk, now=confirmation.expires_at)
            else:
                continue
        except ConfirmationError:
            continue
        decided += 1
    return decided
