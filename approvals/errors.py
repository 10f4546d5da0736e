"""Why a reviewer's action on a held call cannot be made: a stable code and words for them."""

from __future__ import annotations

from dispatch.models import Confirmation
from dispatch.pipeline import decision


class ConfirmationError(Exception):
    """A decision that cannot be made; `code` is stable, `message` is for the reviewer."""

    code = "confirmation_error"

    def __init__(self, message: str, confirmation: Confirmation | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation = confirmation


class ConfirmationNotFound(ConfirmationError):
    code = "not_found"


class AlreadyDecided(ConfirmationError):
    """It is no longer pending (decided by someone else, expired, or executing)."""

    code = decision.ALREADY_DECIDED


class AlreadyVoted(ConfirmationError):
    """This reviewer approved it already; another reviewer's approval is needed."""

    code = decision.ALREADY_VOTED


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
        AlreadyDecided,
        AlreadyVoted,
        PossibleDuplicate,
        FactorRequired,
        SecondLookRequired,
    )
}
