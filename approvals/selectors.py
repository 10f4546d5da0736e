"""What the reviewer pages read: the queue with everything a decision needs, the history, the
reconciliation list, and whose approval a confirmation still needs.

Nothing here writes: decisions go through approvals.services.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from pydantic import BaseModel, ValidationError

from approvals.deciding import (
    cast_votes,
    decision_policy,
    held_call_of,
    reviewer_limits,
    reviewer_of,
    reviewers_pool,
)
from approvals.models import ConfirmationEvent, EventKind, Vote
from approvals.reviewers import REVIEWERS_GROUP as REVIEWERS_GROUP
from dispatch.held_money import HeldStanding, held_money_of, held_money_standing
from dispatch.models import AuditRecord, Confirmation, ConfirmationStatus, Movement
from dispatch.money import major_units, money
from dispatch.outcomes import settleable, unsettled_queryset
from dispatch.pipeline.allowance import HELD, HeldSum
from dispatch.pipeline.decision import ApprovalNeeds as ApprovalNeeds
from dispatch.pipeline.decision import (
    Decision,
    Reviewer,
    approval_decision,
    approvals_standing,
)
from dispatch.pipeline.decision import Voter as Voter
from dispatch.pipeline.policy import Policy as PolicySnapshot
from dispatch.pipeline.review import Fact, FactKind, ReviewView, ToolWords
from dispatch.pipeline.tools import EditRule, ToolSpec, held_plurals
from dispatch.registry import tool_registry

# How many pending items the queue shows at once: each reads its subject and its conversation,
# and the page reloads every few seconds.
QUEUE_SHOWN = 50
# How many of the session's earlier calls an item shows (the latest ones).
EARLIER_CALLS_SHOWN = 10
# The events that settle a pending confirmation, and so say who decided it.
DECISION_EVENTS = (
    EventKind.APPROVED,
    EventKind.REJECTED,
    EventKind.EXPIRED,
    EventKind.INVALIDATED,
    EventKind.SUPERSEDED,
)
IN_FLIGHT = (ConfirmationStatus.APPROVED, ConfirmationStatus.EXECUTING)


def user_in_group(user: AbstractBaseUser | AnonymousUser, group: str) -> bool:
    if not user.is_authenticated or not user.is_active or not isinstance(user, User):
        return False
    return user.groups.filter(name=group).exists()


def effective_status(confirmation: Confirmation, now: datetime | None = None) -> str:
    """Its status as a reviewer must see it: pending past its expiry is expired already, even
    before the periodic task marks it."""
    now = now or timezone.now()
    if confirmation.status == ConfirmationStatus.PENDING and confirmation.expires_at <= now:
        return ConfirmationStatus.EXPIRED.value
    return str(confirmation.status)


def pending_queryset(now: datetime | None = None) -> QuerySet[Confirmation]:
    return Confirmation.objects.filter(
        status=ConfirmationStatus.PENDING, expires_at__gt=now or timezone.now()
    )


def pending_count() -> int:
    return pending_queryset().count()


def what_is_held() -> str:
    """What the queue holds, in the registered tools' words: "refunds", "refunds and vouchers"."""
    return held_plurals(tool_registry)


def unknown_count() -> int:
    """Executions whose outcome is unknown: held calls', and direct calls' to upstreams."""
    held = Confirmation.objects.filter(status=ConfirmationStatus.UNKNOWN).count()
    if not any(spec.remote for spec in tool_registry):
        return held
    return held + unsettled_queryset(older_than=timedelta(0), readable_only=False).count()


