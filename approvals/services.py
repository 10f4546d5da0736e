"""What humans do with held calls, and what the worker does once they approved.

Every transition of a confirmation happens here, in a transaction, with its row locked: two
reviewers clicking at once, a double submit, or an approval racing the expiry make one decision and
at most one execution. The moves are those of dispatch.models.CONFIRMATION_LIFECYCLE, which
PostgreSQL enforces too (dispatch/store/guards.py). Each vote, decision and execution is written to
the confirmation's event log (approvals.models.ConfirmationEvent), which is also where the analytics
count the decisions from. The decision also settles the held call's idempotency record, so that the
agent's identical call gets the confirmation's state, its result or its rejection, and never a
second confirmation for a call that was approved.

This module is their one door for the rest of the project; they live by concern in

- approvals.deciding: approve, edit then approve, and reject, enforcing
  dispatch.pipeline.decision's Decision, and the host's withdrawal;
- approvals.executing: every move's after-steps (confirmation_move), the execution with its
  lease, its settling, the reconciliation, the expiry and the resending sweeps;
- approvals.events: the locked row and the chained event log; approvals.errors: the refusals'
  stable codes.

The Celery tasks (approvals.tasks) import these; these send the tasks by name, never import them.
"""

from approvals.deciding import (
    MAX_REASON_CHARS,
    confirmation_approve,
    confirmation_edit_approve,
    confirmation_reject,
    confirmation_withdraw,
)
from approvals.errors import (
    AlreadyApproved,
    AlreadyDecided,
    AlreadyVoted,
    ConfirmationError,
    ConfirmationNotFound,
    EditRefused,
    FactorRequired,
    NeedsCard,
    NotReconcilable,
    PossibleDuplicate,
    ReasonRequired,
    RecheckUnavailable,
    SecondLookRequired,
)
from approvals.events import EXPIRY, HOST, WORKER
from approvals.executing import (
    RESEND_BATCH,
    confirmation_execute,
    confirmation_expire,
    confirmation_reconcile,
    confirmations_expire_due,
    execution_send,
    executions_resend_due,
)

__all__ = [
    "EXPIRY",
    "HOST",
    "MAX_REASON_CHARS",
    "RESEND_BATCH",
    "WORKER",
    "AlreadyApproved",
    "AlreadyDecided",
    "AlreadyVoted",
    "ConfirmationError",
    "ConfirmationNotFound",
    "EditRefused",
    "FactorRequired",
    "NeedsCard",
    "NotReconcilable",
    "PossibleDuplicate",
    "ReasonRequired",
    "RecheckUnavailable",
    "SecondLookRequired",
    "confirmation_approve",
    "confirmation_edit_approve",
    "confirmation_execute",
    "confirmation_expire",
    "confirmation_reconcile",
    "confirmation_reject",
    "confirmation_withdraw",
    "confirmations_expire_due",
    "execution_send",
    "executions_resend_due",
]
