"""The core on its own: an in-memory state, an in-memory order book, no database."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch.pipeline import InMemoryState, Pipeline, Policy, ToolCall, ToolRegistry
from dispatch.pipeline.engine import Limits, RetryPolicy
from dispatch.pipeline.results import CallResult
from orders.book import InMemoryOrderBook
from orders.tools import order_tools


@dataclass
class FakeClock:
    now: datetime = field(default_factory=lambda: datetime(2026, 1, 1, 12, tzinfo=UTC))
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return (self.now - datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)


def default_policy(**overrides: Any) -> Policy:
    values: dict[str, Any] = {
        "version": 1,
        "allowed_tools": frozenset({"get_order", "refund_order"}),
        "max_amount_cents": 50_000,
        "auto_approve_below_cents": 5_000,
        "two_reviewers_from_cents": 20_000,
        "step_budget": 20,
        "repeat_limit": 3,
        "confirmation_ttl_seconds": 3600,
    }
    values.update(overrides)
    return Policy(**values)


@dataclass
class Harness:
    pipeline: Pipeline
    state: InMemoryState
    book: InMemoryOrderBook
    clock: FakeClock
    policy: Policy

    def call(
        self,
        tool: str,
        arguments: str | dict[str, Any],
        *,
        session: str = "s-1",
        customer: str = "CUS-1",
        agent: str = "agent-1",
        policy: Policy | None = None,
    ) -> CallResult:
        return self.pipeline.run(
            ToolCall(
                agent_id=agent,
                session_id=session,
                customer_id=customer,
                tool=tool,
                arguments=arguments,
            ),
            policy or self.policy,
        )

    def refund(self, amount_cents: int = 1000, **extra: Any) -> CallResult:
        arguments = {
            "order_id": "ORD-1001",
            "amount_cents": amount_cents,
            "currency": "BRL",
            "reason": "damaged",
        }
        arguments.update(extra.pop("arguments", {}))
        return self.call("refund_order", json.dumps(arguments), **extra)

    @property
    def ledger_rows(self) -> int:
        return len(self.book.receipts)

    def refunded_cents(self, order_id: str = "ORD-1001") -> int:
        return self.book.orders[order_id].refunded_cents


def build_harness() -> Harness:
    book = InMemoryOrderBook()
    book.add("ORD-1001", "CUS-1", 12_000, "BRL")
    book.add("ORD-1002", "CUS-2", 4_500, "USD")
    book.add("ORD-2003", "CUS-1", 90_000, "BRL")
    book.add("ORD-2004", "CUS-1", 9_000, "USD")
    book.add("ORD-2005", "CUS-3", 9_000, "BRL")
    registry = ToolRegistry()
    for spec in order_tools(book):
        registry.register(spec)
    state = InMemoryState()
    clock = FakeClock()
    ids = iter(range(1, 1_000_000))
    new_id: Callable[[], str] = lambda: f"id-{next(ids)}"  # noqa: E731
    pipeline = Pipeline(
        registry,
        state,
        limits=Limits(max_argument_bytes=2048, in_progress_wait_seconds=0.1),
        retry=RetryPolicy(attempts=3, base_delay_seconds=0.05),
        clock=clock,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
        new_id=new_id,
    )
    return Harness(pipeline, state, book, clock, default_policy())


@pytest.fixture
def harness() -> Harness:
    return build_harness()
