"""What happens to a held call once it is decided, or once nobody decided it in time.

Every move of a confirmation goes through `confirmation_move`, which takes the steps that follow
each one: its event, its webhook, where its money and its key's record go, and for an approval
its execution, sent to the workers once the decision commits. The worker executes it once under
a lease (`confirmation_execute`), and settles it executed, failed or unknown; a reviewer
reconciles an unknown one with the system of record. The sweeps expire what waited too long and
send again the executions that no worker took.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.errors import NotReconcilable
from approvals.events import confirmation_locked, event_append
from approvals.models import EventKind
from approvals.webhooks import webhook_enqueue
from dispatch.held_money import (
    held_key_settle,
    held_money_approved,
    held_money_executed,
    held_money_released,
)
from dispatch.models import Confirmation, ConfirmationStatus
from dispatch.outcomes import outcome_read, settleable
from dispatch.pipeline import codes
from dispatch.pipeline.edits import edited_result
from dispatch.pipeline.engine import RetryPolicy, execute_with_retries
from dispatch.pipeline.results import CallResult, make_result
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import ExecutionContext, OutcomeUnknownError
from dispatch.registry import tool_registry

logger = logging.getLogger(__name__)

# The worker's task, sent by its name: the tasks import the services, never the reverse.
EXECUTE_TASK = "approvals.tasks.confirmation_execute_task"
# How many executions one resend sends at most; the rest wait for the next round.
RESEND_BATCH = 500


def confirmation_move(
    confirmation: Confirmation,
    status: str,
    *,
    at: datetime,
    event: str | None = None,
    actor: User | None = None,
    message: str = "",
    data: Mapping[str, Any] | None = None,
    **changes: Any,
) -> Confirmation:
    """Move a locked confirmation to `status`, with the fields that change with it, and take the
    steps that follow every move: its event (if any), its webhook, its money, its key's record,
    and, for an approval, its execution, sent once the transaction commits."""
    status = ConfirmationStatus(status)
    confirmation.status = status
    for name, value in changes.items():
        setattr(confirmation, name, value)
    confirmation.save(update_fields=["status", *changes])
    if event is not None:
        event_append(confirmation, event, actor, at, message, data)
    # After the change, in its transaction: the webhook's body is the state it moved to.
    webhook_enqueue(confirmation=confirmation, event=status.value)
    result = confirmation.result
    if status == ConfirmationStatus.APPROVED:
        held_money_approved(confirmation=confirmation)
        # Held until its execution ends: an identical call gets the confirmation's state.
        held_key_settle(confirmation=confirmation, status=KeyStatus.HELD, result=None, live=True)
        transaction.on_commit(lambda: execution_send(confirmation_id=confirmation.pk))
    elif status == ConfirmationStatus.UNKNOWN:
        # Until a reviewer reconciles it, an identical call gets its state, and its money, which
        # may have moved, still counts.
        held_key_settle(confirmation=confirmation, status=KeyStatus.HELD, result=None, live=True)
    elif status == ConfirmationStatus.EXECUTED:
        if confirmation.amount_cents is not None:
            # Money moved with a reviewer's approval, under the key it was held under: a call
            # that repeats it from another conversation is held as a possible duplicate.
            held_money_executed(confirmation=confirmation, now=at)
        held_key_settle(
            confirmation=confirmation, status=KeyStatus.COMPLETED, result=result, live=False
        )
    elif status == ConfirmationStatus.SUPERSEDED:
        # Its money and its key go to the edited call (dispatch.held_money.held_money_edited).
        pass
    elif status in (ConfirmationStatus.REJECTED, ConfirmationStatus.FAILED):
        held_money_released(confirmation=confirmation, now=at)
        # An identical call replays the rejection, or the failure.
        held_key_settle(
            confirmation=confirmation, status=KeyStatus.COMPLETED, result=result, live=False
        )
    else:
        held_money_released(confirmation=confirmation, now=at)
        # Invalidated (it no longer passes), expired or withdrawn: an identical call is judged
        # anew.
        held_key_settle(confirmation=confirmation, status=KeyStatus.OPEN, result=None, live=False)
    return confirmation


def execution_send(*, confirmation_id: str) -> bool:
    """Send an approved confirmation's execution to the workers; whether the broker took it.

    With the broker down (after the publish's own retries), the approved row waits as it is: it
    is the outbox, and executions_resend_due sends it again once a worker can take it. In-process
    (no broker) it executes here, as the task would, and what it raises is the caller's."""
    if current_app.conf.task_always_eager:
        confirmation_execute(confirmation_id=confirmation_id)
        return True
    try:
        current_app.send_task(
            EXECUTE_TASK,
            args=(confirmation_id,),
            retry=True,
            retry_policy=settings.CELERY_TASK_PUBLISH_RETRY_POLICY,
        )
    except Exception as exc:
        logger.warning(
            "Could not send the execution of %s to the workers (%s); it is approved and waits "
            "for the next resend.",
            confirmation_id,
            str(exc).strip()[:200] or type(exc).__name__,
        )
        return False
    return True


def executions_resend_due(*, now: datetime | None = None) -> int:
    """Send again the executions that no worker took: approved ones not claimed within
    TOOLGATE_EXECUTION_RESEND_SECONDS of their approval or of their last sending (the broker was
    down, or the task was lost), and executing ones whose worker's lease lapsed (it died). The
    beat runs it, and every worker as it starts. How many were sent."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TOOLGATE_EXECUTION_RESEND_SECONDS)
    not_sent_lately = Q(execution_sent_at__isnull=True) | Q(execution_sent_at__lte=cutoff)
    due = Confirmation.objects.filter(
        (Q(status=ConfirmationStatus.APPROVED) & Q(decided_at__lte=cutoff) & not_sent_lately)
        | (
            Q(status=ConfirmationStatus.EXECUTING)
            & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
            & not_sent_lately
        )
    ).order_by("decided_at")
    sent = 0
    for confirmation_id in list(due.values_list("pk", flat=True)[:RESEND_BATCH]):
        Confirmation.objects.filter(pk=confirmation_id).update(execution_sent_at=now)
        if not execution_send(confirmation_id=confirmation_id):
            break  # the broker is still down: the next round tries again
        sent += 1
    return sent


def confirmation_execute(*, confirmation_id: str, now: datetime | None = None) -> Confirmation:
    """Execute an approved confirmation once (the worker's task): claim it with a lease, run the
    tool's handler with its execution key and bounded retries while renewing the lease, and
    settle it executed, failed or unknown. `now` is the execution's time (a demo's history gives
    its decision's; by default, now).

    Only one worker executes it at a time: the one that claimed it from approved, or, once the
    lease of a worker that died has lapsed, the one that takes it over; it then runs it again
    under the same key, which the system of record answers with the first effect's receipt. A
    task for a confirmation that a live worker holds, or that is settled, does nothing."""
    given, now = now, now or timezone.now()
    lease = now + _lease()
    claimed = Confirmation.objects.filter(
        pk=confirmation_id, status=ConfirmationStatus.APPROVED
    ).update(status=ConfirmationStatus.EXECUTING, executing_since=now, lease_expires_at=lease)
    taken_over = 0
    if not claimed:
        taken_over = (
            Confirmation.objects.filter(pk=confirmation_id, status=ConfirmationStatus.EXECUTING)
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
            .update(lease_expires_at=lease)
        )
    confirmation = Confirmation.objects.get(pk=confirmation_id)
    if claimed:
        event_append(confirmation, EventKind.EXECUTING, None, now)
    elif taken_over:
        event_append(
            confirmation,
            EventKind.EXECUTING,
            None,
            now,
            "Taken over: the worker that was executing it stopped renewing its lease. It runs "
            "again under the same key, so the system of record applies it at most once.",
        )
    else:
        return confirmation  # not approved, settled, or a live worker's: nothing to do

    spec = tool_registry.get(confirmation.tool)
    if spec is None:  # pragma: no cover - the tool was removed from the code since approval
        return _settle_execution(confirmation_id, _internal(confirmation), KeyStatus.OPEN)
    arguments = spec.arguments.model_validate(confirmation.arguments, strict=True)
    reviewers = tuple(
        confirmation.votes.order_by("at").values_list("reviewer__username", flat=True)
    )
    with _LeaseRenewal(confirmation_id, lease):
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
    if confirmation.edited_from:
        asked = (
            Confirmation.objects.filter(pk=confirmation.edited_from)
            .values_list("arguments", flat=True)
            .get()
        )
        result = edited_result(result, asked=asked, executed=confirmation.arguments)
    return _settle_execution(confirmation_id, result, status, given)


def _lease() -> timedelta:
    return timedelta(seconds=settings.TOOLGATE_EXECUTION_LEASE_SECONDS)


class _LeaseRenewal:
    """Renews a worker's lease on the confirmation it executes, from a thread of its own, every
    third of the lease, for as long as the execution runs."""

    def __init__(self, confirmation_id: str, lease: datetime) -> None:
        self.confirmation_id = confirmation_id
        self.lease = lease
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lease-renewal", daemon=True)

    def __enter__(self) -> _LeaseRenewal:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _run(self) -> None:
        every = _lease().total_seconds() / 3
        try:
            while not self.stopped.wait(every):
                renewed = timezone.now() + _lease()
                # Compare-and-set on its own lease: a worker that lost it does not take it back.
                if not Confirmation.objects.filter(
                    pk=self.confirmation_id,
                    status=ConfirmationStatus.EXECUTING,
                    lease_expires_at=self.lease,
                ).update(lease_expires_at=renewed):
                    return
                self.lease = renewed
        except Exception:
            logger.exception("Could not renew the lease on %s", self.confirmation_id)
        finally:
            connections.close_all()


@transaction.atomic
def _settle_execution(
    confirmation_id: str, result: CallResult, status: KeyStatus, now: datetime | None = None
) -> Confirmation:
    confirmation = confirmation_locked(confirmation_id)
    if confirmation.status != ConfirmationStatus.EXECUTING:
        return confirmation  # a redelivered twin settled it first
    now = now or timezone.now()
    if status is KeyStatus.COMPLETED:
        final, kind = ConfirmationStatus.EXECUTED, EventKind.EXECUTED
    elif status is KeyStatus.UNKNOWN:
        final, kind = ConfirmationStatus.UNKNOWN, EventKind.UNKNOWN
    else:
        final, kind = ConfirmationStatus.FAILED, EventKind.FAILED
    return _finish(confirmation, final, result, now, event=kind, message=result.message)


@transaction.atomic
def confirmation_reconcile(*, confirmation_id: str, reviewer: User) -> Confirmation:
    """Ask the system of record by key what happened to an unknown execution, and settle it
    executed or failed accordingly. Raises ConfirmationError."""
    confirmation = confirmation_locked(confirmation_id)
    if confirmation.status != ConfirmationStatus.UNKNOWN:
        raise NotReconcilable(
            f"Only an execution whose outcome is unknown is reconciled; this one is "
            f"{confirmation.status}.",
            confirmation,
        )
    spec = tool_registry.get(confirmation.tool)
    if spec is None or not settleable(spec):
        raise NotReconcilable(f"{confirmation.tool} cannot be asked for its outcome.", confirmation)
    now = timezone.now()
    try:
        # By its key, or (a write declared by its arguments) by what was approved.
        outcome = outcome_read(
            spec,
            key=confirmation.execution_key,
            arguments=confirmation.arguments,
            customer_id=confirmation.customer_id,
            agent_id=str(confirmation.agent_id),
        )
    except OutcomeUnknownError:
        # The system of record could not be read (an upstream down): still unknown.
        raise NotReconcilable(
            f"The system of record of {confirmation.tool} could not be asked now; try again "
            "shortly.",
            confirmation,
        ) from None
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
    return _finish(
        confirmation,
        status,
        result,
        now,
        event=EventKind.RECONCILED,
        actor=reviewer,
        message=f"The system of record says {kind}.",
        data={"outcome": outcome},
    )


def _finish(
    confirmation: Confirmation,
    status: str,
    result: CallResult,
    now: datetime,
    **event: Any,
) -> Confirmation:
    return confirmation_move(
        confirmation,
        status,
        at=now,
        result=result.as_dict(),
        finished_at=now,
        lease_expires_at=None,
        **event,
    )


@transaction.atomic
def confirmation_expire(*, confirmation_id: str, now: datetime | None = None) -> Confirmation:
    """Mark a pending confirmation past its expiry (by `now`) as expired; no-op otherwise."""
    confirmation = confirmation_locked(confirmation_id)
    expire_if_due(confirmation, now or timezone.now())
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


def expire_if_due(confirmation: Confirmation, now: datetime) -> bool:
    """Expire a locked pending confirmation whose time is up; whether it did."""
    if confirmation.status != ConfirmationStatus.PENDING or confirmation.expires_at > now:
        return False
    confirmation_move(
        confirmation,
        ConfirmationStatus.EXPIRED,
        at=now,
        event=EventKind.EXPIRED,
        decided_at=now,
        decision_code="EXPIRED",
        decision_reason="No reviewer decided before it expired.",
    )
    return True


def _internal(confirmation: Confirmation) -> CallResult:  # pragma: no cover
    return make_result(
        call_id=confirmation.pk,
        tool=confirmation.tool,
        code=codes.INTERNAL_ERROR,
        message=f"{confirmation.tool} is no longer a tool of this service; nothing was done.",
    )
