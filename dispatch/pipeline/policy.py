"""What an agent may do, as one immutable version (docs/policies.md).

Per tool, whether a human decides its calls never, always, or by amount; per currency, the money
thresholds in that currency's minor units (a threshold of 5000 is 50.00 BRL, 50.00 USD, ¥5000 or
5.000 KWD: never one number for every currency). A currency with no thresholds is held for a
human: the policy fails closed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import NamedTuple


class HumanRule(enum.StrEnum):
    """Whether a human decides a tool's calls."""

    NEVER = "never"
    ALWAYS = "always"
    # When the money calls for it (stage 7, dispatch/pipeline/allowance.py); a write that moves
    # no money is then held.
    BY_AMOUNT = "by_amount"


class CurrencyLimits(NamedTuple):
    """One currency's money thresholds, in its minor units."""

    max_amount_cents: int
    # Below this sum a call runs without a human; 0 holds every one.
    auto_approve_below_cents: int = 0
    # From this sum two different reviewers must approve; None: one is always enough.
    two_reviewers_from_cents: int | None = None
    # What the agent may move without a human per UTC day; None: no cap of its own.
    daily_cap_cents: int | None = None
    # Above this amount a reviewer's approval asks once more, showing the amount and the
    # customer's sum, before it is made; None: one click approves any amount.
    confirm_above_cents: int | None = None
    # Above this amount an approval needs the reviewer's fresh second factor (TOTP); None: never.
    factor_above_cents: int | None = None


_NO_RULES: Mapping[str, HumanRule] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    allowed_tools: frozenset[str]
    # The thresholds of a policy version made before they were kept per currency: the same
    # numbers in every currency, as that version judged. Used only where `currencies` is None.
    max_amount_cents: int = 0
    auto_approve_below_cents: int = 0
    auto_approve_window_seconds: int = 24 * 3600
    daily_cap_cents: int | None = None
    two_reviewers_from_cents: int | None = None
    step_budget: int = 50
    # How often the same call may be sent in one session before it counts as a loop.
    repeat_limit: int = 3
    confirmation_ttl_seconds: int = 24 * 3600
    # How far back a call's possible duplicates are sought (same tool, subject and amount under
    # another key); never less than the window. None: the window alone.
    duplicate_lookback_seconds: int | None = None
    # The thresholds per currency; a currency not here is held for a human.
    currencies: Mapping[str, CurrencyLimits] | None = None
    # Per tool; a tool not here: by amount if it is high risk, else never.
    humans: Mapping[str, HumanRule] = field(default_factory=lambda: _NO_RULES)

    def limits(self, currency: str) -> CurrencyLimits | None:
        """The thresholds in that currency, or None if the policy sets none (fail closed)."""
        if self.currencies is None:
            return CurrencyLimits(
                self.max_amount_cents,
                self.auto_approve_below_cents,
                self.two_reviewers_from_cents,
                self.daily_cap_cents,
            )
        return self.currencies.get(currency)

    def twins_since(self, now: datetime) -> datetime:
        """Where the search for a call's possible duplicates starts, for a call at `now`."""
        back = max(self.auto_approve_window_seconds, self.duplicate_lookback_seconds or 0)
        return now - timedelta(seconds=back)

    def confirm_above(self, currency: str) -> int | None:
        """The amount in that currency above which an approval asks once more, if any."""
        limits = self.limits(currency)
        return None if limits is None else limits.confirm_above_cents

    def needs_second_look(self, amount_cents: int | None, currency: str) -> bool:
        """Whether approving a held call of that amount asks the reviewer once more."""
        line = self.confirm_above(currency)
        return line is not None and amount_cents is not None and amount_cents > line

    def needs_factor(self, amount_cents: int | None, currency: str) -> bool:
        """Whether approving a held call of that amount needs the reviewer's fresh second
        factor."""
        limits = self.limits(currency)
        line = None if limits is None else limits.factor_above_cents
        return line is not None and amount_cents is not None and amount_cents > line

    def human_rule(self, tool: str, *, high_risk: bool) -> HumanRule:
        rule = self.humans.get(tool)
        if rule is not None:
            return rule
        return HumanRule.BY_AMOUNT if high_risk else HumanRule.NEVER

    def reviewers_required(self, amount_cents: int | None, currency: str = "") -> int:
        """How many different reviewers a sum in that currency needs: two from the currency's
        two-reviewer line, else one (also where the currency has no thresholds)."""
        limits = self.limits(currency)
        line = None if limits is None else limits.two_reviewers_from_cents
        if line is not None and amount_cents is not None and amount_cents >= line:
            return 2
        return 1
