"""One error shape for every answer of the agent API that is not a result:
{"error": {"status", "code", "message", "retryable"}}, and "error_id" on a 500.

DRF's exception handler covers all that happens in an API view, authentication and throttling
included; Django's error handlers (named in toolgate/urls.py) cover what happens around the views
under the same prefix, and keep their HTML pages everywhere else. Refusals worth watching are
recorded here too, as they are answered (dispatch.security).
"""

from __future__ import annotations

import logging
import math
import sys
import uuid
from typing import Any

import psycopg
from django.core.exceptions import DisallowedHost
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from dispatch.auth_failures import THROTTLED_REASON
from dispatch.pipeline.state import StoreUnavailable
from dispatch.security import (
    RECORDED_STATUSES,
    api_agent,
    api_origin,
    security_event_record,
)

logger = logging.getLogger(__name__)

# Where the agent API lives (toolgate/urls.py); the schema and its docs page are not part of it.
API_PATH_PREFIX = "/api/v1/"

# What a database that is away raises: refused, dropped, or closed under the connection; through
# Django, or on a connection of psycopg's own (the allowance's side connection).
DATABASE_AWAY = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)


def database_away(exc: BaseException) -> bool:
    """Whether the request failed because the database went away under it: the error says so, or
    caused the one raised (the pipeline tried to record a failure on the dead connection), or the
    request's connection is lost (terminated by the server, say) whatever was raised after."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (*DATABASE_AWAY, StoreUnavailable)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    raw = connection.connection
    return raw is not None and bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))


# Sending the same request again can help: once the rate allows it, or once the database is back.
_RETRYABLE = frozenset({status.HTTP_429_TOO_MANY_REQUESTS, status.HTTP_503_SERVICE_UNAVAILABLE})


class MalformedEnvelope(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "malformed_envelope"
    default_detail = "The request body is not a valid call envelope."


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "The request body is larger than the limit."


class UnsupportedBody(APIException):
    status_code = status.HTTP_415_UNSUPPORTED_MEDIA_TYPE
    default_code = "unsupported_media_type"
    default_detail = "The body must be sent as application/json."


class SessionBoundElsewhere(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "session_conflict"
    default_detail = "This session is already bound to another customer."


class WithdrawalRefused(APIException):
    """The held call can no longer be withdrawn: a reviewer approved it (`already_approved`), or
    it was decided otherwise or expired (`already_decided`)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "already_decided"


class IdempotencyKeyReused(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_key_reused"
    default_detail = "This Idempotency-Key was already sent with another request."


class IdempotencyKeyInProgress(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "idempotency_key_in_progress"
    default_detail = (
        "A request with this Idempotency-Key is still being processed; send it again in a moment."
    )
    # Unlike a session bound elsewhere, this one is over once the first request has its answer.
    retryable = True
    wait = 1


class RateLimiterDown(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "rate_limiter_unavailable"
    default_detail = "The rate limiter cannot be reached; send the request again in a moment."
    # DRF's handler turns `wait` into a Retry-After header.
    wait = 1


class AuthenticationThrottled(APIException):
    """Too many failed authentications from the client's address (dispatch.auth_failures)."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = THROTTLED_REASON

    def __init__(self, wait: float) -> None:
        # DRF's handler turns `wait` into a Retry-After header, in whole seconds.
        self.wait = max(1, math.ceil(wait))
        super().__init__(
            f"Too many failed authentications from this address; send the request again in "
            f"{self.wait} seconds."
        )


def error_body(
    *,
    status_code: int,
    code: str,
    message: str,
    error_id: str | None = None,
    retryable: bool | None = None,
) -> dict[str, Any]:
    """`retryable` defaults to what the status says (429 and 503 are)."""
    error: dict[str, Any] = {
        "status": status_code,
        "code": code,
        "message": message,
        "retryable": status_code in _RETRYABLE if retryable is None else retryable,
    }
    if error_id is not None:
        error["error_id"] = error_id
    return {"error": error}


def is_api_request(request: HttpRequest | Request) -> bool:
    return request.path_info.startswith(API_PATH_PREFIX)


def _flatten(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(_flatten(item) for item in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    return str(detail)


_CODES_BY_STATUS = {404: "not_found", 403: "permission_denied", 405: "method_not_allowed"}

_DATABASE_AWAY_MESSAGE = "The database is unavailable; send the same request again in a moment."


def _database_away(request: HttpRequest | Request, exc: BaseException) -> dict[str, Any]:
    # One line, not a traceback: while the database is down every request says the same.
    logger.warning(
        "The database is unavailable for %s %s: %s: %s",
        request.method,
        request.path_info,
        type(exc).__name__,
        str(exc).strip()[:200],
    )
    return error_body(
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        code="database_unavailable",
        message=_DATABASE_AWAY_MESSAGE,
    )


def _unexpected(request: HttpRequest | Request, exc: BaseException) -> dict[str, Any]:
    error_id = uuid.uuid4().hex
    logger.exception(
        "Unexpected error %s on %s %s", error_id, request.method, request.path_info, exc_info=exc
    )
    return error_body(
        status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
        code="internal_error",
        message=f"An unexpected error occurred; it is logged as {error_id}.",
        error_id=error_id,
    )


def _record_refusal(
    request: HttpRequest | Request, status_code: int, code: str, message: str
) -> None:
    if status_code in RECORDED_STATUSES:
        security_event_record(
            origin=api_origin(request),
            agent=api_agent(request),
            status=status_code,
            reason=code,
            detail=message,
        )


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = exception_handler(exc, context)
    request = context.get("request")
    if response is not None:
        code = _CODES_BY_STATUS.get(response.status_code, "error")
        if isinstance(exc, APIException):
            code = getattr(exc.detail, "code", None) or exc.default_code
        message = _flatten(response.data.get("detail", response.data))
        response.data = error_body(
            status_code=response.status_code,
            code=str(code),
            message=message,
            retryable=getattr(exc, "retryable", None),
        )
        if request is not None and is_api_request(request):
            _record_refusal(request, response.status_code, str(code), message)
        return response
    if request is None or not is_api_request(request):
        return None
    set_rollback()
    if database_away(exc):
        return Response(_database_away(request, exc), status=status.HTTP_503_SERVICE_UNAVAILABLE)
    return Response(_unexpected(request, exc), status=status.HTTP_500_INTERNAL_SERVER_ERROR)


# Django's error handlers: what goes wrong under the prefix outside an API view -----------------


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api_request(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        # Django's own message names the host and suggests a setting; neither is for the client.
        code, message = "host_not_allowed", "This server does not answer to that Host."
    else:
        code, message = "bad_request", "The request is malformed."
    _record_refusal(request, 400, code, message)
    return JsonResponse(error_body(status_code=400, code=code, message=message), status=400)


def server_error(request: HttpRequest) -> HttpResponse:
    if not is_api_request(request):
        return defaults.server_error(request)
    # Django calls this while it handles the exception, which is therefore still current.
    exc = sys.exc_info()[1] or RuntimeError("unknown error")
    if database_away(exc):
        return JsonResponse(_database_away(request, exc), status=503)
    return JsonResponse(_unexpected(request, exc), status=500)
