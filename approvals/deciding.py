"""What reviewers do with held calls: approve (a vote, or the decision) and reject.

Who may approve, and what an approval does, is dispatch.pipeline.decision's to say: this module
reads its inputs from the database (the same way the reviewer's pages read them, with the
functions below), enforces the Decision it returns, and writes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.errors import REFUSALS, AlreadyDecided, ConfirmationError, ReasonRequired
from approvals.events import confirmation_locked, event_append
from approvals.executing import confirmation_move, expire_if_due
from approvals.models import EventKind, ReviewerLimit, Vote
from approvals.reviewers import REVIEWERS_GROUP
from dispatch.held_money import held_money_sum
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.money import money
from dispatch.pipeline import codes
from dispatch.pipeline.allowance import HeldSum
from dispatch.pipeline.decision import (
    CastVote,
    HeldCall,
    Outcome,
    Reviewer,
    approval_decision,
    closed_reason,
)
from dispatch.pipeline.engine import Refusal, recheck
from dispatch.pipeline.policy import Policy as PolicySnapshot
from dispatch.pipeline.results import make_result
from dispatch.registry import tool_registry

MAX_REASON_CHARS = 1000


def confirmation_approve(
    *,
    confirmation_id: str,
    reviewer: User,
    now: datetime | None = None,
    separate: bool = False,
    confirmed: bool = False,
    factor: bool = False,
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
    seeing the amount and the customer's sum. An amount above its second-factor line
    (factor_above) is refused unless `factor`: the door checked the reviewer's fresh second
    factor. Raises ConfirmationError. `now` is the decision's
    time (a demo's history gives its own; by default, now)."""
    return _raise_refusal(
        _approve(confirmation_id, reviewer, now or timezone.now(), separate, confirmed, factor)
    )


@transaction.atomic
def _approve(
    confirmation_id: str,
    reviewer: User,
    now: datetime,
    separate: bool,
    confirmed: bool = False,
    factor: bool = False,
) -> Confirmation | ConfirmationError:
    confirmation = confirmation_locked(confirmation_id)
    held = held_call_of(confirmation)
    policy: PolicySnapshot | None = None
    customer_sum: HeldSum | None = None
    votes: list[Vote] = []
    limits: dict[int, dict[str, int]] = {}
    pool: list[Reviewer] = []
    if closed_reason(held, now) is None:
        policy = decision_policy(
            Agent.objects.select_related("current_policy").get(pk=confirmation.agent_id)
        )
        if policy is not None:
            customer_sum = held_money_sum(confirmation=confirmation, policy=policy, now=now)
        votes = list(confirmation.votes.select_related("reviewer"))
        limits = reviewer_limits(currency=held.currency)
        pool = reviewers_pool(limits)
    decision = approval_decision(
        held,
        cast_votes(votes, limits),
        reviewer_of(reviewer, limits),
        reviewers=pool,
        customer_sum=customer_sum,
        policy=policy,
        now=now,
        money=money,
        separate=separate,
        confirmed=confirmed,
        factor=factor,
        recheck=lambda policy: _recheck(confirmation, policy),
    )
    if decision.outcome is Outcome.REFUSED:
        expire_if_due(confirmation, now)
        return REFUSALS[decision.code](decision.reason, confirmation)

    if decision.reviewers_required != confirmation.reviewers_required:
        # The customer's sum of this moment decides, not the sum at the hold.
        confirmation.reviewers_required = decision.reviewers_required
        confirmation.save(update_fields=["reviewers_required"])
    Vote.objects.create(confirmation=confirmation, reviewer=reviewer, at=now)
    if separate:
        event_append(
            confirmation,
            EventKind.SEPARATE,
            reviewer,
            now,
            "Approved as a separate one, not a duplicate of the money it may repeat.",
        )
    event_append(
        confirmation,
        EventKind.VOTED,
        reviewer,
        now,
        "; ".join(decision.after.missing_words),
        _sum_data(customer_sum),
    )
    if decision.outcome is Outcome.VOTE_RECORDED:
        return confirmation
    if decision.invalidation is not None:
        judged = decision.invalidation
        return confirmation_move(
            confirmation,
            ConfirmationStatus.INVALIDATED,
            at=now,
            event=EventKind.INVALIDATED,
            actor=reviewer,
            message=judged.message,
            decision_code=judged.code.name,
            decision_reason=judged.message,
            decided_at=now,
            result=_result(confirmation, judged.code, judged.message, judged.data),
        )
    return confirmation_move(
        confirmation,
        ConfirmationStatus.APPROVED,
        at=now,
        event=EventKind.APPROVED,
        actor=reviewer,
        data=_sum_data(customer_sum),
        decided_at=now,
    )


