"""What the agent commands share: default policy values, argument types, and how a policy reads."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from dispatch.models import Policy
from dispatch.money import AmountInvalid, major_units, minor_units
from dispatch.pipeline.policy import CurrencyLimits, HumanRule

# The defaults of `create_agent`, and the policy of the demo agent: thresholds in major units,
# the same figures in each of TOOLGATE_POLICY_CURRENCIES unless given per currency.
DEFAULT_LIMITS: dict[str, str | None] = {
    "max_amount": "500",
    "auto_approve_below": "50",
    "two_reviewers_from": "300",
    "daily_cap": None,
    "confirm_above": None,
    "factor_above": None,
}
DEFAULT_POLICY: dict[str, Any] = {
    "auto_approve_window_seconds": 24 * 3600,
    "step_budget": 50,
    "repeat_limit": 3,
    "confirmation_ttl_seconds": 24 * 3600,
}
# The per-currency flags, by the threshold they set; "none" switches off the nullable ones.
LIMIT_FLAGS = {
    "max_amount": ("max_amount_cents", False),
    "auto_approve_below": ("auto_approve_below_cents", False),
    "two_reviewers_from": ("two_reviewers_from_cents", True),
    "daily_cap": ("daily_cap_cents", True),
    "confirm_above": ("confirm_above_cents", True),
    "factor_above": ("factor_above_cents", True),
}


class PerCurrency(NamedTuple):
    currency: str
    amount: str | None


def per_currency(text: str) -> PerCurrency:
    """CUR:AMOUNT in major units (BRL:50, JPY:5000, KWD:1.250), or CUR:none."""
    currency, _, amount = text.partition(":")
    currency = currency.strip().upper()
    if not re.fullmatch(r"[A-Z]{3}", currency) or not amount:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a currency and an amount in its major units, such as BRL:50"
        )
    if amount.strip().lower() == "none":
        return PerCurrency(currency, None)
    try:
        minor_units(amount, currency)
    except (AmountInvalid, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return PerCurrency(currency, amount.strip())


def currency_limits(
    given: Mapping[str, Sequence[PerCurrency]], default_currencies: Sequence[str]
) -> dict[str, CurrencyLimits]:
    """The thresholds per currency from the per-currency flags (major units): the currencies
    they name, or the default ones if they name none; what a flag leaves out is its default."""
    named = sorted({item.currency for items in given.values() for item in items})
    currencies = named or [currency.upper() for currency in default_currencies]
    limits = {}
    for currency in currencies:
        values: dict[str, int | None] = {}
        for flag, (field, nullable) in LIMIT_FLAGS.items():
            chosen = {item.currency: item.amount for item in given.get(flag, ())}
            amount = chosen.get(currency, DEFAULT_LIMITS[flag])
            if amount is None and not nullable:
                raise ValueError(f"--{flag.replace('_', '-')} {currency}: none is not allowed")
            values[field] = None if amount is None else minor_units(amount, currency)
        if values["max_amount_cents"] == 0:
            raise ValueError(f"--max-amount {currency}: more than 0")
        limits[currency] = CurrencyLimits(**values)  # type: ignore[arg-type]
    return limits


def human_rule(text: str) -> tuple[str, HumanRule]:
    """TOOL:never, TOOL:always or TOOL:by_amount."""
    tool, _, rule = text.partition(":")
    try:
        return tool.strip(), HumanRule(rule.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a tool and never, always or by_amount, such as refund_order:always"
        ) from None


# The columns' limits: PositiveIntegerField and PositiveBigIntegerField on every backend.
_INT_MAX = 2**31 - 1


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


count = integer_in_range(1, _INT_MAX, "calls")
ttl_seconds = integer_in_range(60, _INT_MAX, "seconds")


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds} s ({seconds // 3600} h)"
    if seconds % 60 == 0:
        return f"{seconds} s ({seconds // 60} min)"
    return f"{seconds} s"


def describe_policy(policy: Policy) -> list[str]:
    rows = [("allowed tools", ", ".join(policy.allowed_tools) or "none")]
    limits = policy.limits()
    if limits is None:
        rows.append(
            (
                "thresholds",
                "one set for every currency (a version from before they were kept per currency)",
            )
        )
    else:
        for currency, each in limits.items():
            rows.append(
                (
                    f"{currency}",
                    f"max {_amount(each.max_amount_cents, currency)} a call; no human below "
                    f"{_amount(each.auto_approve_below_cents, currency)}; two reviewers from "
                    f"{_amount(each.two_reviewers_from_cents, currency, 'never')}; daily cap "
                    f"{_amount(each.daily_cap_cents, currency, 'none')}; approvals ask once more "
                    f"above {_amount(each.confirm_above_cents, currency, 'never')}; a second "
                    f"factor above {_amount(each.factor_above_cents, currency, 'never')}",
                )
            )
        rows.append(("other currencies", "held for a human"))
    for tool, rule in sorted((policy.human_rules or {}).items()):
        rows.append((f"human for {tool}", rule.replace("_", " ")))
    rows += [
        (
            "the customer's sum",
            f"what moved or is on its way within {_duration(policy.auto_approve_window_seconds)}",
        ),
        ("step budget", f"{policy.step_budget} calls per session"),
        ("repeat limit", f"{policy.repeat_limit} identical calls per session"),
        ("confirmation lifetime", _duration(policy.confirmation_ttl_seconds)),
    ]
    return [f"Policy v{policy.version} of {policy.agent.name}:"] + [
        f"  {label:<27}{value}" for label, value in rows
    ]


def _amount(cents: int | None, currency: str, none: str = "none") -> str:
    return none if cents is None else f"{major_units(cents, currency)} {currency}"
