"""What reviewers do with held calls: approve (a vote, or the decision), edit then approve, and
reject.

Who may approve, and what an approval does, is dispatch.pipeline.decision's to say: this module
reads its inputs from the database (the same way the reviewer's pages read them, with the
functions below), enforces the Decision it returns, and writes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.errors import (
    REFUSALS,
    AlreadyDecided,
    ConfirmationError,
    ConfirmationNotFound,
    EditRefused,
    NeedsCard,
    ReasonRequired,
    RecheckUnavailable,
)
from approvals.events import confirmation_locked, event_append
from approvals.executing import confirmation_move, expire_if_due
from approvals.models import EventKind, ReviewerLimit, Vote
from approvals.provider_check import provider_check
from approvals.reviewers import REVIEWERS_GROUP
from dispatch.held_money import held_money_edited, held_money_sum
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.money import money
from dispatch.pipeline import codes
from dispatch.pipeline.allowance import HeldSum
from dispatch.pipeline.canonical import arguments_hash, canonical_json
from dispatch.pipeline.decision import (
    CastVote,
    HeldCall,
    Outcome,
    Reviewer,
    approval_decision,
    closed_reason,
    withdrawal_refusal,
)
from dispatch.pipeline.edits import EditedCall, edit_judge
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
    channel: str = "",
    deciding_only: bool = False,
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
    factor. Raises ConfirmationError. `now` is the decision's time (a demo's history gives its
    own; by default, now). `channel` names the door in the event log where it is not the pages
    or the API ("slack"); with `deciding_only` an approval that would only be a vote is refused
    (NeedsCard) and nothing is recorded. A single sign-on reviewer needs the provider's fresh
    word first (provider_check), before any row is locked."""
    provider_check(reviewer)
    return _raise_refusal(
        _approve(
            confirmation_id,
            reviewer,
            now or timezone.now(),
            separate,
            confirmed,
            factor,
            channel=channel,
            deciding_only=deciding_only,
        )
    )


@transaction.atomic
def _approve(
    confirmation_id: str,
    reviewer: User,
    now: datetime,
    separate: bool,
    confirmed: bool = False,
    factor: bool = False,
    *,
    channel: str = "",
    deciding_only: bool = False,
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
    judged = decision.invalidation
    if judged is not None and judged.code.retryable:
        # Not a rule the call breaks, but a read that failed (an upstream away): a retryable
        # refusal does not invalidate what a reviewer is approving.
        return RecheckUnavailable(
            f"The live state could not be checked now, so nothing was decided: {judged.message}",
            confirmation,
        )
    if deciding_only and decision.outcome is Outcome.VOTE_RECORDED:
        return NeedsCard(
            f"{decision.after.still_needed or 'More is needed'}: decide it on its card.",
            confirmation,
        )

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
        data={**_sum_data(customer_sum), **({"channel": channel} if channel else {})},
        decided_at=now,
    )


def confirmation_edit_approve(
    *,
    confirmation_id: str,
    reviewer: User,
    changes: Mapping[str, Any],
    now: datetime | None = None,
    separate: bool = False,
    confirmed: bool = False,
    factor: bool = False,
) -> Confirmation:
    """Edit a held call as its tool allows (`changes`: only its editable arguments), then
    approve the edited call, in one transaction.

    The held call's arguments never change: the edit is a new confirmation (edited_from names
    the held one), which keeps its key and its expiry, inherits its duplicate_of, starts with no
    votes and is judged again by the whole pipeline (schema, checks, the customer's sum, the
    reviewer's limit) as confirmation_approve judges it. The held one becomes superseded; its
    money stops counting and the edited amount counts instead. An edit the tool's rules or the
    pipeline refuse raises EditRefused; an approval of the edited call that is refused (a
    possible duplicate, a second look, a second factor) raises its refusal, and then the edit
    is not made either: nothing changes. Returns the edited confirmation."""
    provider_check(reviewer)
    return _raise_refusal(
        _edit_approve(
            confirmation_id, reviewer, changes, now or timezone.now(), separate, confirmed, factor
        )
    )


