"""A what-if's draft as a manager writes it: each currency's thresholds in its major units
(BRL_auto_approve_below=100 is 100.00 BRL, JPY_max_amount=30000 is ¥30,000), and the window in
seconds. The page's form and the API read it here, into dispatch.pipeline.what_if.draft_of's
terms: minor units per currency."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from dispatch.money import AmountInvalid, major_units, minor_units
from dispatch.pipeline.policy import CurrencyLimits, Policy
from dispatch.pipeline.what_if import DRAFT_FIELDS, LIMIT_FIELDS
from dispatch.registry import tool_registry

WINDOW = "auto_approve_window_seconds"
# The thresholds of a currency as a draft names them (without _cents: they are in major units).
THRESHOLDS = tuple(name.removesuffix("_cents") for name in LIMIT_FIELDS)
NULLABLE = frozenset(
    name.removesuffix("_cents") for name, (_, _, nullable) in LIMIT_FIELDS.items() if nullable
)


class Draft(NamedTuple):
    window: int | None
    # {currency: {threshold_cents: minor units or None}}
    currencies: dict[str, dict[str, int | None]]
    # {parameter: why it was not taken}
    problems: dict[str, str]


def draft_currencies(policy: Policy) -> list[str]:
    """The currencies a draft shows: those the tools move money in, and any other the policy
    has thresholds for (a currency without any may be given some in the draft)."""
    return sorted(set(tool_registry.currencies) | set(policy.currencies or {}))


def parameter(currency: str, threshold: str) -> str:
    return f"{currency}_{threshold}"


def draft_read(values: Mapping[str, str], currencies: Iterable[str], policy: Policy) -> Draft:
    """The draft a query's values give; a value that is not one of its currency is a problem,
    named, and left out (the policy's value holds). An empty value of a currency the policy
    sets no thresholds for says nothing (the page sends every field)."""
    problems: dict[str, str] = {}
    window = None
    text = values.get(WINDOW)
    if text not in (None, ""):
        low, high, _ = DRAFT_FIELDS[WINDOW]
        if text.isdigit() and low <= int(text) <= high:
            window = int(text)
        else:
            problems[WINDOW] = f"must be a whole number of seconds from {low} to {high}"
    changes: dict[str, dict[str, int | None]] = {}
    for currency in currencies:
        for threshold in THRESHOLDS:
            name = parameter(currency, threshold)
            text = values.get(name)
            if text is None:
                continue
            text = text.strip()
            if not text and policy.limits(currency) is None:
                continue
            if not text:
                if threshold in NULLABLE:
                    changes.setdefault(currency, {})[f"{threshold}_cents"] = None
                else:
                    problems[name] = f"give an amount in {currency}"
                continue
            try:
                amount = minor_units(text, currency)
            except AmountInvalid as error:
                problems[name] = str(error)
                continue
            low, high, _ = LIMIT_FIELDS[f"{threshold}_cents"]
            if not low <= amount <= high:
                problems[name] = (
                    f"must be more than 0 {currency}"
                    if amount < low
                    else f"must be at most {major_units(high, currency)} {currency}"
                )
                continue
            changes.setdefault(currency, {})[f"{threshold}_cents"] = amount
    for currency, values_of in list(changes.items()):
        if policy.limits(currency) is None and values_of.get("max_amount_cents") is None:
            problems[parameter(currency, "max_amount")] = (
                f"give {currency} a maximum amount first: the policy sets no thresholds for it"
            )
            del changes[currency]
    return Draft(window, changes, problems)


def unknown_parameters(
    names: Iterable[str], policy: Policy, known: Iterable[str]
) -> dict[str, str]:
    """The parameters of a query that a draft cannot read, each with why: a threshold it does not
    have, or a currency the tools move no money in and the policy sets nothing for. (`known`: the
    query's other parameters.)"""
    currencies = draft_currencies(policy)
    allowed = {*known, WINDOW}
    problems = {}
    for name in names:
        if name in allowed:
            continue
        currency, _, threshold = name.partition("_")
        if threshold not in THRESHOLDS:
            problems[name] = (
                "is not a parameter of the what-if: give "
                + ", ".join(sorted(allowed))
                + ", or a currency's threshold such as BRL_auto_approve_below (the thresholds: "
                + ", ".join(THRESHOLDS)
                + ")"
            )
        elif currency not in currencies:
            problems[name] = (
                f"{currency} is not a currency of this agent's tools or policy: "
                + ", ".join(currencies)
            )
    return problems


def limits_in_major_units(limits: CurrencyLimits | None, currency: str) -> dict[str, str]:
    """A currency's thresholds as a draft writes them (empty: no such limit)."""
    if limits is None:
        return {threshold: "" for threshold in THRESHOLDS}
    shown = {}
    for threshold in THRESHOLDS:
        cents = getattr(limits, f"{threshold}_cents")
        shown[threshold] = "" if cents is None else major_units(cents, currency)
    return shown
