"""The sum: what stage 7 judges for a call that moves money, and an approval judges again.

The risk is the money, not the call. Every money threshold is judged on the customer's sum in the
currency within the policy's rolling window, across agents and sessions: everything moved or on
its way (moved without a human, moved with a reviewer's approval, held for a reviewer, approved and
not yet executed), with this call included. A high-risk call that moves an amount runs without a
human only while:

- it does not repeat a call of the same tool, subject and amount (a refund of the same order)
  under another key, from any session or agent, that is held, approved, executing or executed
  within the policy's look-back (at least the window): that is a possible duplicate, held for a
  human and linked to its twin;
- the customer's sum stays below the auto-approve amount;
- what this agent moved without a human in that currency on this UTC day stays within its daily
  cap with this call included.

Otherwise it is held for a human, with the reason, and its money is reserved as held: it counts
in the sum while its confirmation can still execute. The same sum decides how many reviewers it
needs, at the hold and again at the approval (held_sum), where the call's own amount counts once.
A store reads the history, has it judged and reserves the money in one atomic step
(StatePort.reserve_allowance), so that calls racing each other cannot together pass a limit that
each passes alone. docs/approvals.md says the rule in a reviewer's words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from dispatch.pipeline.policy import Policy

# How money stands in the sum: moved without a human, moved with a reviewer's approval, held for a
# reviewer (counts until its confirmation's expiry), approved by a reviewer and not yet executed.
POLICY = "policy"
REVIEWER = "reviewer"
HELD = "held"
APPROVED = "approved"
MOVED = frozenset({POLICY, REVIEWER})
ON_ITS_WAY = frozenset({HELD, APPROVED})


def execution_key(confirmation_id: str) -> str:
    """The key a held call's execution passes to the system of record, one per confirmation; its
    money is reserved under the same key from the hold on, so that it is one row of money."""
    return hashlib.sha256(f"confirmation:{confirmation_id}".encode()).hexdigest()


class Movement(NamedTuple):
    """Money that a call moved, or reserved to move, as a store keeps it."""

    key: str
    agent_id: str
    session_id: str
    tool: str
    subject: str
    amount_cents: int
    at: datetime
    # One of POLICY, REVIEWER, HELD, APPROVED.
    approval: str
    # The held call it is the money of, if a human was asked.
    confirmation_id: str = ""


class AllowanceRequest(NamedTuple):
    """A call that would move money, as the store needs it to judge and reserve."""

    key: str
    agent_id: str
    session_id: str
    customer_id: str
    tool: str
    # What the money is for (a refund's order), as the tool declares it.
    subject: str
    currency: str
    amount_cents: int
    at: datetime
    # The start of the policy's rolling window.
    since: datetime
    # Whether the agent's money of the day matters (the policy has a daily cap).
    agent_day_needed: bool = True
    # Where the call is held: its confirmation, and until when it may be approved. Its money is
    # then reserved as held under the confirmation's execution key.
    confirmation_id: str = ""
    held_until: datetime | None = None
    # Where the search for its possible duplicates starts (the policy's look-back); None: the
    # window's start.
    twins_from: datetime | None = None

    @property
    def held_key(self) -> str:
        return execution_key(self.confirmation_id) if self.confirmation_id else ""

    @property
    def twins_since(self) -> datetime:
        """The earliest a possible duplicate's money may have moved: never after the window's
        start."""
        return self.since if self.twins_from is None else min(self.since, self.twins_from)


class AllowanceHistory(NamedTuple):
    # The customer's sum in the currency within the window, by any agent, this call left out:
    # how much, in how many movements, and the latest of them (a store may give only the last
    # few). Held money counts while its confirmation can still execute.
    customer_window_cents: int
    customer_window_count: int
    customer_window: tuple[Movement, ...]
    # Moved without a human by this agent in the currency on the call's UTC day (0 when the
    # policy has no daily cap: nothing asks).
    agent_day_cents: int
    # Movements of the same tool, customer, subject and amount under another key, moved since
    # the request's look-back (twins_since) or on their way, in any state.
    repeats: tuple[Movement, ...]
    # Of the customer's sum: what is on its way (held or approved), and what a reviewer moved.
    customer_held_cents: int = 0
    customer_reviewed_cents: int = 0


class HoldReason(NamedTuple):
    """Why a call is held for a human: a stable kind, words for the model and the reviewer."""

    kind: str
    message: str
    data: Mapping[str, Any]


AMOUNT = "amount"
WINDOW_SUM = "window_sum"
AGENT_DAILY_CAP = "agent_daily_cap"
POSSIBLE_DUPLICATE = "possible_duplicate"
NO_THRESHOLDS = "no_thresholds"
# The policy has a human decide every call of the tool (HumanRule.ALWAYS).
ALWAYS = "always"
HIGH_RISK = "high_risk"


def twins_of(request: AllowanceRequest, history: AllowanceHistory) -> tuple[Movement, ...]:
    """The movements the call may repeat: same tool, subject and amount under another key,
    whatever the session, the agent or the other arguments (a refund's reason). An identical
    call under its own key is replayed by it instead; once that key is pruned, the money it moved
    is under another key than the new call's, and is found here. So is a reviewer's edit, in the
    model's own session: the model cannot get the edited amount moved again by sending it."""
    return history.repeats


def allowance_judge(
    policy: Policy, request: AllowanceRequest, history: AllowanceHistory
) -> HoldReason | None:
    """None if the call may move its money without a human; otherwise why it is held. Judged by
    the thresholds of the call's currency; a currency without any is held (fail closed)."""
    amount, currency = request.amount_cents, request.currency
    twins = twins_of(request, history)
    if twins:
        return _duplicate(request, twins)
    limits = policy.limits(currency)
    if limits is None:
        return HoldReason(
            NO_THRESHOLDS,
            f"this agent's policy sets no thresholds for {currency}: a human decides every "
            f"call in {currency}",
            {"currency": currency},
        )
    threshold = limits.auto_approve_below_cents
    earlier = history.customer_window_cents
    if amount >= threshold:
        return HoldReason(
            AMOUNT,
            f"{amount} {currency} is not below the {threshold} that may be moved without a human",
            {"amount_cents": amount, "auto_approve_below_cents": threshold},
        )
    if earlier + amount >= threshold:
        return HoldReason(
            WINDOW_SUM,
            f"{_earlier_words(history, currency)} for this customer in the last "
            f"{_duration(policy.auto_approve_window_seconds)} "
            f"({_movements(history)}); with this {amount} the sum, "
            f"{earlier + amount}, is not below {threshold}",
            {
                "earlier": [_as_data(movement) for movement in history.customer_window[-SHOWN:]],
                "earlier_count": history.customer_window_count,
                "earlier_cents": earlier,
                "held_cents": history.customer_held_cents,
                "reviewed_cents": history.customer_reviewed_cents,
                "sum_cents": earlier + amount,
                "auto_approve_below_cents": threshold,
            },
        )
    cap = limits.daily_cap_cents
    if cap is not None and history.agent_day_cents + amount > cap:
        return HoldReason(
            AGENT_DAILY_CAP,
            f"this agent already moved {history.agent_day_cents} {currency} without a human "
            f"today (UTC); with this {amount} it would pass its daily cap of {cap}",
            {"agent_day_cents": history.agent_day_cents, "daily_cap_cents": cap},
        )
    return None


# Why a call moves its money without a human, and how many reviewers a held call's sum needs: the
# other side of the same rules, in the same terms (the what-if says why a call goes another way).
BELOW_AUTO_APPROVE = "below_auto_approve"
NEVER = "never"
TWO_REVIEWERS = "two_reviewers"
ONE_REVIEWER = "one_reviewer"


def allowance_pass(
    policy: Policy, request: AllowanceRequest, history: AllowanceHistory
) -> HoldReason:
    """Why allowance_judge lets a call move its money without a human: the customer's sum with it
    is below the auto-approve amount, and the agent's day within its cap."""
    amount, currency = request.amount_cents, request.currency
    limits = policy.limits(currency)
    threshold = limits.auto_approve_below_cents if limits is not None else 0
    cap = limits.daily_cap_cents if limits is not None else None
    earlier = history.customer_window_cents
    message = (
        f"with this {amount} the customer's sum in the last "
        f"{_duration(policy.auto_approve_window_seconds)}, {earlier + amount} {currency}, is "
        f"below the {threshold} that may be moved without a human"
    )
    if cap is not None:
        message += (
            f", and this agent's {history.agent_day_cents + amount} {currency} without a human "
            f"today (UTC) is within its daily cap of {cap}"
        )
    return HoldReason(
        BELOW_AUTO_APPROVE,
        message,
        {
            "amount_cents": amount,
            "earlier_cents": earlier,
            "sum_cents": earlier + amount,
            "auto_approve_below_cents": threshold,
            "agent_day_cents": history.agent_day_cents + amount,
            "daily_cap_cents": cap,
        },
    )


def never_reason(tool: str) -> HoldReason:
    """Why a call of a tool no human decides moves its money without one."""
    return HoldReason(NEVER, f"this agent's policy has no human decide a {tool}", {})


def reviewers_reason(policy: Policy, sum_cents: int, currency: str) -> HoldReason:
    """Why a held call needs one reviewer or two: the customer's sum with it (this call's amount
    included) against the currency's two-reviewer line (Policy.reviewers_required)."""
    limits = policy.limits(currency)
    line = None if limits is None else limits.two_reviewers_from_cents
    data = {"sum_cents": sum_cents, "two_reviewers_from_cents": line}
    if line is None:
        return HoldReason(
            ONE_REVIEWER,
            f"the policy names no sum in {currency} from which two reviewers must approve: one "
            "is enough",
            data,
        )
    if policy.reviewers_required(sum_cents, currency) == 2:
        return HoldReason(
            TWO_REVIEWERS,
            f"the customer's sum with this call, {sum_cents} {currency}, is not below the {line} "
            "from which two reviewers must approve",
            data,
        )
    return HoldReason(
        ONE_REVIEWER,
        f"the customer's sum with this call, {sum_cents} {currency}, is below the {line} from "
        "which two reviewers must approve: one is enough",
        data,
    )


def always_judge(tool: str, request: AllowanceRequest, history: AllowanceHistory) -> HoldReason:
    """Why a call of a tool that a human always decides is held: a possible duplicate first."""
    twins = twins_of(request, history)
    if twins:
        return _duplicate(request, twins)
    return HoldReason(ALWAYS, f"this agent's policy has a human decide every {tool}", {})


def _duplicate(request: AllowanceRequest, twins: tuple[Movement, ...]) -> HoldReason:
    first = twins[0]
    return HoldReason(
        POSSIBLE_DUPLICATE,
        f"it may repeat an earlier {first.tool} of {first.amount_cents} {request.currency} for "
        f"{first.subject} ({_state_words(first)} at "
        f"{first.at.isoformat(timespec='seconds')}, under another key): a possible "
        "duplicate, which a reviewer must approve as a separate one",
        {"earlier": [_as_data(movement) for movement in twins[:SHOWN]]},
    )


def moneyless_hold(tool: str, *, always: bool) -> HoldReason:
    """Why a call that moves no money is held: its policy says a human decides every one, or
    it is a high-risk write (a human decides what is not measured in money)."""
    if always:
        return HoldReason(ALWAYS, f"this agent's policy has a human decide every {tool}", {})
    return HoldReason(HIGH_RISK, "a high-risk call that moves no declared amount", {})


def never_judge(history: AllowanceHistory) -> None:
    """A tool no human decides: its money moves without one, and counts in the sum."""
    return None


class HeldSum(NamedTuple):
    """A held call's money beside the customer's other money in the window, as an approval
    judges it again: the call's own amount counts once."""

    amount_cents: int
    # The customer's other money in the window, and of it what is on its way.
    earlier_cents: int
    held_cents: int
    reviewers_required: int
    # Its twins (same tool, subject and amount under another key) in any state.
    twins: tuple[Movement, ...]

    @property
    def sum_cents(self) -> int:
        return self.earlier_cents + self.amount_cents

    @property
    def twins_approved(self) -> tuple[Movement, ...]:
        """The twins that are approved, executing or executed: approving this one may pay
        twice."""
        return tuple(twin for twin in self.twins if twin.approval != HELD)


def held_sum(policy: Policy, request: AllowanceRequest, history: AllowanceHistory) -> HeldSum:
    """The sum a held call makes with the customer's other money now (history leaves out the
    call's own reservation), and the number of reviewers that sum needs."""
    return HeldSum(
        amount_cents=request.amount_cents,
        earlier_cents=history.customer_window_cents,
        held_cents=history.customer_held_cents,
        reviewers_required=policy.reviewers_required(
            history.customer_window_cents + request.amount_cents, request.currency
        ),
        twins=twins_of(request, history),
    )


def _state_words(movement: Movement) -> str:
    return {
        POLICY: "executed",
        REVIEWER: "executed after a review",
        HELD: "held for a reviewer",
        APPROVED: "approved",
    }.get(movement.approval, movement.approval)


def _earlier_words(history: AllowanceHistory, currency: str) -> str:
    held, reviewed = history.customer_held_cents, history.customer_reviewed_cents
    automatic = history.customer_window_cents - held - reviewed
    if not held and not reviewed:
        return f"{automatic} {currency} was already moved without a human"
    parts = [
        f"{cents} {currency} {words}"
        for cents, words in (
            (automatic, "moved without a human"),
            (reviewed, "moved with a reviewer's approval"),
            (held, "held for a reviewer or approved"),
        )
        if cents
    ]
    return f"{history.customer_window_cents} {currency} is already moved or on its way (" + (
        ", ".join(parts) + ")"
    )


def _as_data(movement: Movement) -> dict[str, Any]:
    # What the model and the reviewer are told of another call: never its agent's or session's
    # ids, which are not the model's to see.
    return {
        "tool": movement.tool,
        "subject": movement.subject,
        "amount_cents": movement.amount_cents,
        "at": movement.at.isoformat(),
        "approval": movement.approval,
    }


def _movements(history: AllowanceHistory) -> str:
    latest = history.customer_window[-SHOWN:]
    shown = ", ".join(f"{m.amount_cents} for {m.subject}" for m in latest)
    more = history.customer_window_count - len(latest)
    return f"{history.customer_window_count} earlier: {shown}" + (
        f" and {more} before them" if more > 0 else ""
    )


# How many of the earlier movements a hold names.
SHOWN = 5


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour{'s' if hours != 1 else ''}"
    minutes = seconds // 60
    return f"{minutes} minute{'s' if minutes != 1 else ''}"
