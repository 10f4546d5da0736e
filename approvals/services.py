"""What humans do with held calls, and what the worker does once they approved.

Every transition of a confirmation happens here, in a transaction, with its row locked: two
reviewers clicking at once, a double submit, or an approval racing the expiry make one decision
and at most one execution. Each vote, decision and execution is written to the confirmation's
event log (approvals.models.ConfirmationEvent), and each decision is counted in the histogram of
decision times the analytics read (dispatch.metrics.decision_count). The decision also settles
the held call's idempotency record, so that the agent's identical call gets the confirmation's
state, its result or its rejection, and never a second confirmation for a call that was approved.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel

from approvals.models import ConfirmationEvent, EventKind, ReviewerLimit, Vote
from approvals.webhooks import webhook_enqueue
from dispatch.metrics import BY_EXPIRY, decision_count
from dispatch.models import (
    Agent,
    Confirmation,
    ConfirmationStatus,
    IdempotencyRecord,
    IdempotencyStatus,
    Movement,
    MovementApproval,
)
from dispatch.pipeline import codes
from dispatch.pipeline.engine import Refusal, RetryPolicy, execute_with_retries, recheck
from dispatch.pipeline.results import CallResult, make_result
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import ExecutionContext, ToolSpec
from dispatch.registry import tool_registry

WORKER = "worker"
EXPIRY = "expiry"


class ConfirmationError(Exception):
    """A decision that cannot be made; `code` is stable, `message` is for the reviewer."""

    code = "confirmation_error"

    def __init__(self, message: str, confirmation: Confirmation | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation = confirmation


class ConfirmationNotFound(ConfirmationError):
    code = "not_found"


class AlreadyDecided(ConfirmationError):
    """It is no longer pending (decided by someone else, expired, or executing)."""

    code = "already_decided"


class AlreadyVoted(ConfirmationError):
    """This reviewer approved it already; another reviewer's approval is needed."""

    code = "already_voted"


class ReasonRequired(ConfirmationError):
    code = "reason_required"


class NotReconcilable(ConfirmationError):
    """Only an execution whose outcome is unknown is reconciled."""

    code = "not_reconcilable"


MAX_REASON_CHARS = 1000


def confirmation_approve(
    *, confirmation_id: str, reviewer: User, now: datetime | None = None
) -> Confirmation:
    """Record the reviewer's approval. Once enough different reviewers approved (the policy's
    reviewers_required) and one of them may approve the amount (ReviewerLimit), re-check the call
    under the agent's current policy and the live state: if it still passes, it becomes approved
    and its execution is enqueued after commit; if not, invalidated. Raises ConfirmationError.
    `now` is the decision's time (a demo's history gives its own; by default, now)."""
    return _raise_refusal(_approve(confirmation_id, reviewer, now or timezone.now()))


@transaction.atomic
def _approve(
    confirmation_id: str, reviewer: User, now: datetime
) -> Confirmation | ConfirmationError:
    confirmation = _pending_locked(confirmation_id, now)
    if isinstance(confirmation, ConfirmationError):
        return confirmation
    if confirmation.votes.filter(reviewer=reviewer).exists():
        return AlreadyVoted(
            "You approved this already; it needs another reviewer's approval.", confirmation
        )
    Vote.objects.create(confirmation=confirmation, reviewer=reviewer, at=now)
    missing = confirmation_approvals_missing(confirmation)
    _event(confirmation, EventKind.VOTED, reviewer, now, "; ".join(missing))
    if missing:
        return confirmation

    agent = Agent.objects.select_related("current_policy").get(pk=confirmation.agent_id)
    policy = agent.current_policy
    judged: tuple[ToolSpec[Any], BaseModel] | Refusal = (
        recheck(
            tool_registry,
            policy.snapshot(),
            tool=confirmation.tool,
            arguments=confirmation.arguments,
            customer_id=confirmation.customer_id,
        )
        if policy is not None and agent.is_active
        else Refusal(codes.TOOL_NOT_ALLOWED, "the agent has no active policy any more")
    )
    if isinstance(judged, Refusal):
        confirmation.status = ConfirmationStatus.INVALIDATED
        confirmation.decision_code = judged.code.name
        confirmation.decision_reason = judged.message
        confirmation.decided_at = now
        confirmation.result = _result(confirmation, judged.code, judged.message, judged.data)
        confirmation.save(
            update_fields=["status", "decision_code", "decision_reason", "decided_at", "result"]
        )
        _event(confirmation, EventKind.INVALIDATED, reviewer, now, judged.message)
        decision_count(confirmation=confirmation, decided_by=reviewer.get_username())
        webhook_enqueue(confirmation=confirmation, event="invalidated")
        # The call no longer passes: an identical call is judged anew.
        _settle_key(confirmation, IdempotencyStatus.OPEN, result=None, live=False)
        return confirmation

    confirmation.status = ConfirmationStatus.APPROVED
    confirmation.decided_at = now
    confirmation.save(update_fields=["status", "decided_at"])
    _event(confirmation, EventKind.APPROVED, reviewer, now)
    decision_count(confirmation=confirmation, decided_by=reviewer.get_username())
    webhook_enqueue(confirmation=confirmation, event="approved")
    # Held until its execution ends: an identical call gets the confirmation's state meanwhile.
    _settle_key(confirmation, IdempotencyStatus.HELD, result=None, live=True)
    transaction.on_commit(lambda: _enqueue_execution(confirmation.pk))
    return confirmation