# What a reviewer is asked about ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HoldExplanation:
    """Why the policy held the call, in the reviewer's terms (amounts formatted)."""

    kind: str
    summary: str
    # Earlier movements the policy counted: (amount, subject, when, how it was approved).
    earlier: tuple[tuple[str, str, datetime | None, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SumNote:
    """The customer's sum that an approval judges by, in the reviewer's words."""

    summary: str
    sum_cents: int
    reviewers_required: int


@dataclass(frozen=True, slots=True)
class CustomerMoney:
    """One movement of the customer's sum beside a held call: the money the approval judges it
    with (dispatch/pipeline/allowance.py), as a reviewer reads it."""

    amount: str
    # The tool's name for its action ("Refund order"), and what it was for ("ORD-1001").
    action: str
    subject: str
    at: datetime
    # How it stands, in a reviewer's words, and whether it still waits for a reviewer.
    state: str
    waiting: bool
    # Its held call, where a human was asked: a link to its card.
    confirmation_id: str
    # It is for the same subject as the held call (another refund of the same order).
    same_subject: bool


@dataclass(frozen=True, slots=True)
class CustomerStanding:
    """The customer's money in the policy's window beside a held call: the sum the approval
    judges, what it means for this one, and why it needs one reviewer or two."""

    window: str
    # The latest movements (the sum reads a few), and how many more there are before them.
    movements: tuple[CustomerMoney, ...]
    more: int
    earlier: str
    total: str
    # What the sum means for this call, and the reviewers' rule with the policy's amounts.
    meaning: str
    reviewers_rule: str
    # Other held calls for the same subject that still wait (two refunds of one order).
    siblings: int = 0


@dataclass(frozen=True, slots=True)
class SecondLook:
    """Approving it asks once more: its amount is above the policy's second-look amount."""

    line: str
    amount: str
    total: str


@dataclass(frozen=True, slots=True)
class DuplicateNote:
    """What a possible duplicate may repeat, and where its twin is if it was held too."""

    summary: str
    twin_id: str = ""
    # Whether approving it takes the reviewer's word that it is a separate one (it was held as a
    # duplicate, or its twin is approved or executed); the first of twins still waiting does not.
    needs_word: bool = True


@dataclass(frozen=True, slots=True)
class Detail:
    label: str
    value: str
    # An amount, aligned as a figure.
    money: bool = False
    # A moment, which the pages show as a date with the exact time on hover.
    moment: datetime | None = None


@dataclass(frozen=True, slots=True)
class EditField:
    """An argument a reviewer may change before approving, as the card's edit form shows it:
    an amount in major units of its currency, a whole number, or a list whose entries may be
    left out (each offered by its position, checked)."""

    argument: str
    label: str
    rule: str
    # "amount", "number" or "list".
    kind: str
    value: str = ""
    currency: str = ""
    entries: tuple[tuple[int, str], ...] = ()
    # What the model asked, as people read it (R$ 80,00).
    asked: str = ""


def edit_fields(confirmation: Confirmation) -> tuple[EditField, ...]:
    """What of a held call its tool lets a reviewer change, each with its rule
    (ToolSpec.editable)."""
    spec = tool_registry.get(confirmation.tool)
    arguments = confirmation.arguments if isinstance(confirmation.arguments, Mapping) else {}
    if spec is None:
        return ()
    fields = []
    for editable in spec.editable:
        name, rule = editable.argument, editable.rule
        asked = arguments.get(name)
        label = name.replace("_", " ")
        if rule is EditRule.ONLY_FEWER and isinstance(asked, list):
            entries = tuple((index, str(entry)) for index, entry in enumerate(asked))
            fields.append(EditField(name, label, rule.words, "list", entries=entries))
        elif isinstance(asked, int) and name == spec.amount_field and confirmation.currency:
            value = major_units(asked, confirmation.currency)
            shown = money(asked, confirmation.currency)
            fields.append(
                EditField(
                    name, "amount", rule.words, "amount", value, confirmation.currency, asked=shown
                )
            )
        elif isinstance(asked, int):
            fields.append(
                EditField(name, label, rule.words, "number", str(asked), asked=str(asked))
            )
    return tuple(fields)


# The words for a call whose tool is gone from the registry.
PLAIN_WORDS = ToolWords(noun="call", plural="calls", verb="move", past="moved")


@dataclass(slots=True)
class ReviewItem:
    confirmation: Confirmation
    status: str
    # The action's name, and the words for it, as its tool declares them.
    tool_label: str
    words: ToolWords
    amount_cents: int | None
    currency: str
    amount: str
    subject: str
    # Arguments other than the amount, the currency and the subject (a refund's reason).
    other_arguments: tuple[Detail, ...]
    # What the tool shows of its subject as it is now (for a refund, the order), and its facts
    # formatted; None where the tool declares no review or its arguments no longer validate.
    review: ReviewView | None
    facts: tuple[Detail, ...]
    approvals: ApprovalNeeds
    hold: HoldExplanation | None
    earlier_calls: Sequence[AuditRecord]
    expiring_soon: bool = False
    stuck: bool = False
    events: Sequence[ConfirmationEvent] = field(default_factory=tuple)
    # While it waits for a decision: the customer's sum now, and the twin it may repeat.
    customer_sum: SumNote | None = None
    duplicate: DuplicateNote | None = None
    # Approved, and no worker has taken it yet (the broker or the workers are away).
    waiting_for_worker: bool = False
    # While it waits: the customer's money in the window beside it, and whether approving it
    # asks once more.
    standing: CustomerStanding | None = None
    second_look: SecondLook | None = None
    # What the reader's approval would do, as the service decides it (dispatch.pipeline.decision);
    # None where there is no reader.
    decision: Decision | None = None
    # Its tool is retired (docs/tools.md): agents no longer call it, its held calls are still
    # decided under its own rules; the version that replaces it, if any.
    tool_retired: bool = False
    successor: str | None = None

    @property
    def id(self) -> str:
        return self.confirmation.id

    @property
    def title(self) -> str:
        return " ".join(part for part in (self.amount, self.subject) if part)

    @property
    def edits(self) -> tuple[EditField, ...]:
        """What a reviewer may change before approving it, while it waits."""
        if self.status != ConfirmationStatus.PENDING:
            return ()
        return edit_fields(self.confirmation)

    @property
    def subject_gone(self) -> bool:
        """Its subject no longer exists for the customer (the order was deleted, say)."""
        return self.review is not None and not self.review.found

    @property
    def earlier_rejected(self) -> int:
        return sum(1 for record in self.earlier_calls if not record.ok)

    @property
    def timeline(self) -> list[ConfirmationEvent]:
        """The events as a reader follows them: the vote that made the decision is the
        approval itself, so it is shown once."""
        events = list(self.events)
        shown = []
        for index, event in enumerate(events):
            after = events[index + 1] if index + 1 < len(events) else None
            decided_by_it = (
                event.kind == EventKind.VOTED
                and after is not None
                and after.kind in (EventKind.APPROVED, EventKind.INVALIDATED)
                and after.actor_id == event.actor_id
            )
            if not decided_by_it:
                shown.append(event)
        return shown


def review_items(
    confirmations: Iterable[Confirmation],
    *,
    reader: User | None,
    with_events: bool = False,
    now: datetime | None = None,
) -> list[ReviewItem]:
    """Everything a reviewer sees of each confirmation, read in a few queries."""
    now = now or timezone.now()
    confirmations = list(confirmations)
    ids = [confirmation.id for confirmation in confirmations]
    votes: dict[str, list[Vote]] = {}
    for vote in Vote.objects.filter(confirmation_id__in=ids).select_related("reviewer"):
        votes.setdefault(vote.confirmation_id, []).append(vote)
    limits = reviewer_limits()
    reviewers = reviewers_pool(limits)
    events: dict[str, list[ConfirmationEvent]] = {}
    if with_events:
        for event in ConfirmationEvent.objects.filter(confirmation_id__in=ids).order_by("at", "id"):
            events.setdefault(event.confirmation_id, []).append(event)
    soon = now + timedelta(minutes=settings.TOOLGATE_EXPIRING_SOON_MINUTES)
    stuck_before = now - timedelta(minutes=settings.TOOLGATE_STUCK_AFTER_MINUTES)

    items = []
    for confirmation in confirmations:
        spec = tool_registry.get(confirmation.tool)
        arguments = _validated(spec, confirmation.arguments)
        # As the hold kept it: the tool's money may come from its subject's state.
        currency = confirmation.currency
        amount_cents = confirmation.amount_cents
        amount = money(amount_cents, currency)
        review = _review(spec, arguments, confirmation.customer_id)
        words = spec.action_words if spec else PLAIN_WORDS
        status = effective_status(confirmation, now)
        standing = _standing(confirmation, now) if status == ConfirmationStatus.PENDING else None
        held = None if standing is None else standing.held
        policy = _policy(confirmation)
        decision = _decision(
            confirmation,
            votes.get(confirmation.id, []),
            limits=limits,
            reviewers=reviewers,
            held=held,
            policy=policy,
            reader=reader,
            now=now,
        )
        items.append(
            ReviewItem(
                confirmation=confirmation,
                status=status,
                tool_label=spec.title if spec else confirmation.tool,
                tool_retired=spec is not None and spec.retired,
                successor=tool_registry.successor_of(spec.name) if spec and spec.retired else None,
                words=words,
                amount_cents=amount_cents,
                currency=currency,
                amount=amount,
                subject=_subject(spec, arguments, review),
                other_arguments=_other_arguments(spec, confirmation.arguments),
                review=review,
                facts=_facts(review, currency),
                approvals=decision.needs
                if decision is not None
                else approvals_standing(
                    held_call_of(confirmation),
                    cast_votes(votes.get(confirmation.id, []), limits),
                    reviewers=reviewers,
                    customer_sum=held,
                    money=money,
                ),
                decision=decision,
                hold=hold_explanation(confirmation.hold_reason, currency, words),
                earlier_calls=earlier_calls(confirmation),
                expiring_soon=status == ConfirmationStatus.PENDING
                and confirmation.expires_at <= soon,
                stuck=_is_stuck(confirmation, stuck_before),
                events=events.get(confirmation.id, ()),
                customer_sum=_sum_note(confirmation, held, currency),
                duplicate=_duplicate_note(confirmation, held, currency),
                waiting_for_worker=status == ConfirmationStatus.APPROVED,
                standing=_customer_standing(confirmation, standing, policy, currency, now),
                second_look=_second_look(confirmation, held, policy, currency)
                if status == ConfirmationStatus.PENDING
                else None,
            )
        )
    return items


def _policy(confirmation: Confirmation) -> PolicySnapshot | None:
    # As the approval judges it: the agent's current policy, while the agent is active.
    return decision_policy(confirmation.agent)


def _standing(confirmation: Confirmation, now: datetime) -> HeldStanding | None:
    """The customer's sum as an approval now would judge it (under the agent's current policy),
    with the movements it was read from."""
    policy = _policy(confirmation)
    if policy is None:
        return None
    return held_money_standing(confirmation=confirmation, policy=policy, now=now)


def _customer_standing(
    confirmation: Confirmation,
    standing: HeldStanding | None,
    policy: PolicySnapshot | None,
    currency: str,
    now: datetime,
) -> CustomerStanding | None:
    """The customer's money beside a held call, read as the approval reads it: the same sum."""
    if standing is None or policy is None or not currency:
        return None
    held, history = standing
    _, subject = held_money_of(confirmation)
    movements = tuple(
        CustomerMoney(
            amount=money(movement.amount_cents, currency),
            action=_action_label(movement.tool),
            subject=movement.subject,
            at=movement.at,
            state=EARLIER_STATES.get(movement.approval, movement.approval),
            waiting=movement.approval == HELD,
            confirmation_id=movement.confirmation_id,
            same_subject=bool(subject) and movement.subject == subject,
        )
        for movement in reversed(history.customer_window)
    )
    window = _hours(policy.auto_approve_window_seconds)
    this = money(held.amount_cents, currency)
    total = money(held.sum_cents, currency)
    if held.earlier_cents:
        meaning, verb = f"That sum, {total}", "is "
    else:
        meaning = f"Nothing else for this customer in the last {window}: the sum is this {this}"
        verb = ""
    limits = policy.limits(currency)
    if limits is not None and held.sum_cents >= limits.auto_approve_below_cents:
        meaning += (
            f", {verb}not below {money(limits.auto_approve_below_cents, currency)}, the most that "
            "may move without a human."
        )
    elif limits is not None:
        meaning += (
            f", {verb}below {money(limits.auto_approve_below_cents, currency)}, the most that may "
            "move without a human: the call was held for the reason above."
        )
    else:
        meaning += "."
    return CustomerStanding(
        window=window,
        movements=movements,
        more=max(0, history.customer_window_count - len(movements)),
        earlier=money(held.earlier_cents, currency),
        total=total,
        meaning=meaning,
        reviewers_rule=reviewers_rule(policy, held.sum_cents, currency),
        siblings=sum(1 for m in movements if m.same_subject and m.waiting),
    )


def reviewers_rule(policy: PolicySnapshot, sum_cents: int, currency: str) -> str:
    """Why a sum needs one reviewer or two, with the policy's amounts in its currency."""
    limits = policy.limits(currency)
    total = money(sum_cents, currency)
    if limits is None:
        return (
            f"One reviewer: this agent's policy sets no thresholds in {currency}, so a human "
            f"decides every call in it, and one is enough."
        )
    line = limits.two_reviewers_from_cents
    if line is None:
        return f"One reviewer: this agent's policy never asks for two in {currency}."
    if sum_cents >= line:
        return (
            f"Two different reviewers: the customer's sum, {total}, is not below "
            f"{money(line, currency)}, from which this agent's policy asks for two."
        )
    return (
        f"One reviewer: the customer's sum, {total}, is below {money(line, currency)}, from "
        "which this agent's policy asks for two."
    )


def _second_look(
    confirmation: Confirmation, held: HeldSum | None, policy: PolicySnapshot | None, currency: str
) -> SecondLook | None:
    if policy is None or not policy.needs_second_look(confirmation.amount_cents, currency):
        return None
    line = policy.confirm_above(currency)
    assert line is not None and confirmation.amount_cents is not None
    total = held.sum_cents if held is not None else confirmation.amount_cents
    return SecondLook(
        line=money(line, currency),
        amount=money(confirmation.amount_cents, currency),
        total=money(total, currency),
    )


def _action_label(tool: str) -> str:
    spec = tool_registry.get(tool)
    return spec.title if spec is not None else tool


def _sum_note(confirmation: Confirmation, held: HeldSum | None, currency: str) -> SumNote | None:
    """The sum in words, when the customer's other money counts with this call."""
    if held is None or not held.earlier_cents or not currency:
        return None
    moved = held.earlier_cents - held.held_cents
    parts = [
        f"{money(cents, currency)} already {words}"
        for cents, words in ((held.held_cents, "held"), (moved, "moved"))
        if cents
    ]
    policy = confirmation.agent.current_policy
    window = f" in the last {_hours(policy.auto_approve_window_seconds)}" if policy else ""
    reviewers = "two reviewers" if held.reviewers_required > 1 else "one reviewer"
    summary = (
        f"With {' and '.join(parts)} for this customer{window}, the sum is "
        f"{money(held.sum_cents, currency)}: {reviewers}."
    )
    return SumNote(summary, held.sum_cents, held.reviewers_required)


def _duplicate_note(
    confirmation: Confirmation, held: HeldSum | None, currency: str
) -> DuplicateNote | None:
    if held is None:
        return None
    twin = next(iter(held.twins_approved), None) or next(iter(held.twins), None)
    if twin is None and not confirmation.duplicate_of:
        return None
    if twin is None:
        found = Movement.objects.filter(key=confirmation.duplicate_of).first()
        if found is None:
            return DuplicateNote(
                "It was held as a possible duplicate of money that no longer "
                "counts (released since)."
            )
        how, twin_id, at = found.approval, found.confirmation_id, found.at
        amount, subject = found.amount_cents, found.subject
    else:
        how, twin_id, at = twin.approval, twin.confirmation_id, twin.at
        amount, subject = twin.amount_cents, twin.subject
    state = TWIN_STATES.get(how, how)
    shown = money(amount, currency)
    when = timezone.localtime(at).strftime("%d %b %H:%M")
    if not confirmation.duplicate_of and not held.twins_approved:
        return DuplicateNote(
            f"The same {shown} on {subject} was sent again by another call ({when}) "
            "and waits too: approving this one makes the other a duplicate.",
            twin_id,
            needs_word=False,
        )
    return DuplicateNote(
        f"It may repeat {shown} on {subject}, {state} by another call ({when}). "
        "Approve it only if it is a separate one.",
        twin_id,
    )


# How a twin's money stands, in a reviewer's words.
TWIN_STATES = {
    "policy": "executed without a human",
    "reviewer": "executed after a review",
    "approved": "approved",
    "held": "also waiting for a decision",
}


def _hours(seconds: int) -> str:
    hours = seconds / 3600
    if hours == int(hours):
        return "24 hours" if hours == 24 else f"{int(hours)} hour{'s' if hours != 1 else ''}"
    return f"{seconds // 60} minutes"


def queue_items(
    *, reader: User, limit: int = QUEUE_SHOWN, now: datetime | None = None
) -> list[ReviewItem]:
    """Pending confirmations, the soonest to expire first (the first `limit` of them)."""
    now = now or timezone.now()
    pending = (
        pending_queryset(now)
        .select_related("agent__current_policy")
        .order_by("expires_at", "created_at")
    )
    return review_items(pending[:limit], reader=reader, now=now)


def in_flight_items(*, reader: User, now: datetime | None = None) -> list[ReviewItem]:
    """Approved confirmations not executed yet: the ones stuck past a few minutes stand out."""
    in_flight = (
        Confirmation.objects.filter(status__in=IN_FLIGHT)
        .select_related("agent__current_policy")
        .order_by("decided_at", "created_at")
    )
    return review_items(in_flight, reader=reader, now=now)


def confirmation_item(*, confirmation_id: str, reader: User) -> ReviewItem | None:
    confirmation = (
        Confirmation.objects.filter(pk=confirmation_id)
        .select_related("agent__current_policy")
        .first()
    )
    if confirmation is None:
        return None
    return review_items([confirmation], reader=reader, with_events=True)[0]


def reconciliation_items(*, reader: User) -> list[ReviewItem]:
    unknown = (
        Confirmation.objects.filter(status=ConfirmationStatus.UNKNOWN)
        .select_related("agent__current_policy")
        .order_by("finished_at", "created_at")
    )
    return review_items(unknown, reader=reader, with_events=True)


@dataclass(frozen=True, slots=True)
class DirectOutcome:
    """A direct call (held by no one) whose effect on its system of record may or may not have
    happened: its answer was lost, or its process died while the upstream had it."""

    key: str
    tool_label: str
    amount: str
    subject: str
    customer_id: str
    agent: str
    # unknown, or in_progress (its process died: its lease ran out).
    status: str
    since: datetime
    # Whether its tool declares a read that settles it (by key or by arguments).
    readable: bool


# The most direct outcomes the reconciliation page lists: the oldest first.
DIRECT_OUTCOMES_SHOWN = 100


def direct_outcomes() -> list[DirectOutcome]:
    records = list(
        unsettled_queryset(older_than=timedelta(0), readable_only=False).select_related("agent")[
            :DIRECT_OUTCOMES_SHOWN
        ]
    )
    moved = {
        movement.key: movement
        for movement in Movement.objects.filter(
            key__in=[record.key for record in records], released_at=None
        )
    }
    outcomes = []
    for record in records:
        spec = tool_registry.get(record.tool)
        movement = moved.get(record.key)
        call = record.remote_call if isinstance(record.remote_call, Mapping) else {}
        arguments = call.get("arguments") if isinstance(call.get("arguments"), Mapping) else {}
        assert isinstance(arguments, Mapping)
        subject = ""
        if spec is not None and spec.subject_field:
            subject = str(arguments.get(spec.subject_field, ""))
        outcomes.append(
            DirectOutcome(
                key=record.key,
                tool_label=spec.title if spec else record.tool,
                amount=money(movement.amount_cents, movement.currency) if movement else "",
                subject=subject or (movement.subject if movement else ""),
                customer_id=str(
                    call.get("customer_id") or (movement.customer_id if movement else "")
                ),
                agent=record.agent.name,
                status=record.status,
                since=record.updated_at,
                readable=settleable(spec),
            )
        )
    return outcomes


def earlier_calls(confirmation: Confirmation) -> list[AuditRecord]:
    """What the model tried in the same session before the held call, the latest few."""
    latest = (
        AuditRecord.objects.filter(
            agent_id=confirmation.agent_id,
            session_id=confirmation.session_id,
            at__lt=confirmation.created_at,
        )
        .exclude(confirmation_id=confirmation.id)
        .order_by("-at", "-id")[:EARLIER_CALLS_SHOWN]
    )
    return list(reversed(latest))


@dataclass(frozen=True, slots=True)
class DecidedElsewhere:
    confirmation_id: str
    title: str
    status: str
    actor: str


def decided_elsewhere(
    shown_ids: Iterable[str], *, reader: User, now: datetime | None = None
) -> list[DecidedElsewhere]:
    """Of the items a reader had on screen, those no longer pending, and who settled them."""
    now = now or timezone.now()
    ids = [confirmation_id for confirmation_id in dict.fromkeys(shown_ids) if confirmation_id]
    if not ids:
        return []
    gone = Confirmation.objects.filter(pk__in=ids[:200]).exclude(
        status=ConfirmationStatus.PENDING, expires_at__gt=now
    )
    notices = []
    for item in review_items(gone, reader=reader, with_events=True, now=now):
        decision = next(
            (event for event in reversed(item.events) if event.kind in DECISION_EVENTS), None
        )
        if decision is None or decision.actor_id is None:
            actor = "" if decision is None else decision.actor_label
        else:
            actor = "you" if decision.actor_id == reader.pk else decision.actor_label
        notices.append(DecidedElsewhere(item.id, item.title, item.status, actor))
    return notices


# History ----------------------------------------------------------------------------------


def history_queryset(now: datetime | None = None) -> QuerySet[Confirmation]:
    """Every confirmation no longer waiting for a reviewer, latest first; `closed_at` is when it
    was decided, or when it expired."""
    now = now or timezone.now()
    return (
        Confirmation.objects.filter(
            ~Q(status=ConfirmationStatus.PENDING)
            | Q(status=ConfirmationStatus.PENDING, expires_at__lte=now)
        )
        .annotate(closed_at=Coalesce("decided_at", "expires_at"))
        .select_related("agent__current_policy")
        .order_by("-closed_at", "-created_at")
    )


def deciders(events: Iterable[ConfirmationEvent]) -> list[str]:
    """The reviewers who approved, voted, rejected or reconciled, in order, each once."""
    acting = {EventKind.VOTED, EventKind.APPROVED, EventKind.REJECTED, EventKind.RECONCILED}
    return list(
        dict.fromkeys(
            event.actor_label for event in events if event.kind in acting and event.actor_id
        )
    )


# Pieces ----------------------------------------------------------------------------------


def _validated(spec: ToolSpec[Any] | None, arguments: Mapping[str, Any]) -> BaseModel | None:
    if spec is None:
        return None
    try:
        validated: BaseModel = spec.arguments.model_validate(arguments)
    except ValidationError:
        # Stored under an older declaration of the tool: the page shows the raw arguments.
        return None
    return validated


def _review(
    spec: ToolSpec[Any] | None, arguments: BaseModel | None, customer_id: str
) -> ReviewView | None:
    if spec is None or arguments is None or spec.review is None:
        return None
    return spec.review(arguments, customer_id)


def _subject(
    spec: ToolSpec[Any] | None, arguments: BaseModel | None, review: ReviewView | None
) -> str:
    if review is not None and review.subject:
        return review.subject
    return spec.subject_of(arguments) if spec and arguments else ""


def _facts(review: ReviewView | None, currency: str) -> tuple[Detail, ...]:
    """The review's facts as a reviewer reads them: amounts in the call's currency (or the
    review's) as people write it (R$ 120,00), the rest as the tool put it."""
    if review is None:
        return ()
    currency = currency or review.currency
    return tuple(_fact(fact, currency) for fact in review.facts)


def _fact(fact: Fact, currency: str) -> Detail:
    if fact.kind is FactKind.MONEY and isinstance(fact.value, int):
        return Detail(fact.label, money(fact.value, currency), money=True)
    if fact.kind is FactKind.DATE:
        moment = _parsed_time(fact.value)
        if moment is not None:
            return Detail(fact.label, "", moment=moment)
    return Detail(fact.label, str(fact.value), money=fact.kind is FactKind.MONEY)


def _other_arguments(
    spec: ToolSpec[Any] | None, arguments: Mapping[str, Any]
) -> tuple[Detail, ...]:
    shown = {spec.amount_field, spec.currency_field, spec.subject_field} if spec else set()
    return tuple(
        Detail(name.replace("_", " "), str(value).replace("_", " "))
        for name, value in arguments.items()
        if name not in shown
    )


def _decision(
    confirmation: Confirmation,
    votes: Sequence[Vote],
    *,
    limits: Mapping[int, Mapping[str, int]],
    reviewers: Sequence[Reviewer],
    held: HeldSum | None,
    policy: PolicySnapshot | None,
    reader: User | None,
    now: datetime,
) -> Decision | None:
    """What the reader's approval would do, as the service will decide it: with their word on a
    possible duplicate and their second look given (the card asks for them, as
    Decision.asks_separate and .asks_second_look say), and without the re-check of the live
    state, which only the approval runs."""
    if reader is None:
        return None
    return approval_decision(
        held_call_of(confirmation),
        cast_votes(votes, limits),
        reviewer_of(reader, limits),
        reviewers=reviewers,
        customer_sum=held,
        policy=policy,
        now=now,
        money=money,
        separate=True,
        confirmed=True,
    )


def hold_explanation(
    reason: Mapping[str, Any] | None, currency: str, words: ToolWords = PLAIN_WORDS
) -> HoldExplanation | None:
    """The policy's reason in a reviewer's words (the held tool's words for its action); an
    unknown kind keeps the policy's message."""
    if not isinstance(reason, Mapping):
        return None
    kind = str(reason.get("kind", ""))
    data = reason.get("data") if isinstance(reason.get("data"), Mapping) else {}
    assert isinstance(data, Mapping)

    def amount(key: str) -> str:
        value = data.get(key)
        return money(value, currency) if isinstance(value, int) else str(value)

    earlier = tuple(
        (
            money(movement["amount_cents"], currency),
            str(movement.get("subject", "")),
            _parsed_time(movement.get("at")),
            EARLIER_STATES.get(str(movement.get("approval")), "without a human"),
        )
        for movement in data.get("earlier", ())
        if isinstance(movement, Mapping) and isinstance(movement.get("amount_cents"), int)
    )
    if kind == "amount":
        summary = (
            f"{amount('amount_cents')} is not below {amount('auto_approve_below_cents')}, "
            f"the most this agent may {words.verb} without a human."
        )
    elif kind == "window_sum":
        on_its_way = data.get("held_cents") or data.get("reviewed_cents")
        summary = (
            f"With what was already moved or is on its way for this customer recently "
            f"({amount('earlier_cents')}"
            + (f", of which {amount('held_cents')} held" if data.get("held_cents") else "")
            + f"), the sum is {amount('sum_cents')}: not below "
            f"{amount('auto_approve_below_cents')}."
            if on_its_way
            else f"With what was already {words.past} to this customer without a human recently "
            f"({amount('earlier_cents')}), the sum is {amount('sum_cents')}: not below "
            f"{amount('auto_approve_below_cents')}."
        )
    elif kind == "agent_daily_cap":
        summary = (
            f"The agent already moved {amount('agent_day_cents')} without a human today (UTC); "
            f"this would pass its daily cap of {amount('daily_cap_cents')}."
        )
    elif kind == "high_risk":
        summary = (
            f"It moves no amount that the policy could weigh, so a human decides every "
            f"{words.noun}."
        )
    elif kind == "possible_duplicate":
        summary = (
            "It may repeat another call of the same amount on the same subject, in this "
            "conversation or another, held, approved or executed: a possible duplicate."
        )
    else:
        summary = str(reason.get("message", ""))
    return HoldExplanation(kind=kind, summary=summary, earlier=earlier)


# How an earlier movement in the customer's sum stands, in a reviewer's words.
EARLIER_STATES = {
    "policy": "without a human",
    "reviewer": "by a reviewer",
    "held": "held for a reviewer",
    "approved": "approved, not executed yet",
}


def _parsed_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _is_stuck(confirmation: Confirmation, before: datetime) -> bool:
    if confirmation.status == ConfirmationStatus.EXECUTING:
        since = confirmation.executing_since or confirmation.decided_at
    elif confirmation.status == ConfirmationStatus.APPROVED:
        since = confirmation.decided_at
    else:
        return False
    return since is not None and since < before
