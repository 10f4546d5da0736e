"""What humans do with held calls, and what the worker does once they approved.

Every transition of a confirmation happens here, in a transaction, with its row locked: two
reviewers clicking at once, a double submit, or an approval racing the expiry make one decision and
at most one execution. The moves are those of dispatch.models.CONFIRMATION_LIFECYCLE, which
PostgreSQL enforces too (dispatch/store/guards.py). Each vote, decision and execution is written to
the confirmation's event log (approvals.models.ConfirmationEvent), which is also where the analytics
count the decisions from. The decision also settles the held call's idempotency record, so that the
agent's identical call gets the confirmation's state, its result or its rejection, and never a
second confirmation for a call that was approved.
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
from pydantic import BaseModel

from approvals.models import ConfirmationEvent, EventKind, ReviewerLimit, Vote
from approvals.webhooks import webhook_enqueue
from dispatch.held_money import (
    decision_lock,
    held_key_settle,
    held_money_approved,
    held_money_executed,
    held_money_of,
    held_money_released,
    held_money_sum,
)
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.money import money
from dispatch.pipeline import codes
from dispatch.pipeline.allowance import HeldSum
from dispatch.pipeline.audit_chain import event_chain, link_hash
from dispatch.pipeline.engine import Refusal, RetryPolicy, execute_with_retries, recheck
from dispatch.pipeline.policy import Policy as PolicySnapshot
from dispatch.pipeline.results import CallResult, make_result
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import ExecutionContext, ToolSpec
from dispatch.registry import tool_registry

logger = logging.getLogger(__name__)

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


class PossibleDuplicate(ConfirmationError):
    """It may repeat money held, approved or moved in another conversation: approving it takes
    the reviewer's explicit word that it is a separate one."""

    code = "possible_duplicate"


class SecondLookRequired(ConfirmationError):
    """Its amount is above the one its policy names for a second look (confirm_above): approving
    it takes the reviewer's confirmation, given once more after seeing the amount and the
    customer's sum."""

    code = "confirmation_required"


class NotReconcilable(ConfirmationError):
    """Only an execution whose outcome is unknown is reconciled."""

    code = "not_reconcilable"


MAX_REASON_CHARS = 1000


def confirmation_approve(
    *,
    confirmation_id: str,
    reviewer: User,
    now: datetime | None = None,
    separate: bool = False,
    confirmed: bool = False,
) -> Confirmation:
    """Record the reviewer's approval. The customer's sum is judged again as it stands now (the
    call's own amount once, with everything else moved or on its way in the window): it decides
    how many different reviewers must approve and whose approval limit covers it. Once those
    approvals are in, re-check the call under the agent's current policy and the live state: if
    it still passes, it becomes approved and its execution is enqueued after commit; if not,
    invalidated.

    A possible duplicate (held as one, or with a twin approved, executing or executed by now) is
    refused unless `separate`: the reviewer's explicit word that it is a separate one, which the
    event log keeps. An amount above the policy's second-look amount in its currency
    (confirm_above) is refused unless `confirmed`: the reviewer's second look, given after
    seeing the amount and the customer's sum. Raises ConfirmationError. `now` is the decision's
    time (a demo's history gives its own; by default, now)."""
    return _raise_refusal(
        _approve(confirmation_id, reviewer, now or timezone.now(), separate, confirmed)
    )