def confirmation_reject(
    *, confirmation_id: str, reviewer: User, reason: str, now: datetime | None = None
) -> Confirmation:
    """Reject with a reason (required), which reaches the model. Raises ConfirmationError."""
    reason = " ".join(reason.split())[:MAX_REASON_CHARS]
    if not reason:
        raise ReasonRequired("Say why it is rejected: the agent passes the reason on.")
    return _raise_refusal(_reject(confirmation_id, reviewer, reason, now or timezone.now()))


@transaction.atomic
def _reject(
    confirmation_id: str, reviewer: User, reason: str, now: datetime
) -> Confirmation | ConfirmationError:
    confirmation = _pending_locked(confirmation_id, now)
    if isinstance(confirmation, ConfirmationError):
        return confirmation
    confirmation.status = ConfirmationStatus.REJECTED
    confirmation.decision_code = codes.CONFIRMATION_REJECTED.name
    confirmation.decision_reason = reason
    confirmation.decided_at = now
    confirmation.result = _result(
        confirmation,
        codes.CONFIRMATION_REJECTED,
        f"A reviewer rejected {confirmation.tool} (confirmation {confirmation.pk}): {reason}",
        {"confirmation_id": confirmation.pk, "reason": reason},
    )
    confirmation.save(
        update_fields=["status", "decision_code", "decision_reason", "decided_at", "result"]
    )
    _event(confirmation, EventKind.REJECTED, reviewer, now, reason)
    decision_count(confirmation=confirmation, decided_by=reviewer.get_username())
    webhook_enqueue(confirmation=confirmation, event="rejected")
    # An identical call replays the rejection.
    _settle_key(confirmation, IdempotencyStatus.COMPLETED, result=confirmation.result, live=False)
    return confirmation


@transaction.atomic
def confirmation_expire(*, confirmation_id: str, now: datetime | None = None) -> Confirmation:
    """Mark a pending confirmation past its expiry (by `now`) as expired; no-op otherwise."""
    confirmation = _locked(confirmation_id)
    _expire_if_due(confirmation, now or timezone.now())
    return confirmation


def confirmations_expire_due() -> int:
    """Expire every pending confirmation past its expiry; how many (the beat schedule's task)."""
    due = Confirmation.objects.filter(
        status=ConfirmationStatus.PENDING, expires_at__lte=timezone.now()
    ).values_list("pk", flat=True)
    expired = 0
    for confirmation_id in list(due):
        if confirmation_expire(confirmation_id=confirmation_id).status == "expired":
            expired += 1
    return expired


def confirmation_execute(*, confirmation_id: str) -> Confirmation:
    """Execute an approved confirmation once (the worker's task): claim it, run the tool's handler
    with its execution key and bounded retries, and settle it executed, failed or unknown.

    A redelivered task (its worker died mid-way) finds it executing and runs it again under the
    same key, which the system of record answers with the first effect's receipt: the money
    moves at most once, whatever happens to the worker."""
    now = timezone.now()
    claimed = Confirmation.objects.filter(
        pk=confirmation_id, status=ConfirmationStatus.APPROVED
    ).update(status=ConfirmationStatus.EXECUTING, executing_since=now)
    confirmation = Confirmation.objects.get(pk=confirmation_id)
    if claimed:
        _event(confirmation, EventKind.EXECUTING, None, now)
    elif confirmation.status != ConfirmationStatus.EXECUTING:
        return confirmation  # not approved, or already settled: nothing to do

    spec = tool_registry.get(confirmation.tool)
    if spec is None:  # pragma: no cover - the tool was removed from the code since approval
        return _settle_execution(confirmation_id, _internal(confirmation), KeyStatus.OPEN)
    arguments = spec.arguments.model_validate(confirmation.arguments, strict=True)
    reviewers = tuple(
        confirmation.votes.order_by("at").values_list("reviewer__username", flat=True)
    )
    result, status = execute_with_retries(
        spec,
        arguments,
        ExecutionContext(
            confirmation.customer_id,
            confirmation.execution_key,
            reviewers,
            agent_id=str(confirmation.agent_id),
        ),
        call_id=confirmation.pk,
        retry=RetryPolicy(),
        sleep=time.sleep,
    )
    return _settle_execution(confirmation_id, result, status)


