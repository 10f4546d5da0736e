"""Who may decide a held call, and what an approval of it does: one pure function of plain values.

approvals.services enforces the Decision it returns; the reviewer's queue, a confirmation's page
and the approvals API explain the very same object, so that a page never promises what the
service will not do. It reads the held call, its approvals so far, the reviewer, the other
reviewers and their approval limits, the customer's sum as the approval judges it now
(allowance.HeldSum) and the agent's policy, and refuses, in this order:

1. a call that is no longer pending, or whose time is up (`already_decided`);
2. a second approval by the same reviewer: another reviewer's is needed (`already_voted`);
3. a possible duplicate (held as one, or a twin approved, executing or executed since), without
   the reviewer's word that it is a separate one (`possible_duplicate`);
4. an amount above the policy's second-factor line in its currency (`factor_above`), without
   the reviewer's fresh second factor (`second_factor_required`);
5. an amount above the policy's second-look amount in its currency (`confirm_above`), without
   the reviewer's second look (`confirmation_required`); nothing is recorded.

Otherwise the approval counts. The customer's sum of now says how many different reviewers must
approve (the policy's two-reviewer line) and that one approver's limit in the currency must
cover it (no limit in a currency is no cap in it). Once both hold, the call is judged again under
the live state (the engine's recheck): it executes, or it is invalidated; without an active
policy it is invalidated.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dispatch.pipeline import codes
from dispatch.pipeline.allowance import HeldSum
from dispatch.pipeline.engine import Refusal
from dispatch.pipeline.policy import Policy

# An amount in minor units and its currency, as a reviewer reads it ("R$ 25,90").
MoneyWords = Callable[[int, str], str]

PENDING = "pending"

# Why an approval is refused: stable codes, which the approvals API answers with.
ALREADY_DECIDED = "already_decided"
ALREADY_VOTED = "already_voted"
POSSIBLE_DUPLICATE = "possible_duplicate"
SECOND_LOOK_REQUIRED = "confirmation_required"
# Why a withdrawal is refused: a reviewer approved it (or voted to), so it is theirs now.
ALREADY_APPROVED = "already_approved"
FACTOR_REQUIRED = "second_factor_required"

# Why an approval that suffices does not execute when the agent has no active policy any more.
NO_ACTIVE_POLICY = Refusal(codes.TOOL_NOT_ALLOWED, "the agent has no active policy any more")


class Outcome(enum.StrEnum):
    # The approvals suffice and the call still passes: it executes.
    EXECUTE = "execute"
    # The approval counts; more are needed (Decision.after says how many and from whom).
    VOTE_RECORDED = "vote_recorded"
    # The approval cannot be made as asked; nothing is recorded (Decision.code says why).
    REFUSED = "refused"
    # The approvals suffice, but the call no longer passes its checks: nothing executes.
    INVALIDATED = "invalidated"


@dataclass(frozen=True, slots=True)
class HeldCall:
    """A held call as its confirmation keeps it."""

    status: str
    expires_at: datetime
    decided_at: datetime | None
    amount_cents: int | None
    currency: str
    # How many reviewers the sum at the hold needed; the sum of now decides where there is one.
    reviewers_required: int
    # The policy held it as a possible duplicate of money another call moved.
    held_as_duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Reviewer:
    id: int
    username: str
    # The most they may approve, in minor units by currency; no limit in a currency: no cap in it.
    limits: Mapping[str, int] = field(default_factory=dict)

    def covers(self, amount_cents: int | None, currency: str) -> bool:
        limit = self.limits.get(currency)
        return limit is None or amount_cents is None or limit >= amount_cents


@dataclass(frozen=True, slots=True)
class CastVote:
    """An approval already given."""

    reviewer: Reviewer
    at: datetime


@dataclass(frozen=True, slots=True)
class Voter:
    username: str
    at: datetime
    # Their approval limit covers the amount (no limit in the currency covers any amount).
    covers: bool


@dataclass(frozen=True, slots=True)
class ApprovalNeeds:
    """How far the approvals of a held call are, what it still needs to execute, and what the
    reader's approval would do."""

    required: int
    voters: tuple[Voter, ...]
    # More different reviewers to approve.
    missing: int
    # No reviewer who approved so far may approve the amount alone.
    needs_limit: bool
    # Reviewers who have not approved and whose limit covers the amount.
    covering: tuple[str, ...]
    # What the reader's own approval would do: "decides", "votes", "voted" (already did), or
    # "invalidates" (it would decide, but the agent has no active policy any more); empty where
    # there is no reader or the call is no longer pending.
    yours: str
    # The amount an approver's limit must cover (the customer's sum), formatted.
    amount: str
    # The reader's limit covers the amount.
    reader_covers: bool = True
    # Some reviewer's limit does not cover the amount: who approves matters, not only how many.
    limits_matter: bool = False
    # Who may approve and has no limit in the currency (no cap in it), and that currency.
    uncapped: tuple[str, ...] = ()
    currency: str = ""
    # That amount in minor units; None for a call that moves no amount.
    covered_cents: int | None = None

    @property
    def sufficient(self) -> bool:
        """Enough different reviewers approved, one of them with a limit that covers the sum."""
        return not self.missing and any(voter.covers for voter in self.voters)

    @property
    def missing_words(self) -> list[str]:
        """Whose approval is still needed, as the event log keeps it; empty when they suffice."""
        words = []
        if self.missing:
            words.append(
                f"{self.missing} more reviewer{'s' if self.missing > 1 else ''}"
                + (" (another than who approved)" if self.voters else "")
            )
        if self.covered_cents is not None and self.voters and self.needs_limit:
            words.append(f"a reviewer who may approve {self.covered_cents} {self.currency}")
        return words

    @property
    def uncapped_note(self) -> str:
        """Who has no cap, where limits matter: a reviewer without a limit in a currency may
        approve any sum in it."""
        if not self.limits_matter or not self.uncapped:
            return ""
        names = _one_of(self.uncapped).replace(" or ", " and ")
        return f"No approval limit in {self.currency}: {names}"

    @property
    def still_needed(self) -> str:
        needs_limit = self.needs_limit and self.limits_matter
        if not self.missing and not needs_limit:
            return ""
        if self.missing > 1:
            needed = f"approvals from {self.missing} different reviewers"
        elif self.missing:
            needed = "another reviewer's approval" if self.voters else "one approval"
        else:
            needed = "one more approval"
        if not needs_limit:
            return f"Needs {needed}"
        who = f" ({_one_of(self.covering)})" if self.covering else ""
        if self.missing > 1:
            return f"Needs {needed}, one of whom has a limit that covers {self.amount}{who}"
        return f"Needs {needed}, from a reviewer whose limit covers {self.amount}{who}"

    @property
    def still_needed_clause(self) -> str:
        """still_needed inside a sentence ("…: needs one approval"): only its first letter
        lowered, so that its amounts keep their currency's own letters (R$, not r$)."""
        needed = self.still_needed
        return needed[:1].lower() + needed[1:]

    @property
    def your_note(self) -> str:
        """Why the reader's approval would be a vote rather than the decision, or would decide
        and execute nothing."""
        if self.yours == "invalidates":
            return (
                "The agent has no active policy any more: your approval settles it as "
                "invalidated, and nothing executes."
            )
        if self.yours != "votes":
            return ""
        if self.missing > 1:
            return (
                f"{self.required} different reviewers must approve: yours is one of them, and "
                "another reviewer's approval executes it."
            )
        if not self.reader_covers:
            return (
                f"{self.amount} is above your approval limit: yours counts as a vote, and a "
                "reviewer whose limit covers it must approve too."
            )
        return "Your approval counts as a vote."


