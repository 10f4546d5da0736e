"""The demo's reviewer queue: held refunds in every state a reviewer meets.

ORD-1001 and ORD-1007 are left as they were, and CUS-4 gets no USD refund: the README's
walk-through starts from them (tests/toolgate/test_readme.py sends it to a seeded demo).

Everything goes through the product itself: the demo agent's calls through the pipeline
(call_dispatch), decisions through the approval services, executions through the task they
enqueue, and the outcome the gateway loses through its own fault switch. Only what takes the
clock hours is done by hand, by the one function below whose name says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.selectors import effective_status
from approvals.services import (
    ConfirmationError,
    confirmation_approve,
    confirmation_expire,
    confirmation_reject,
)
from dispatch.models import Agent, Confirmation, IdempotencyRecord, Movement
from dispatch.services import call_dispatch
from orders.services import gateway_faults_set

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Refund:
    session_id: str
    customer_id: str
    order_id: str
    amount_cents: int
    currency: str
    reason: str
    context: str = ""

    def arguments(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "currency": self.currency,
            "reason": self.reason,
        }


def demo_queue_seed(*, agent: Agent, reviewer: User, second_reviewer: User, say: Say) -> None:
    """Fill the queue once; a demo agent that already has held calls keeps them."""
    existing = Confirmation.objects.filter(agent=agent).count()
    if existing:
        say(f"Reviewer queue: {existing} held calls already there, kept as they are.")
        return
    seeder = _Seeder(agent, say)
    try:
        _seed(seeder, reviewer, second_reviewer)
    finally:
        seeder.report()


def _seed(seeder: _Seeder, reviewer: User, second_reviewer: User) -> None:

    # What the model tried before: a read, then the wrong currency, then the call that is held.
    seeder.call("demo-ana", "CUS-1", "get_order", {"order_id": "ORD-1003"})
    seeder.call(
        "demo-ana",
        "CUS-1",
        "refund_order",
        {"order_id": "ORD-1003", "amount_cents": 12_000, "currency": "USD", "reason": "damaged"},
    )
    seeder.hold(
        Refund(
            "demo-ana",
            "CUS-1",
            "ORD-1003",
            12_000,
            "BRL",
            "damaged",
            context="Customer: the blender arrived with a cracked jar. Photos are in ticket #4411.",
        ),
        "after a read and a refund in the wrong currency",
    )
    soon = seeder.hold(
        Refund(
            "demo-bruno",
            "CUS-4",
            "ORD-1008",
            9_900,
            "BRL",
            "not_delivered",
            context="Tracking says delivered, but to another street. The customer would rather "
            "have the money back than wait for a second parcel.",
        ),
        "expires in a few minutes; the host sent context",
    )
    if soon is not None:
        demo_only_move_expiry(soon, timezone.now() + timedelta(minutes=12))

    # A small refund runs without a human; the next one for the same customer adds up to the
    # amount a human must see.
    seeder.call(
        "demo-carla",
        "CUS-2",
        "refund_order",
        {
            "order_id": "ORD-1002",
            "amount_cents": 3_000,
            "currency": "USD",
            "reason": "customer_request",
        },
    )
    seeder.hold(
        Refund("demo-carla", "CUS-2", "ORD-1004", 2_500, "USD", "damaged"),
        "held for what the customer already got without a human",
    )

    dual = seeder.hold(
        Refund("demo-dora", "CUS-3", "ORD-1006", 35_000, "EUR", "damaged"),
        "needs two reviewers; reviewer2's approval (above their limit) is a vote",
    )
    if dual is not None:
        seeder.decide(
            lambda: confirmation_approve(
                confirmation_id=dual.pk, reviewer=second_reviewer, confirmed=True
            )
        )

    executed = seeder.hold(
        Refund("demo-eva", "CUS-1", "ORD-1003", 6_000, "BRL", "damaged"),
        "approved by reviewer",
    )
    if executed is not None:
        seeder.decide(
            lambda: confirmation_approve(
                confirmation_id=executed.pk, reviewer=reviewer, confirmed=True
            )
        )

    rejected = seeder.hold(
        Refund("demo-fabio", "CUS-3", "ORD-1005", 7_500, "EUR", "customer_request"),
        "rejected by reviewer, with a reason",
    )
    if rejected is not None:
        seeder.decide(
            lambda: confirmation_reject(
                confirmation_id=rejected.pk,
                reviewer=reviewer,
                reason="Outside the 30-day return window: offer store credit instead.",
            )
        )

    expired = seeder.hold(
        Refund("demo-gil", "CUS-2", "ORD-1004", 8_000, "USD", "not_delivered"),
        "nobody decided in time",
    )
    if expired is not None:
        demo_only_move_expiry(expired, timezone.now() - timedelta(minutes=1))
        confirmation_expire(confirmation_id=expired.pk)

    if not settings.TOOLGATE_GATEWAY_FAULTS:
        seeder.notes.append(
            "gateway faults are switched off: no failed or unknown execution to show"
        )
        return
    failed = seeder.hold(
        Refund("demo-iris", "CUS-1", "ORD-1003", 5_000, "BRL", "customer_request"),
        "approved; the gateway was down for every attempt, nothing moved",
    )
    if failed is not None:
        gateway_faults_set(fail_before_commit=10)
        try:
            seeder.decide(
                lambda: confirmation_approve(
                    confirmation_id=failed.pk, reviewer=reviewer, confirmed=True
                )
            )
        finally:
            gateway_faults_set()
    unknown = seeder.hold(
        Refund("demo-hugo", "CUS-4", "ORD-1008", 20_000, "BRL", "damaged"),
        "approved; the gateway refunded and lost every answer: see Reconciliation",
    )
    if unknown is not None:
        gateway_faults_set(lose_response_after_commit=10)
        try:
            seeder.decide(
                lambda: confirmation_approve(
                    confirmation_id=unknown.pk, reviewer=reviewer, confirmed=True
                )
            )
        finally:
            gateway_faults_set()


def demo_only_move_expiry(confirmation: Confirmation, expires_at: Any) -> None:
    """Demo only: move a held call's expiry, so that the queue shows one about to expire and
    one expired without waiting a day. Nothing else in the product changes an expiry."""
    Confirmation.objects.filter(pk=confirmation.pk).update(expires_at=expires_at)
    IdempotencyRecord.objects.filter(key=confirmation.key).update(
        confirmation_expires_at=expires_at
    )
    # Its money, held, counts until the same moment.
    Movement.objects.filter(key=confirmation.execution_key).update(expires_at=expires_at)
    confirmation.expires_at = expires_at


class _Seeder:
    def __init__(self, agent: Agent, say: Say) -> None:
        self.agent = agent
        self.say = say
        self.held: list[tuple[Confirmation, str]] = []
        self.notes: list[str] = []

    def report(self) -> None:
        """Each held call as it stands now, in the reviewer's words."""
        self.say("Reviewer queue (held calls of the demo agent):")
        for confirmation, what in self.held:
            confirmation.refresh_from_db()
            order_id = confirmation.arguments.get("order_id", "")
            currency = confirmation.arguments.get("currency", "")
            status = effective_status(confirmation)
            self.say(
                f"  {order_id:<9}{confirmation.amount_cents:>6} {currency}  {status:<9} {what}"
            )
        for note in self.notes:
            self.say(f"  ({note})")

    def call(self, session_id: str, customer_id: str, tool: str, arguments: dict[str, Any]) -> None:
        call_dispatch(
            agent=self.agent,
            session_id=session_id,
            customer_id=customer_id,
            tool=tool,
            arguments=arguments,
        )

    def hold(self, refund: Refund, what: str) -> Confirmation | None:
        result = call_dispatch(
            agent=self.agent,
            session_id=refund.session_id,
            customer_id=refund.customer_id,
            tool="refund_order",
            arguments=refund.arguments(),
            context=refund.context,
        )
        if result.code != "CONFIRMATION_REQUIRED":
            # A demo database whose orders were changed by hand: say so and go on.
            self.notes.append(f"{refund.order_id} was not held: {result.code} {result.message}")
            return None
        confirmation = Confirmation.objects.get(pk=result.data["confirmation_id"])
        self.held.append((confirmation, what))
        return confirmation

    def decide(self, decision: Callable[[], Confirmation]) -> None:
        try:
            decision()
        except ConfirmationError as exc:
            self.notes.append(f"not decided: {exc.message}")
