"""What the agent commands share: default policy values, argument types, and how a policy reads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dispatch.models import Policy

# The defaults of `create_agent`, and the policy of the demo agent.
DEFAULT_POLICY: dict[str, Any] = {
    "max_amount_cents": 50_000,
    "auto_approve_below_cents": 5_000,
    "auto_approve_window_seconds": 24 * 3600,
    "daily_cap_cents": None,
    "two_reviewers_from_cents": 30_000,
    "step_budget": 50,
    "repeat_limit": 3,
    "confirmation_ttl_seconds": 24 * 3600,
}

# The columns' limits: PositiveIntegerField and PositiveBigIntegerField on every backend.
_INT_MAX = 2**31 - 1
_BIGINT_MAX = 2**63 - 1


def integer_in_range(minimum: int, maximum: int, unit: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {unit}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: give {minimum} to {maximum} {unit}"
            )
        return value

    return parse


cents = integer_in_range(0, _BIGINT_MAX, "cents")
positive_cents = integer_in_range(1, _BIGINT_MAX, "cents")
count = integer_in_range(1, _INT_MAX, "calls")
ttl_seconds = integer_in_range(60, _INT_MAX, "seconds")


def cents_or_none(text: str) -> int | None:
    """`none` switches the rule off."""
    if text.strip().lower() == "none":
        return None
    return cents(text)


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds} s ({seconds // 3600} h)"
    if seconds % 60 == 0:
        return f"{seconds} s ({seconds // 60} min)"
    return f"{seconds} s"


def describe_policy(policy: Policy) -> list[str]:
    two_reviewers = (
        "never (one reviewer is enough)"
        if policy.two_reviewers_from_cents is None
        else f"{policy.two_reviewers_from_cents} cents"
    )
    rows = [
        ("allowed tools", ", ".join(policy.allowed_tools) or "none"),
        ("max amount per call", f"{policy.max_amount_cents} cents"),
        (
            "no human needed below",
            f"{policy.auto_approve_below_cents} cents per customer and currency "
            f"within {_duration(policy.auto_approve_window_seconds)}",
        ),
        (
            "daily cap without a human",
            "none"
            if policy.daily_cap_cents is None
            else f"{policy.daily_cap_cents} cents per currency and UTC day",
        ),
        ("two reviewers from", two_reviewers),
        ("step budget", f"{policy.step_budget} calls per session"),
        ("repeat limit", f"{policy.repeat_limit} identical calls per session"),
        ("confirmation lifetime", _duration(policy.confirmation_ttl_seconds)),
    ]
    return [f"Policy v{policy.version} of {policy.agent.name}:"] + [
        f"  {label:<27}{value}" for label, value in rows
    ]