def _recheck(confirmation: Confirmation, policy: PolicySnapshot) -> Refusal | None:
    judged = recheck(
        tool_registry,
        policy,
        tool=confirmation.tool,
        arguments=confirmation.arguments,
        customer_id=confirmation.customer_id,
    )
    return judged if isinstance(judged, Refusal) else None


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
    confirmation = confirmation_locked(confirmation_id)
    closed = closed_reason(held_call_of(confirmation), now)
    if closed is not None:
        expire_if_due(confirmation, now)
        return AlreadyDecided(closed, confirmation)
    return confirmation_move(
        confirmation,
        ConfirmationStatus.REJECTED,
        at=now,
        event=EventKind.REJECTED,
        actor=reviewer,
        message=reason,
        decision_code=codes.CONFIRMATION_REJECTED.name,
        decision_reason=reason,
        decided_at=now,
        result=_result(
            confirmation,
            codes.CONFIRMATION_REJECTED,
            f"A reviewer rejected {confirmation.tool} (confirmation {confirmation.pk}): {reason}",
            {"confirmation_id": confirmation.pk, "reason": reason},
        ),
    )


def _raise_refusal(outcome: Confirmation | ConfirmationError) -> Confirmation:
    # Raised once the transaction committed, so that what it did (an expiry) stays.
    if isinstance(outcome, ConfirmationError):
        raise outcome
    return outcome


def _result(
    confirmation: Confirmation, code: codes.Code, message: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    return make_result(
        call_id=confirmation.pk, tool=confirmation.tool, code=code, message=message, data=data
    ).as_dict()


# The decision's inputs, read from the database: the service and the reviewer's pages read them
# with these, so that both hand the decision core the same values.


def held_call_of(confirmation: Confirmation) -> HeldCall:
    return HeldCall(
        status=str(confirmation.status),
        expires_at=confirmation.expires_at,
        decided_at=confirmation.decided_at,
        amount_cents=confirmation.amount_cents,
        currency=confirmation.currency,
        reviewers_required=confirmation.reviewers_required,
        held_as_duplicate=bool(confirmation.duplicate_of),
    )


def decision_policy(agent: Agent) -> PolicySnapshot | None:
    """The policy an approval judges by: the agent's current one, while the agent is active."""
    if agent.current_policy is None or not agent.is_active:
        return None
    return agent.current_policy.snapshot()


def reviewer_limits(*, currency: str | None = None) -> dict[int, dict[str, int]]:
    """Each reviewer's approval limits, by currency (in one currency, if given)."""
    limits: dict[int, dict[str, int]] = {}
    found = ReviewerLimit.objects.all()
    if currency is not None:
        found = found.filter(currency=currency)
    for limit in found:
        limits.setdefault(limit.reviewer_id, {})[limit.currency] = limit.max_amount_cents
    return limits


def reviewer_of(user: User, limits: Mapping[int, Mapping[str, int]]) -> Reviewer:
    return Reviewer(user.pk, user.get_username(), limits.get(user.pk, {}))


def reviewers_pool(limits: Mapping[int, Mapping[str, int]]) -> list[Reviewer]:
    """Everyone who may approve: the active members of the reviewers group, by name."""
    people = (
        User.objects.filter(groups__name=REVIEWERS_GROUP, is_active=True)
        .order_by("username")
        .values_list("pk", "username")
    )
    return [Reviewer(pk, name, limits.get(pk, {})) for pk, name in people]


def cast_votes(votes: Iterable[Vote], limits: Mapping[int, Mapping[str, int]]) -> list[CastVote]:
    return [
        CastVote(
            Reviewer(
                vote.reviewer_id, vote.reviewer.get_username(), limits.get(vote.reviewer_id, {})
            ),
            vote.at,
        )
        for vote in votes
    ]
