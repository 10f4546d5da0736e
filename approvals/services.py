"""What humans do with held calls, and what the worker does once they approved.

Every transition of a confirmation happens here, in a transaction, with its row locked: two
reviewers clicking at once, a double submit, or an approval racing the expiry make one decision
and at most one execution. Each vote, decision and execution is written to the confirmation's
event log (approvals.models.ConfirmationEvent).
"""

from __future__ import annotations

from django.contrib.auth.models import User

from dispatch.models import Confirmation


class ConfirmationError(Exception):
    """A decision that cannot be made; `code` is stable, `message` is for the reviewer."""

    code = "confirmation_error"

    def __init__(self, message: str, confirmation: Confirmation | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation = confirmation


class AlreadyDecided(ConfirmationError):
    """It is no longer pending (decided by someone else, expired, or executing)."""

    code = "already_decided"


class AlreadyVoted(ConfirmationError):
    """This reviewer approved it already; another reviewer's approval is needed."""

    code = "already_voted"


class ReasonRequired(ConfirmationError):
    code = "reason_required"


class NotReconcilable(ConfirmationError):
    """Only an execution whose outcome is unknown is reconciled."""

    code = "not_reconcilable"


def confirmation_approve(*, confirmation_id: str, reviewer: User) -> Confirmation:
    """Record the reviewer's approval. Once enough different reviewers approved (the policy's
    reviewers_required) and one of them may approve the amount (ReviewerLimit), re-check the call
    under the agent's current policy and the live state: if it still passes, it becomes approved
    and its execution is enqueued after commit; if not, invalidated. Raises ConfirmationError."""
    raise NotImplementedError


def confirmation_reject(*, confirmation_id: str, reviewer: User, reason: str) -> Confirmation:
    """Reject with a reason (required), which reaches the model. Raises ConfirmationError."""
    raise NotImplementedError


def confirmation_expire(*, confirmation_id: str) -> Confirmation:
    """Mark a pending confirmation past its expiry as expired (no-op otherwise)."""
    raise NotImplementedError


def confirmations_expire_due() -> int:
    """Expire every pending confirmation past its expiry; how many (the beat schedule's task)."""
    raise NotImplementedError


def confirmation_execute(*, confirmation_id: str) -> Confirmation:
    """Execute an approved confirmation once (the worker's task): claim it, run the tool's handler
    with its execution key and bounded retries, and settle it executed, failed or unknown."""
    raise NotImplementedError


def confirmation_reconcile(*, confirmation_id: str, reviewer: User) -> Confirmation:
    """Ask the system of record by key what happened to an unknown execution, and settle it
    executed or failed accordingly. Raises ConfirmationError."""
    raise NotImplementedError
