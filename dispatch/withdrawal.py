"""The agent host's withdrawal of its held call, as the agent's doors (the API, MCP) ask for it.

The move is a decision, made where every decision is (approvals.deciding.confirmation_withdraw,
under the same locks as an approval); approvals registers it here when it starts, because
dispatch, below approvals, never imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from dispatch.models import Agent, Confirmation

# A refusal's code when there is no such confirmation for this agent (and customer).
NOT_FOUND = "not_found"


class DecisionRefused(Exception):
    """A decision that cannot be made; `code` is stable, `message` says why in words."""

    code = "confirmation_error"

    def __init__(self, message: str, confirmation: Confirmation | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation = confirmation


Withdraw = Callable[..., Confirmation]
_registered: list[Withdraw] = []


def withdrawal_register(withdraw: Withdraw) -> None:
    """Make `withdraw(confirmation_id=, agent=, customer_id=)` the one that withdraws."""
    _registered[:] = [withdraw]


def held_call_withdraw(
    *, confirmation_id: str, agent: Agent, customer_id: str | None = None
) -> Confirmation:
    """Withdraw the agent's held call (for that customer, where given). Raises DecisionRefused:
    NOT_FOUND for any id that is not the agent's (and the customer's), already_approved once a
    reviewer approved it, already_decided once it was decided otherwise or expired."""
    if not _registered:  # pragma: no cover - approvals is an installed app
        raise RuntimeError("no withdrawal is registered: approvals is not installed")
    return _registered[0](confirmation_id=confirmation_id, agent=agent, customer_id=customer_id)
