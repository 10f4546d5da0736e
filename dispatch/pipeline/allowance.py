"""Money a policy lets through without a human: what stage 7 judges for a call that moves money.

The risk is the money, not the call. A high-risk call that moves an amount runs without a human
only while:

- what was auto-approved for the same customer in the same currency within the policy's window,
  by any agent, stays below the auto-approve amount with this call included;
- what this agent moved without a human in that currency on this UTC day stays within its daily
  cap with this call included;
- it does not repeat money moved by an executed call (same tool, subject and amount, such as a
  refund of the same order) from another session or another agent within the window.

Otherwise it is held for a human, with the reason. A store reads the history, has it judged and
records the reservation in one atomic step (StatePort.reserve_allowance), so that calls racing
each other cannot together pass a limit that each passes alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from dispatch.pipeline.policy import Policy


class Movement(NamedTuple):
    """Money that a call moved, or reserved to move, as a store keeps it."""

    key: str
    agent_id: str
    session_id: str
    tool: str
    subject: str
    amount_cents: int
    at: datetime
    # "policy" when no human approved it, "reviewer" when one did.
    approval: str


class AllowanceRequest(NamedTuple):
    """A call that would move money without a human, as the store needs it to judge and reserve."""

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


class AllowanceHistory(NamedTuple):
    # Auto-approved for the customer and currency within the window, by any agent: how much, in
    # how many movements, and the latest of them (a store may give only the last few).
    customer_window_cents: int
    customer_window_count: int
    customer_window: tuple[Movement, ...]
    # Moved without a human by this agent in the currency on the call's UTC day (0 when the
    # policy has no daily cap: nothing asks).
    agent_day_cents: int
    # Executed movements of the same tool, customer, subject and amount within the window.
    repeats: tuple[Movement, ...]


class HoldReason(NamedTuple):
    """Why a call is held for a human: a stable kind, words for the model and the reviewer."""

    kind: str
    message: str
    data: Mapping[str, Any]


AMOUNT = "amount"
WINDOW_SUM = "window_sum"
AGENT_DAILY_CAP = "agent_daily_cap"
POSSIBLE_DUPLICATE = "possible_duplicate"


def allowance_judge(
    policy: Policy, request: AllowanceRequest, history: AllowanceHistory
) -> HoldReason | None:
    """None if the call may move its money without a human; otherwise why it is held."""
    amount, currency = request.amount_cents, request.currency
    threshold = policy.auto_approve_below_cents
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
            f"{earlier} {currency} was already moved without a human for this customer in the "
            f"last {_duration(policy.auto_approve_window_seconds)} "
            f"({_movements(history)}); with this {amount} the sum, "
            f"{earlier + amount}, is not below {threshold}",
            {
                "earlier": [_as_data(movement) for movement in history.customer_window[-SHOWN:]],
                "earlier_count": history.customer_window_count,
                "earlier_cents": earlier,
                "sum_cents": earlier + amount,
                "auto_approve_below_cents": threshold,
            },
        )
    cap = policy.daily_cap_cents
    if cap is not None and history.agent_day_cents + amount > cap:
        return HoldReason(
            AGENT_DAILY_CAP,
            f"this agent already moved {history.agent_day_cents} {currency} without a human "
            f"today (UTC); with this {amount} it would pass its daily cap of {cap}",
            {"agent_day_cents": history.agent_day_cents, "daily_cap_cents": cap},
        )
    repeats = [
        movement
        for movement in history.repeats
        if movement.session_id != request.session_id or movement.agent_id != request.agent_id
    ]
    if repeats:
        first = repeats[0]
        return HoldReason(
            POSSIBLE_DUPLICATE,
            f"it repeats {first.tool} of {first.amount_cents} {currency} for {first.subject}, "
            f"executed at {first.at.isoformat(timespec='seconds')} in another conversation: "
            "a possible duplicate",
            {"earlier": [_as_data(movement) for movement in repeats]},
        )
    return None


def _as_data(movement: Movement) -> dict[str, Any]:
    return {
        "tool": movement.tool,
        "subject": movement.subject,
        "amount_cents": movement.amount_cents,
        "at": movement.at.isoformat(),
        "approval": movement.approval,
        "agent_id": movement.agent_id,
        "session_id": movement.session_id,
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