@dataclass(frozen=True, slots=True)
class Decision:
    """What one reviewer's approval of a held call does, and why, in words a page can show."""

    outcome: Outcome
    # A refusal's code (already_voted...), or the re-check's code name where it is invalidated.
    code: str
    # Why it was refused or invalidated; for a recorded vote, what is still needed.
    reason: str
    # The approvals as they stand, with what this reviewer's approval would do (`yours`).
    needs: ApprovalNeeds
    # The approvals with this one counted: how many more are needed and from whom. The same
    # as `needs` where it is refused.
    after: ApprovalNeeds
    # How many different reviewers the customer's sum of now needs.
    reviewers_required: int
    # What approving it asks besides the click: the reviewer's word that a possible duplicate is
    # a separate one, and a second look at an amount above the policy's confirm_above.
    asks_separate: bool = False
    asks_second_look: bool = False
    # ... and the reviewer's fresh second factor, for an amount above the policy's factor_above.
    asks_factor: bool = False
    # The re-check's refusal, where it is invalidated.
    invalidation: Refusal | None = None


def approval_decision(
    held: HeldCall,
    votes: Sequence[CastVote],
    reviewer: Reviewer,
    *,
    reviewers: Sequence[Reviewer],
    customer_sum: HeldSum | None,
    policy: Policy | None,
    now: datetime,
    money: MoneyWords,
    separate: bool = False,
    confirmed: bool = False,
    factor: bool = False,
    recheck: Callable[[Policy], Refusal | None] | None = None,
) -> Decision:
    """What `reviewer`'s approval of the held call does now.

    `votes` are the approvals given so far, `reviewers` everyone who may approve (for whose
    limit covers the sum), `customer_sum` the call's sum with the customer's other money in the
    window under `policy` (None where it moves no amount or there is no policy), `policy` the
    agent's current policy if the agent is active. `recheck` judges the call again under the
    live state; a page passes none, and then an approval that suffices is told as one that
    executes. `money` formats the amounts in the words; `separate` and `confirmed` are the
    reviewer's word on a possible duplicate and their second look; `factor` that the reviewer
    gave a fresh second factor (the door that carried the approval checked it)."""
    required = _required(held, customer_sum)
    covered = _covered(held, customer_sum)
    asks_separate = customer_sum is not None and (
        held.held_as_duplicate or bool(customer_sum.twins_approved)
    )
    asks_second_look = policy is not None and policy.needs_second_look(
        held.amount_cents, held.currency
    )
    asks_factor = policy is not None and policy.needs_factor(held.amount_cents, held.currency)
    closed = closed_reason(held, now)
    voted = any(vote.reviewer.id == reviewer.id for vote in votes)
    counted = list(votes) if voted else [*votes, CastVote(reviewer, now)]
    after = _needs(held, counted, None, reviewers, required, covered, money, yours="")
    if closed is not None:
        yours = ""
    elif voted:
        yours = "voted"
    else:
        yours = "votes" if not after.sufficient else "decides" if policy else "invalidates"
    needs = _needs(held, votes, reviewer, reviewers, required, covered, money, yours=yours)

    def decided(
        outcome: Outcome,
        code: str = "",
        reason: str = "",
        invalidation: Refusal | None = None,
    ) -> Decision:
        return Decision(
            outcome,
            code,
            reason,
            needs,
            needs if outcome is Outcome.REFUSED else after,
            required,
            asks_separate=asks_separate,
            asks_second_look=asks_second_look,
            asks_factor=asks_factor,
            invalidation=invalidation,
        )

    if closed is not None:
        return decided(Outcome.REFUSED, ALREADY_DECIDED, closed)
    if voted:
        return decided(
            Outcome.REFUSED,
            ALREADY_VOTED,
            "You approved this already; it needs another reviewer's approval.",
        )
    if asks_separate and not separate:
        assert customer_sum is not None
        return decided(
            Outcome.REFUSED,
            POSSIBLE_DUPLICATE,
            f"It may repeat {_twin_words(customer_sum, held.currency, money)}. Approve it only "
            "if it is a separate one, with its own approval as such.",
        )
    if asks_factor and not factor:
        assert policy is not None
        limits = policy.limits(held.currency)
        line = limits.factor_above_cents if limits is not None else None
        return decided(
            Outcome.REFUSED,
            FACTOR_REQUIRED,
            f"Approving more than {money(line or 0, held.currency)} needs your second factor, "
            "given within the last minutes: enter a code from your authenticator app.",
        )
    if asks_second_look and not confirmed:
        assert policy is not None
        return decided(
            Outcome.REFUSED,
            SECOND_LOOK_REQUIRED,
            _second_look_words(held, policy, customer_sum, money),
        )
    if not after.sufficient:
        return decided(Outcome.VOTE_RECORDED, reason=after.still_needed)
    invalidation = (
        NO_ACTIVE_POLICY if policy is None else recheck(policy) if recheck is not None else None
    )
    if invalidation is not None:
        return decided(
            Outcome.INVALIDATED, invalidation.code.name, invalidation.message, invalidation
        )
    return decided(Outcome.EXECUTE)


