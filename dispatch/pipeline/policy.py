"""What an agent may do, as one immutable version."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    allowed_tools: frozenset[str]
    # Amounts are in minor units of the order's currency; a tool declares which argument they bind.
    max_amount_cents: int
    # Below this amount a high-risk call runs without a human; 0 holds every one. What was
    # auto-approved for the same customer and currency within the window counts with the call
    # (dispatch/pipeline/allowance.py).
    auto_approve_below_cents: int = 0
    auto_approve_window_seconds: int = 24 * 3600
    # What the agent may move without a human per currency and UTC day; None: no cap of its own.
    daily_cap_cents: int | None = None
    # From this amount two different reviewers must approve; None means one is always enough.
    two_reviewers_from_cents: int | None = None
    step_budget: int = 50
    # How often the same call may be sent in one session before it counts as a loop.
    repeat_limit: int = 3
    confirmation_ttl_seconds: int = 24 * 3600

    def reviewers_required(self, amount_cents: int | None) -> int:
        if (
            self.two_reviewers_from_cents is not None
            and amount_cents is not None
            and amount_cents >= self.two_reviewers_from_cents
        ):
            return 2
        return 1
