"""What the agent API answers, as typed values: the result contract, a confirmation, an error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A confirmation in one of these states changes no more.
FINAL_STATUSES = frozenset(
    {"executed", "failed", "unknown", "rejected", "expired", "invalidated", "superseded"}
)


@dataclass(frozen=True, slots=True)
class CallResult:
    """The result contract of POST /api/v1/calls: a rejection is a result, not an exception."""

    call_id: str
    ok: bool
    tool: str
    code: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
    replayed: bool = False
    retryable: bool = False
    model_text: str = ""

    @property
    def held(self) -> bool:
        """Held for a human: `confirmation_id` says which confirmation to wait for."""
        return self.code == "CONFIRMATION_REQUIRED"

    @property
    def confirmation_id(self) -> str | None:
        value = self.data.get("confirmation_id")
        return str(value) if value else None

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> CallResult:
        return cls(
            call_id=str(document["call_id"]),
            ok=bool(document["ok"]),
            tool=str(document["tool"]),
            code=str(document["code"]),
            message=str(document["message"]),
            data=dict(document.get("data") or {}),
            replayed=bool(document.get("replayed", False)),
            retryable=bool(document.get("retryable", False)),
            model_text=str(document.get("model_text", "")),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "ok": self.ok,
            "tool": self.tool,
            "code": self.code,
            "message": self.message,
            "data": dict(self.data),
            "replayed": self.replayed,
            "retryable": self.retryable,
            "model_text": self.model_text,
        }


@dataclass(frozen=True, slots=True)
class Confirmation:
    """GET /api/v1/confirmations/{id}: a held call's state and, once final, its result."""

    confirmation_id: str
    status: str
    tool: str
    arguments: Mapping[str, Any]
    decision_code: str | None = None
    decision_reason: str | None = None
    result: CallResult | None = None
    # The whole answer, for the fields not named here (times, hold reason, policy version).
    document: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def final(self) -> bool:
        """The server's word that nothing follows; the known final statuses for a server that
        does not say."""
        said = self.document.get("final")
        return said if isinstance(said, bool) else self.status in FINAL_STATUSES

    @property
    def superseded_by(self) -> str | None:
        """A reviewer edited this held call before approving it: the confirmation that takes its
        place (poll that one instead); None otherwise."""
        found = self.document.get("superseded_by")
        return found if isinstance(found, str) else None

    @property
    def model_text(self) -> str:
        """What to tell the model now: the final result's text, or the state it is in."""
        if self.result is not None and self.result.model_text:
            return self.result.model_text
        reason = f" ({self.decision_reason})" if self.decision_reason else ""
        return f"{self.status.upper()} {self.tool}: confirmation {self.confirmation_id}{reason}"

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Confirmation:
        result = document.get("result")
        return cls(
            confirmation_id=str(document["confirmation_id"]),
            status=str(document["status"]),
            tool=str(document["tool"]),
            arguments=dict(document.get("arguments") or {}),
            decision_code=document.get("decision_code"),
            decision_reason=document.get("decision_reason"),
            result=CallResult.from_json(result) if isinstance(result, Mapping) else None,
            document=dict(document),
        )


class ToolgateError(Exception):
    """An answer that is not a result (the API's error envelope), or no answer at all."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        retryable: bool = False,
        retry_after: float | None = None,
        error_id: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.message = message
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
        self.error_id = error_id


class MalformedRequestError(ToolgateError):
    """400, 413, 415 or 422: the request itself is wrong; sending it again will not help."""


class AuthenticationError(ToolgateError):
    """401: the token is missing or not valid."""


class PermissionDeniedError(ToolgateError):
    """403: this token may not do that."""


class NotFoundError(ToolgateError):
    """404: no such endpoint, or nothing of this agent's with that id."""


class ConflictError(ToolgateError):
    """409: the session is bound to another customer, or an Idempotency-Key is in use."""


class ThrottledError(ToolgateError):
    """429: too many requests; `retry_after` says how long to wait."""


class ServerError(ToolgateError):
    """500 or 503 (retryable), or an answer that is not the API's."""


class ConnectionFailedError(ToolgateError):
    """The server could not be reached, or did not answer in time (status 0)."""


class WaitTimeoutError(TimeoutError):
    """wait() gave up before the confirmation reached a final status."""

    def __init__(self, confirmation: Confirmation, timeout: float) -> None:
        super().__init__(
            f"confirmation {confirmation.confirmation_id} is still {confirmation.status} "
            f"after {timeout:g} s"
        )
        self.confirmation = confirmation