@transaction.atomic
def confirmation_reconcile(*, confirmation_id: str, reviewer: User) -> Confirmation:
    """Ask the system of record by key what happened to an unknown execution, and settle it
    executed or failed accordingly. Raises ConfirmationError."""
    confirmation = _locked(confirmation_id)
    if confirmation.status != ConfirmationStatus.UNKNOWN:
        raise NotReconcilable(
            f"Only an execution whose outcome is unknown is reconciled; this one is "
            f"{confirmation.status}.",
            confirmation,
        )
    spec = tool_registry.get(confirmation.tool)
    if spec is None or spec.outcome_of is None:
        raise NotReconcilable(f"{confirmation.tool} cannot be asked for its outcome.", confirmation)
    now = timezone.now()
    outcome = spec.outcome_of(confirmation.execution_key)
    if outcome is not None:
        result = make_result(
            call_id=confirmation.pk,
            tool=confirmation.tool,
            code=codes.OK,
            message="Done.",
            data=outcome,
        )
        status, kind = ConfirmationStatus.EXECUTED, "it took effect"
    else:
        result = make_result(
            call_id=confirmation.pk,
            tool=confirmation.tool,
            code=codes.UPSTREAM_UNAVAILABLE,
            message=f"{confirmation.tool} did not take effect: the system of record has nothing "
            "under its key. Nothing was done.",
            data={"outcome": "not_applied"},
        )
        status, kind = ConfirmationStatus.FAILED, "it did not take effect"
    _event(
        confirmation,
        EventKind.RECONCILED,
        reviewer,
        now,
        f"The system of record says {kind}.",
        {"outcome": outcome},
    )
    return _finish(confirmation, status, result, now)


def _enqueue_execution(confirmation_id: str) -> None:
    # Imported here: the tasks import the services, and only call them.
    from approvals.tasks import confirmation_execute_task

    confirmation_execute_task.delay(confirmation_id)


def confirmation_approvals_missing(confirmation: Confirmation) -> list[str]:
    """Whose approval is still needed, in words; empty when the approvals suffice."""
    votes = list(confirmation.votes.select_related("reviewer"))
    missing = []
    if len(votes) < confirmation.reviewers_required:
        more = confirmation.reviewers_required - len(votes)
        missing.append(
            f"{more} more reviewer{'s' if more > 1 else ''}"
            + (" (another than who approved)" if votes else "")
        )
    amount, currency = confirmation.amount_cents, _currency(confirmation)
    if (
        amount is not None
        and votes
        and not any(_may_approve(vote.reviewer_id, currency, amount) for vote in votes)
    ):
        missing.append(f"a reviewer who may approve {amount} {currency}")
    return missing


def _may_approve(reviewer_id: int, currency: str, amount: int) -> bool:
    limit = ReviewerLimit.objects.filter(reviewer_id=reviewer_id, currency=currency).first()
    return limit is None or limit.max_amount_cents >= amount


def _currency(confirmation: Confirmation) -> str:
    spec = tool_registry.get(confirmation.tool)
    if spec is None or spec.currency_field is None:
        return ""
    return str(confirmation.arguments.get(spec.currency_field, ""))


def _locked(confirmation_id: str) -> Confirmation:
    confirmation = Confirmation.objects.select_for_update().filter(pk=confirmation_id).first()
    if confirmation is None:
        raise ConfirmationNotFound(f"There is no confirmation {confirmation_id}.")
    return confirmation


def _raise_refusal(outcome: Confirmation | ConfirmationError) -> Confirmation:
    # Raised once the transaction committed, so that what it did (an expiry) stays.
    if isinstance(outcome, ConfirmationError):
        raise outcome
    return outcome


def _pending_locked(confirmation_id: str, now: datetime) -> Confirmation | ConfirmationError:
    """The confirmation, locked, if it is still pending; otherwise why not (expired by now)."""
    confirmation = _locked(confirmation_id)
    if _expire_if_due(confirmation, now):
        return AlreadyDecided(
            f"It expired at {confirmation.expires_at.isoformat(timespec='seconds')}; it can no "
            "longer be approved.",
            confirmation,
        )
    if confirmation.status != ConfirmationStatus.PENDING:
        return AlreadyDecided(
            f"It is already {confirmation.status}"
            + (
                f" (decided at {confirmation.decided_at:%H:%M:%S})."
                if confirmation.decided_at
                else "."
            ),
            confirmation,
        )
    return confirmation


