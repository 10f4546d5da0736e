"""What the sync and the async clients share: the call's envelope and the API's error envelope
as exceptions. Neither knows an HTTP library."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolgate_client.types import (
    AuthenticationError,
    ConflictError,
    ConnectionFailedError,
    MalformedRequestError,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    ThrottledError,
    ToolgateError,
)

ERRORS: dict[int, type[ToolgateError]] = {
    400: MalformedRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: MalformedRequestError,
    415: MalformedRequestError,
    422: MalformedRequestError,
    429: ThrottledError,
}


def call_envelope(
    tool: str,
    arguments: Any,
    *,
    session_id: str,
    customer_id: str | None,
    context: str | None,
) -> dict[str, Any]:
    """The body of POST /api/v1/calls: the model's raw argument text, or the JSON value the host
    parsed from it."""
    if not customer_id:
        raise ValueError("call() needs a customer_id, here or in the client's constructor")
    envelope: dict[str, Any] = {
        "session_id": session_id,
        "customer_id": customer_id,
        "tool": tool,
        "arguments": dict(arguments) if isinstance(arguments, Mapping) else arguments,
    }
    if context is not None:
        envelope["context"] = context
    return envelope


def request_headers(
    token: str | None, *, has_body: bool, extra: Mapping[str, str] | None
) -> dict[str, str]:
    sent = {"Content-Type": "application/json"} if has_body else {}
    if token is not None:
        sent["Authorization"] = f"Token {token}"
    sent.update(extra or {})
    return sent


def error_from(
    *,
    status: int,
    method: str,
    url: str,
    retry_after: str | None,
    document: Any,
) -> ToolgateError:
    """The exception for an answer that is not a 200 with JSON: the envelope's own words."""
    error = document.get("error") if isinstance(document, dict) else None
    kind = ERRORS.get(status, ServerError)
    if not isinstance(error, dict):
        return kind(
            f"{method} {url} answered {status} with no error envelope",
            status=status,
            code="unexpected_answer",
            retryable=status >= 500,
        )
    return kind(
        str(error.get("message", "")),
        status=status,
        code=str(error.get("code", "error")),
        retryable=bool(error.get("retryable", False)),
        retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
        error_id=error.get("error_id"),
    )


def timed_out(base_url: str, timeout: float) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"{base_url} did not answer within {timeout:g} s",
        status=0,
        code="timeout",
        retryable=True,
    )


def unreachable(base_url: str, error: BaseException) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"cannot connect to {base_url}: {error}",
        status=0,
        code="connection_failed",
        retryable=True,
    )


def answer_document(status: int, document: Any) -> dict[str, Any] | None:
    """The answer's JSON object, if it is a result: a 200 with an object."""
    return document if status == 200 and isinstance(document, dict) else None