@transaction.atomic
def _approve(
    confirmation_id: str, reviewer: User, now: datetime, separate: bool, confirmed: bool = False
) -> Confirmation | ConfirmationError:
    confirmation = _pending_locked(confirmation_id, now)
    if isinstance(confirmation, ConfirmationError):
        return confirmation
    if confirmation.votes.filter(reviewer=reviewer).exists():
        return AlreadyVoted(
            "You approved this already; it needs another reviewer's approval.", confirmation
        )
    agent = Agent.objects.select_related("current_policy").get(pk=confirmation.agent_id)
    policy = (
        agent.current_policy.snapshot()
        if agent.current_policy is not None and agent.is_active
        else None
    )
    customer_sum = (
        held_money_sum(confirmation=confirmation, policy=policy, now=now)
        if policy is not None
        else None
    )
    if (
        customer_sum is not None
        and (confirmation.duplicate_of or customer_sum.twins_approved)
        and not separate
    ):
        return PossibleDuplicate(
            f"It may repeat {_twin_words(confirmation, customer_sum)}. Approve it only if it is a "
            "separate one, with its own approval as such.",
            confirmation,
        )
    if (
        policy is not None
        and not confirmed
        and policy.needs_second_look(confirmation.amount_cents, confirmation.currency)
    ):
        return SecondLookRequired(_second_look_words(confirmation, policy, customer_sum))
    if (
        customer_sum is not None
        and customer_sum.reviewers_required != confirmation.reviewers_required
    ):
        # The customer's sum of this moment decides, not the sum at the hold.
        confirmation.reviewers_required = customer_sum.reviewers_required
        confirmation.save(update_fields=["reviewers_required"])
    Vote.objects.create(confirmation=confirmation, reviewer=reviewer, at=now)
    if separate:
        _event(
            confirmation,
            EventKind.SEPARATE,
            reviewer,
            now,
            "Approved as a separate one, not a duplicate of the money it may repeat.",
        )
    missing = confirmation_approvals_missing(confirmation, customer_sum)
    _event(
        confirmation, EventKind.VOTED, reviewer, now, "; ".join(missing), _sum_data(customer_sum)
    )
    if missing:
        return confirmation

    judged: tuple[ToolSpec[Any], BaseModel] | Refusal = (
        recheck(
            tool_registry,
            policy,
            tool=confirmation.tool,
            arguments=confirmation.arguments,
            customer_id=confirmation.customer_id,
        )
        if policy is not None
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
        webhook_enqueue(confirmation=confirmation, event="invalidated")
        held_money_released(confirmation=confirmation, now=now)
        # The call no longer passes: an identical call is judged anew.
        held_key_settle(confirmation=confirmation, status=KeyStatus.OPEN, result=None, live=False)
        return confirmation

    confirmation.status = ConfirmationStatus.APPROVED
    confirmation.decided_at = now
    confirmation.save(update_fields=["status", "decided_at"])
    _event(confirmation, EventKind.APPROVED, reviewer, now, "", _sum_data(customer_sum))
    webhook_enqueue(confirmation=confirmation, event="approved")
    held_money_approved(confirmation=confirmation)
    # Held until its execution ends: an identical call gets the confirmation's state meanwhile.
    held_key_settle(confirmation=confirmation, status=KeyStatus.HELD, result=None, live=True)
    transaction.on_commit(lambda: execution_send(confirmation_id=confirmation.pk))
    return confirmation


def _twin_words(confirmation: Confirmation, customer_sum: HeldSum) -> str:
    twin = next(iter(customer_sum.twins_approved), None) or next(iter(customer_sum.twins), None)
    currency, _ = held_money_of(confirmation)
    if twin is None:
        return "money moved in another conversation"
    state = {
        "policy": "executed",
        "reviewer": "executed",
        "approved": "approved",
        "held": "held",
    }.get(twin.approval, twin.approval)
    return (
        f"{twin.tool} of {money(twin.amount_cents, currency)} for {twin.subject}, "
        f"{state} in another conversation at {twin.at:%Y-%m-%d %H:%M} UTC"
    )


def _second_look_words(
    confirmation: Confirmation, policy: PolicySnapshot, customer_sum: HeldSum | None
) -> str:
    currency = confirmation.currency
    line = policy.confirm_above(currency)
    assert confirmation.amount_cents is not None and line is not None
    total = (
        ""
        if customer_sum is None
        else (
            f"; with the customer's other money in the window the sum is "
            f"{money(customer_sum.sum_cents, currency)}"
        )
    )
    return (
        f"Not approved yet: {money(confirmation.amount_cents, currency)} is above "
        f"{money(line, currency)}, the amount above which an approval is confirmed once more"
        f"{total}. Look again and confirm to approve it."
    )


def _sum_data(customer_sum: HeldSum | None) -> dict[str, Any]:
    if customer_sum is None:
        return {}
    return {
        "sum_cents": customer_sum.sum_cents,
        "earlier_cents": customer_sum.earlier_cents,
        "held_cents": customer_sum.held_cents,
        "reviewers_required": customer_sum.reviewers_required,
    }


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
    webhook_enqueue(confirmation=confirmation, event="rejected")
    held_money_released(confirmation=confirmation, now=now)
    # An identical call replays the rejection.
    held_key_settle(
        confirmation=confirmation,
        status=KeyStatus.COMPLETED,
        result=confirmation.result,
        live=False,
    )
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
        _event(confirmation, EventKind.EXECUTING, None, now)
    elif taken_over:
        _event(
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


def execution_send(*, confirmation_id: str) -> bool:
    """Send an approved confirmation's execution to the workers; whether the broker took it.

    With the broker down (after the publish's own retries), the approved row waits as it is: it
    is the outbox, and executions_resend_due sends it again once a worker can take it. In-process
    (no broker) it executes here, and what it raises is the caller's."""
    # Imported here: the tasks import the services, and only call them.
    from approvals.tasks import confirmation_execute_task

    if current_app.conf.task_always_eager:
        confirmation_execute_task.delay(confirmation_id)
        return True
    try:
        confirmation_execute_task.apply_async(
            (confirmation_id,),
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


# How many executions one resend sends at most; the rest wait for the next round.
RESEND_BATCH = 500


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


def confirmation_approvals_missing(
    confirmation: Confirmation, customer_sum: HeldSum | None = None
) -> list[str]:
    """Whose approval is still needed, in words; empty when the approvals suffice. An approver's
    limit must cover the customer's sum, or the call's amount where it moves none."""
    votes = list(confirmation.votes.select_related("reviewer"))
    missing = []
    if len(votes) < confirmation.reviewers_required:
        more = confirmation.reviewers_required - len(votes)
        missing.append(
            f"{more} more reviewer{'s' if more > 1 else ''}"
            + (" (another than who approved)" if votes else "")
        )
    amount = customer_sum.sum_cents if customer_sum is not None else confirmation.amount_cents
    currency, _ = held_money_of(confirmation)
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


def _locked(confirmation_id: str) -> Confirmation:
    """The confirmation's row, locked, after its customer's decision lock (dispatch.held_money
    gives the lock order)."""
    customer_id = (
        Confirmation.objects.filter(pk=confirmation_id)
        .values_list("customer_id", flat=True)
        .first()
    )
    if customer_id is None:
        raise ConfirmationNotFound(f"There is no confirmation {confirmation_id}.")
    decision_lock(customer_id=customer_id)
    return Confirmation.objects.select_for_update().get(pk=confirmation_id)


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
    webhook_enqueue(confirmation=confirmation, event="expired")
    held_money_released(confirmation=confirmation, now=now)
    # An expired call may be held again.
    held_key_settle(confirmation=confirmation, status=KeyStatus.OPEN, result=None, live=False)
    return True


@transaction.atomic
def _settle_execution(
    confirmation_id: str, result: CallResult, status: KeyStatus, now: datetime | None = None
) -> Confirmation:
    confirmation = _locked(confirmation_id)
    if confirmation.status != ConfirmationStatus.EXECUTING:
        return confirmation  # a redelivered twin settled it first
    now = now or timezone.now()
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
    confirmation.lease_expires_at = None
    confirmation.save(update_fields=["status", "result", "finished_at", "lease_expires_at"])
    webhook_enqueue(confirmation=confirmation, event=status)
    if status == ConfirmationStatus.UNKNOWN:
        # Until a reviewer reconciles it, an identical call gets its state, and its money, which
        # may have moved, still counts.
        held_key_settle(confirmation=confirmation, status=KeyStatus.HELD, result=None, live=True)
        return confirmation
    held_key_settle(
        confirmation=confirmation,
        status=KeyStatus.COMPLETED,
        result=confirmation.result,
        live=False,
    )
    if confirmation.amount_cents is not None:
        if status == ConfirmationStatus.EXECUTED:
            # Money moved with a reviewer's approval, under the key it was held under: a call
            # that repeats it from another conversation is held as a possible duplicate.
            held_money_executed(confirmation=confirmation, now=now)
        else:
            held_money_released(confirmation=confirmation, now=now)
    return confirmation


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
    """Append an event to the confirmation's log, as the next link of its chain: the head on the
    confirmation's row moves to it in the same transaction (compare-and-set; a decision holds the
    row's lock already, a worker's event may meet another's and links again)."""
    fields = {
        "confirmation_id": confirmation.pk,
        "at": at,
        "kind": kind,
        "actor_id": actor.pk if actor is not None else None,
        "actor_label": actor.get_username() if actor is not None else _label(kind),
        "message": message,
        "data": dict(data or {}),
    }
    chain = event_chain(confirmation.pk)
    seq, previous = confirmation.event_seq, confirmation.event_head
    with transaction.atomic(savepoint=False):
        for _ in range(_LINK_TRIES):
            linked = link_hash(chain=chain, seq=seq + 1, previous=previous, fields=fields)
            moved = Confirmation.objects.filter(pk=confirmation.pk, event_seq=seq).update(
                event_seq=seq + 1, event_head=linked
            )
            if moved:
                break
            seq, previous = (
                Confirmation.objects.filter(pk=confirmation.pk)
                .values_list("event_seq", "event_head")
                .get()
            )
        else:  # pragma: no cover - as many events as tries, all at once, on one confirmation
            raise RuntimeError(f"the event chain of {confirmation.pk} would not settle")
        ConfirmationEvent.objects.create(**fields, chain_seq=seq + 1, chain_hash=linked)
    confirmation.event_seq, confirmation.event_head = seq + 1, linked


# Each failed try means another event of the confirmation was appended in between.
_LINK_TRIES = 20


def _label(kind: str) -> str:
    return EXPIRY if kind == EventKind.EXPIRED else WORKER