def approvals_standing(
    held: HeldCall,
    votes: Sequence[CastVote],
    *,
    reviewers: Sequence[Reviewer],
    customer_sum: HeldSum | None,
    money: MoneyWords,
) -> ApprovalNeeds:
    """The approvals as they stand, for a reader who is no reviewer in particular."""
    return _needs(
        held,
        votes,
        None,
        reviewers,
        _required(held, customer_sum),
        _covered(held, customer_sum),
        money,
        yours="",
    )


def closed_reason(held: HeldCall, now: datetime, action: str = "approved") -> str | None:
    """Why the held call can no longer be decided (approved or rejected, or withdrawn: the
    `action` its words name); None while it waits."""
    if held.status == PENDING and held.expires_at <= now:
        return (
            f"It expired at {held.expires_at.isoformat(timespec='seconds')}; it can no longer "
            f"be {action}."
        )
    if held.status != PENDING:
        decided = f" (decided at {held.decided_at:%H:%M:%S})." if held.decided_at else "."
        return f"It is already {held.status}{decided}"
    return None


# Where an approved held call may be: its execution's statuses.
_APPROVED_SINCE = frozenset({"approved", "executing", "executed", "failed", "unknown"})


def withdrawal_refusal(held: HeldCall, votes: int, now: datetime) -> tuple[str, str] | None:
    """Why the agent's host may not withdraw the held call (a stable code and words), or None.

    Withdrawing takes what no reviewer has acted on yet: once a reviewer approved it, or voted
    to, the decision is theirs, and the host learns its outcome instead."""
    approved = held.status in _APPROVED_SINCE or (
        held.status == PENDING and votes > 0 and held.expires_at > now
    )
    if approved:
        done = (
            "voted to approve it"
            if held.status == PENDING
            else f"approved it (it is {held.status})"
        )
        return (
            ALREADY_APPROVED,
            f"A reviewer {done}; it can no longer be withdrawn. Its outcome follows.",
        )
    closed = closed_reason(held, now, action="withdrawn")
    if closed is not None:
        return ALREADY_DECIDED, closed
    return None


