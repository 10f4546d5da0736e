"""Why a reviewer's action on a held call cannot be made: a stable code and words for them."""

from __future__ import annotations

from dispatch.pipeline import decision
from dispatch.withdrawal import NOT_FOUND, DecisionRefused


class ConfirmationError(DecisionRefused):
    """A decision that cannot be made; `code` is stable, `message` is for the reviewer (or, for
    a withdrawal, the agent's host)."""


class ConfirmationNotFound(ConfirmationError):
    code = NOT_FOUND


class AlreadyDecided(ConfirmationError):
    """It is no longer pending (decided by someone else, expired, or executing)."""

    code = decision.ALREADY_DECIDED


class AlreadyVoted(ConfirmationError):
    """This reviewer approved it already; another reviewer's approval is needed."""

    code = decision.ALREADY_VOTED


class AlreadyApproved(ConfirmationError):
    """A reviewer approved it (or voted to): the host can no longer withdraw it."""

    code = decision.ALREADY_APPROVED


class ReasonRequired(ConfirmationError):
    code = "reason_required"


class PossibleDuplicate(ConfirmationError):
    """It may repeat money held, approved or moved in another conversation: approving it takes
    the reviewer's explicit word that it is a separate one."""

    code = decision.POSSIBLE_DUPLICATE


class SecondLookRequired(ConfirmationError):
    """Its amount is above the one its policy names for a second look (confirm_above): approving
    it takes the reviewer's confirmation, given once more after seeing the amount and the
    customer's sum."""

    code = decision.SECOND_LOOK_REQUIRED


class RecheckUnavailable(ConfirmationError):
    """The re-check could not read the live state now (a system of record away): nothing is
    decided, the held call stays pending, and the same approval may pass shortly."""

    code = "recheck_unavailable"


class NeedsCard(ConfirmationError):
    """The approval would only count as one vote of several: a channel that decides with one
    click (a Slack button) records nothing and sends the reviewer to the card."""

    code = "needs_card"


class EditRefused(ConfirmationError):
    """An edit the tool's rules do not allow (a larger amount, another order), or whose call does
    not pass the pipeline's judgement again; nothing is changed."""

    code = "edit_refused"


class FactorRequired(ConfirmationError):
    """Its amount is above its policy's second-factor line (factor_above): approving it takes the
    reviewer's fresh second factor (docs/identity.md)."""

    code = decision.FACTOR_REQUIRED


class NotReconcilable(ConfirmationError):
    """Only an execution whose outcome is unknown is reconciled."""

    code = "not_reconcilable"


# The decision core's refusals, as the errors the doors answer with.
REFUSALS: dict[str, type[ConfirmationError]] = {
    error.code: error
    for error in (
        AlreadyApproved,
        AlreadyDecided,
        AlreadyVoted,
        PossibleDuplicate,
        AlreadyDecided,
        AlreadyVoted,
        PossibleDuplicate,
        FactorRequired,
        SecondLookRequired,
    )
}
