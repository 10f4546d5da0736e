"""A held call's money and idempotency key, as its decision and its execution move them.

approvals.services calls these inside its own transactions; nothing else writes a held call's
movement or its key's record after the hold. The money (dispatch.models.Movement, under the
confirmation's execution key) goes:

    held (counts until the expiry) → approved (counts until the execution ends)
        → moved with a reviewer (executed) | released (failed)
    held → released (rejected, expired, invalidated)
    held → released, and the edited call's amount held under its own key (edited: superseded)

Lock order, the same everywhere, so that decisions and calls never wait on each other in a
circle:

- a decision (approve, reject, expire, an execution's end, a reconciliation) takes its customer's
  decision lock (`decision_lock`), then the confirmation's row, then its key's record;
- a call takes its own key's record, then the customer's money lock (dispatch/store/allowance.py),
  then what its effect writes, and keeps them all until it commits; where a policy caps the
  agent's day, it takes the money locks on a connection of its own instead, and commits that
  before its effect.

A decision never takes a money lock, and a call never the decision lock, a confirmation's row or
another call's key: a call's reservation cannot wait for a decision, and a decision waits at most
for the rows a call's effect writes, which that call takes last. Decisions of one customer take
turns, so that two twins approved at the same moment see each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection
from django.utils import timezone

from dispatch.models import Confirmation, IdempotencyRecord, Movement, MovementApproval
from dispatch.pipeline.allowance import AllowanceHistory, AllowanceRequest, HeldSum, held_sum
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.state import KeyStatus
from dispatch.registry import tool_registry
from dispatch.store.allowance import allowance_read

_DECISION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def decision_lock(*, customer_id: str) -> None:
    """Take the customer's decision lock until the transaction ends (PostgreSQL; SQLite lets one
    transaction write at a time, which serialises decisions already)."""
    if not connection.in_atomic_block:
        raise RuntimeError("a decision lock is taken inside the decision's transaction")
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(_DECISION_LOCK, [f"toolgate.decide:{customer_id}"])


def held_money_of(confirmation: Confirmation) -> tuple[str, str]:
    """The currency and the subject of a held call's money, as the hold kept them."""
    reserved = (
        Movement.objects.filter(key=confirmation.execution_key)
        .values_list("currency", "subject")
        .first()
    )
    if reserved is not None:
        return reserved
    # Released since, or a held call that moves no money: its subject from its arguments.
    spec = tool_registry.get(confirmation.tool)
    arguments = confirmation.arguments if isinstance(confirmation.arguments, Mapping) else {}
    subject = ""
    if spec is not None and spec.subject_field:
        subject = str(arguments.get(spec.subject_field, ""))
    return confirmation.currency, subject


class HeldStanding(NamedTuple):
    """A held call's sum, and the customer's other money in the window that makes it, as the
    approval reads and judges them (the latest few movements, and how many there are)."""

    held: HeldSum
    history: AllowanceHistory


def held_money_sum(
    *, confirmation: Confirmation, policy: Policy, now: datetime | None = None
) -> HeldSum | None:
    """The sum the held call makes now with the customer's other money in the policy's window,
    and the reviewers that sum needs; None for a call that moves no amount."""
    standing = held_money_standing(confirmation=confirmation, policy=policy, now=now)
    return None if standing is None else standing.held


def held_money_standing(
    *, confirmation: Confirmation, policy: Policy, now: datetime | None = None
) -> HeldStanding | None:
    """held_money_sum, with the history it was judged by: what a reviewer is shown beside it."""
    if confirmation.amount_cents is None:
        return None
    now = now or timezone.now()
    currency, subject = held_money_of(confirmation)
    request = AllowanceRequest(
        key=confirmation.key,
        agent_id=str(confirmation.agent_id),
        session_id=confirmation.session_id,
        customer_id=confirmation.customer_id,
        tool=confirmation.tool,
        subject=subject,
        currency=currency,
        amount_cents=confirmation.amount_cents,
        at=now,
        since=now - timedelta(seconds=policy.auto_approve_window_seconds),
        agent_day_needed=False,
        confirmation_id=confirmation.pk,
        twins_from=policy.twins_since(now),
    )
    with connection.cursor() as cursor:
        history = allowance_read(request, cursor=cursor)
    return HeldStanding(held_sum(policy, request, history), history)


def held_money_approved(*, confirmation: Confirmation) -> None:
    """Approved: its money counts until its execution ends, whatever its expiry said."""
    _reservation(confirmation).filter(released_at=None).update(
        approval=MovementApproval.APPROVED, expires_at=None
    )


def held_money_released(*, confirmation: Confirmation, now: datetime) -> None:
    """Rejected, expired, invalidated, or failed for certain: its money no longer counts."""
    _reservation(confirmation).filter(released_at=None).update(released_at=now)


def held_money_executed(*, confirmation: Confirmation, now: datetime) -> None:
    """Executed: its money is moved with a reviewer's approval, from now, under the same key."""
    currency, subject = held_money_of(confirmation)
    assert confirmation.amount_cents is not None
    Movement.objects.update_or_create(
        key=confirmation.execution_key,
        defaults={
            "agent_id": confirmation.agent_id,
            "session_id": confirmation.session_id,
            "customer_id": confirmation.customer_id,
            "currency": currency,
            "tool": confirmation.tool,
            "subject": subject,
            "amount_cents": confirmation.amount_cents,
            "approval": MovementApproval.REVIEWER,
            "at": now,
            "day": now.date(),
            "released_at": None,
            "expires_at": None,
            "confirmation_id": confirmation.pk,
        },
    )


def held_money_edited(*, original: Confirmation, edited: Confirmation, now: datetime) -> None:
    """A reviewer edited the held call: in the decision's transaction, its money stops counting
    and the edited call's counts instead (held until the same expiry), so that the customer's sum
    counts the edited amount, never both and never neither; and its key's record now names the
    edited call, so that the model sending its call again gets the edited call's state."""
    currency, subject = held_money_of(original)
    _reservation(original).filter(released_at=None).update(released_at=now)
    if edited.amount_cents is not None:
        Movement.objects.create(
            key=edited.execution_key,
            agent_id=edited.agent_id,
            session_id=edited.session_id,
            customer_id=edited.customer_id,
            currency=edited.currency or currency,
            tool=edited.tool,
            subject=subject,
            amount_cents=edited.amount_cents,
            approval=MovementApproval.HELD,
            at=now,
            day=now.date(),
            expires_at=edited.expires_at,
            confirmation_id=edited.pk,
        )
    IdempotencyRecord.objects.filter(key=original.key, confirmation_id=original.pk).update(
        confirmation_id=edited.pk, confirmation_expires_at=edited.expires_at, updated_at=now
    )


def held_key_settle(
    *,
    confirmation: Confirmation,
    status: str,
    result: Mapping[str, Any] | None,
    live: bool,
) -> None:
    """Leave the held call's idempotency record where the decision puts it.

    live: the record stays held with no expiry, so an identical call gets the confirmation."""
    changes: dict[str, Any] = {
        "status": KeyStatus(status).value,
        "result": result,
        "updated_at": timezone.now(),
    }
    if live:
        changes["confirmation_expires_at"] = None
    # Only the record still held by this confirmation: an expired call may be held anew since.
    IdempotencyRecord.objects.filter(key=confirmation.key, confirmation_id=confirmation.pk).update(
        **changes
    )


def _reservation(confirmation: Confirmation) -> Any:
    return Movement.objects.filter(key=confirmation.execution_key)