@transaction.atomic
def _edit_approve(
    confirmation_id: str,
    reviewer: User,
    changes: Mapping[str, Any],
    now: datetime,
    separate: bool,
    confirmed: bool,
    factor: bool,
) -> Confirmation | ConfirmationError:
    original = confirmation_locked(confirmation_id)
    closed = closed_reason(held_call_of(original), now)
    if closed is not None:
        expire_if_due(original, now)
        return AlreadyDecided(closed, original)
    policy = decision_policy(
        Agent.objects.select_related("current_policy").get(pk=original.agent_id)
    )
    if policy is None:
        return EditRefused(
            "The agent has no active policy any more: nothing it asks can be edited into a call "
            "that executes. Reject it.",
            original,
        )
    judged = edit_judge(
        tool_registry,
        policy,
        tool=original.tool,
        asked=original.arguments,
        changes=changes,
        customer_id=original.customer_id,
        asked_amount_cents=original.amount_cents,
    )
    if not isinstance(judged, EditedCall):
        return EditRefused(judged.message, original)

    edited = _edited_confirmation(original, judged, policy.version, now)
    before = {name: asked for name, (asked, _) in judged.changed.items()}
    after = {name: value for name, (_, value) in judged.changed.items()}
    changed_words = ", ".join(
        f"{name} {asked} → {value}" for name, (asked, value) in judged.changed.items()
    )
    event_append(
        edited,
        EventKind.EDITED,
        reviewer,
        now,
        f"Edited before approval from {original.pk}: {changed_words}.",
        {"edited_from": original.pk, "before": before, "after": after},
    )
    confirmation_move(
        original,
        ConfirmationStatus.SUPERSEDED,
        at=now,
        event=EventKind.SUPERSEDED,
        actor=reviewer,
        message=f"Edited into {edited.pk}: {changed_words}.",
        data={"edited_into": edited.pk, "before": before, "after": after},
        decided_at=now,
        decision_code=ConfirmationStatus.SUPERSEDED.upper(),
        decision_reason=f"A reviewer edited it before approving ({changed_words}); "
        f"confirmation {edited.pk} takes its place.",
    )
    held_money_edited(original=original, edited=edited, now=now)
    approved = _approve(edited.pk, reviewer, now, separate, confirmed, factor)
    if isinstance(approved, ConfirmationError):
        # Raised inside the transaction: the edit is undone with the approval it could not get.
        raise type(approved)(approved.message, original)
    return approved


def _edited_confirmation(
    original: Confirmation, judged: EditedCall, policy_version: int, now: datetime
) -> Confirmation:
    money = judged.money
    return Confirmation.objects.create(
        id=uuid.uuid4().hex,
        # Its key: the model sending its call again gets this one's state, not a new hold.
        key=original.key,
        tool=original.tool,
        arguments=judged.arguments,
        arguments_hash=arguments_hash(canonical_json(judged.arguments)),
        agent_id=original.agent_id,
        session_id=original.session_id,
        customer_id=original.customer_id,
        policy_version=policy_version,
        reviewers_required=original.reviewers_required,
        amount_cents=None if money is None else money.amount_cents,
        currency=original.currency if money is None else money.currency,
        hold_reason=original.hold_reason,
        host_context=original.host_context,
        duplicate_of=original.duplicate_of,
        edited_from=original.pk,
        created_at=now,
        expires_at=original.expires_at,
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
    provider_check(reviewer)
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


# The decision code and words of a withdrawn held call, as its state and its task give them.
WITHDRAWN_CODE = "WITHDRAWN"


def confirmation_withdraw(
    *,
    confirmation_id: str,
    agent: Agent,
    customer_id: str | None = None,
    now: datetime | None = None,
) -> Confirmation:
    """The agent's host withdraws its held call: nothing executes, its money no longer counts,
    and its idempotency key is open again (an identical call is judged anew). Only the agent's
    own confirmation (and, where given, its customer's): any other id is answered as missing.
    Refused once a reviewer approved it or voted to (AlreadyApproved), or once it was decided
    otherwise or expired (AlreadyDecided). Taken under the same locks as every decision, so that
    a withdrawal and an approval at once make one of the two. Raises ConfirmationError."""
    return _raise_refusal(_withdraw(confirmation_id, agent, customer_id, now or timezone.now()))


@transaction.atomic
def _withdraw(
    confirmation_id: str, agent: Agent, customer_id: str | None, now: datetime
) -> Confirmation | ConfirmationError:
    owned = Confirmation.objects.filter(pk=confirmation_id, agent=agent)
    if customer_id is not None:
        owned = owned.filter(customer_id=customer_id)
    if not owned.exists():
        return ConfirmationNotFound(f"There is no confirmation {confirmation_id}.")
    confirmation = confirmation_locked(confirmation_id)
    refusal = withdrawal_refusal(held_call_of(confirmation), confirmation.votes.count(), now)
    if refusal is not None:
        expire_if_due(confirmation, now)
        code, reason = refusal
        return REFUSALS[code](reason, confirmation)
    reason = "The agent's host withdrew it before any reviewer approved it; nothing was done."
    return confirmation_move(
        confirmation,
        ConfirmationStatus.WITHDRAWN,
        at=now,
        event=EventKind.WITHDRAWN,
        message=reason,
        decided_at=now,
        decision_code=WITHDRAWN_CODE,
        decision_reason=reason,
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