def _required(held: HeldCall, customer_sum: HeldSum | None) -> int:
    # The customer's sum of this moment decides, not the sum at the hold.
    return held.reviewers_required if customer_sum is None else customer_sum.reviewers_required


def _covered(held: HeldCall, customer_sum: HeldSum | None) -> int | None:
    # An approver's limit covers the customer's sum, or the call's amount where there is none.
    return held.amount_cents if customer_sum is None else customer_sum.sum_cents


def _needs(
    held: HeldCall,
    votes: Sequence[CastVote],
    reader: Reviewer | None,
    reviewers: Sequence[Reviewer],
    required: int,
    covered: int | None,
    money: MoneyWords,
    *,
    yours: str,
) -> ApprovalNeeds:
    currency = held.currency
    voter_ids = {vote.reviewer.id for vote in votes}
    voters = tuple(
        Voter(vote.reviewer.username, vote.at, vote.reviewer.covers(covered, currency))
        for vote in votes
    )
    return ApprovalNeeds(
        required=required,
        voters=voters,
        missing=max(0, required - len(voter_ids)),
        needs_limit=not any(voter.covers for voter in voters),
        covering=tuple(
            r.username for r in reviewers if r.id not in voter_ids and r.covers(covered, currency)
        ),
        yours=yours,
        amount=money(covered or 0, currency),
        reader_covers=reader is None or reader.covers(covered, currency),
        limits_matter=any(not r.covers(covered, currency) for r in reviewers),
        # A reviewer without a limit in the currency has no cap in it: said so, by name.
        uncapped=tuple(
            r.username
            for r in reviewers
            if r.id not in voter_ids and currency and currency not in r.limits
        ),
        currency=currency,
        covered_cents=covered,
    )


def _twin_words(customer_sum: HeldSum, currency: str, money: MoneyWords) -> str:
    twin = next(iter(customer_sum.twins_approved), None) or next(iter(customer_sum.twins), None)
    if twin is None:
        return "money moved by another call"
    state = {
        "policy": "executed",
        "reviewer": "executed",
        "approved": "approved",
        "held": "held",
    }.get(twin.approval, twin.approval)
    return (
        f"{twin.tool} of {money(twin.amount_cents, currency)} for {twin.subject}, "
        f"{state} by another call at {twin.at:%Y-%m-%d %H:%M} UTC"
    )


def _second_look_words(
    held: HeldCall, policy: Policy, customer_sum: HeldSum | None, money: MoneyWords
) -> str:
    currency = held.currency
    line = policy.confirm_above(currency)
    assert held.amount_cents is not None and line is not None
    total = (
        ""
        if customer_sum is None
        else (
            f"; with the customer's other money in the window the sum is "
            f"{money(customer_sum.sum_cents, currency)}"
        )
    )
    return (
        f"Not approved yet: {money(held.amount_cents, currency)} is above "
        f"{money(line, currency)}, the amount above which an approval is confirmed once more"
        f"{total}. Look again and confirm to approve it."
    )


def _one_of(names: Sequence[str]) -> str:
    shown = list(names[:4])
    if len(names) > 4:
        shown.append(f"{len(names) - 4} more")
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " or " + shown[-1]