def _expire_if_due(confirmation: Confirmation, now: datetime) -> bool:
    """Expire a locked pending confirmation whose time is up; whether it did."""
    if confirmation.status != ConfirmationStatus.PENDING or confirmation.expires_at > now:
        return False
    confirmation.status = ConfirmationStatus.EXPIRED
    confirmation.decided_at = now
    confirmation.decision_code = "EXPIRED"
    confirmation.decision_reason = "No reviewer decided before it expired."
    confirmation.save(update_fields=["status", "decided_at", "decision_code", "decision_reason"])
    _event(confirmation, EventKind.EXPIRED, None, now)
    decision_count(confirmation=confirmation, decided_by=BY_EXPIRY)
    webhook_enqueue(confirmation=confirmation, event="expired")
    # An expired call may be held again.
    _settle_key(confirmation, IdempotencyStatus.OPEN, result=None, live=False)
    return True


@transaction.atomic
def _settle_execution(confirmation_id: str, result: CallResult, status: KeyStatus) -> Confirmation:
    confirmation = _locked(confirmation_id)
    if confirmation.status != ConfirmationStatus.EXECUTING:
        return confirmation  # a redelivered twin settled it first
    now = timezone.now()
    if status is KeyStatus.COMPLETED:
        final, kind = ConfirmationStatus.EXECUTED, EventKind.EXECUTED
    elif status is KeyStatus.UNKNOWN:
        final, kind = ConfirmationStatus.UNKNOWN, EventKind.UNKNOWN
    else:
        final, kind = ConfirmationStatus.FAILED, EventKind.FAILED
    _event(confirmation, kind, None, now, result.message)
    return _finish(confirmation, final, result, now)


def _finish(
    confirmation: Confirmation, status: str, result: CallResult, now: datetime
) -> Confirmation:
    confirmation.status = status
    confirmation.result = result.as_dict()
    confirmation.finished_at = now
    confirmation.save(update_fields=["status", "result", "finished_at"])
    webhook_enqueue(confirmation=confirmation, event=status)
    if status == ConfirmationStatus.UNKNOWN:
        # Until a reviewer reconciles it, an identical call gets its state.
        _settle_key(confirmation, IdempotencyStatus.HELD, result=None, live=True)
        return confirmation
    _settle_key(confirmation, IdempotencyStatus.COMPLETED, result=confirmation.result, live=False)
    if status == ConfirmationStatus.EXECUTED and confirmation.amount_cents is not None:
        _record_movement(confirmation, now)
    return confirmation


def _record_movement(confirmation: Confirmation, now: datetime) -> None:
    assert confirmation.amount_cents is not None
    # Money moved with a reviewer's approval: not counted in the policy's allowance, but a refund
    # that repeats it from another conversation is held as a possible duplicate.
    spec = tool_registry.get(confirmation.tool)
    subject = ""
    if spec is not None and spec.subject_field is not None:
        subject = str(confirmation.arguments.get(spec.subject_field, ""))
    Movement.objects.update_or_create(
        key=confirmation.execution_key,
        defaults={
            "agent_id": confirmation.agent_id,
            "session_id": confirmation.session_id,
            "customer_id": confirmation.customer_id,
            "currency": _currency(confirmation),
            "tool": confirmation.tool,
            "subject": subject,
            "amount_cents": confirmation.amount_cents,
            "approval": MovementApproval.REVIEWER,
            "at": now,
            "day": now.date(),
            "released_at": None,
        },
    )


def _settle_key(
    confirmation: Confirmation,
    status: str,
    *,
    result: Mapping[str, Any] | None,
    live: bool,
) -> None:
    """Leave the held call's idempotency record where the decision puts it.

    live: the record stays held with no expiry, so an identical call gets the confirmation."""
    changes: dict[str, Any] = {"status": status, "result": result, "updated_at": timezone.now()}
    if live:
        changes["confirmation_expires_at"] = None
    # Only the record still held by this confirmation: an expired call may be held anew since.
    IdempotencyRecord.objects.filter(key=confirmation.key, confirmation_id=confirmation.pk).update(
        **changes
    )


def _result(
    confirmation: Confirmation, code: codes.Code, message: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    return make_result(
        call_id=confirmation.pk, tool=confirmation.tool, code=code, message=message, data=data
    ).as_dict()


def _internal(confirmation: Confirmation) -> CallResult:  # pragma: no cover
    return make_result(
        call_id=confirmation.pk,
        tool=confirmation.tool,
        code=codes.INTERNAL_ERROR,
        message=f"{confirmation.tool} is no longer a tool of this service; nothing was done.",
    )


def _event(
    confirmation: Confirmation,
    kind: str,
    actor: User | None,
    at: datetime,
    message: str = "",
    data: Mapping[str, Any] | None = None,
) -> None:
    ConfirmationEvent.objects.create(
        confirmation=confirmation,
        at=at,
        kind=kind,
        actor=actor,
        actor_label=actor.get_username() if actor is not None else _label(kind),
        message=message,
        data=dict(data or {}),
    )


def _label(kind: str) -> str:
    return EXPIRY if kind == EventKind.EXPIRED else WORKER
