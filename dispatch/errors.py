"""One error shape for every 4xx of the API: {"error": {"status", "code", "message"}}."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler


class MalformedEnvelope(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "malformed_envelope"
    default_detail = "The request body is not a valid call envelope."


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "The request body is larger than the limit."


class SessionBoundElsewhere(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "session_conflict"
    default_detail = "This session is already bound to another customer."


class RateLimiterDown(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "rate_limiter_unavailable"
    default_detail = "The rate limiter cannot be reached; send the request again in a moment."
    # DRF's handler turns `wait` into a Retry-After header.
    wait = 1


def _flatten(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(_flatten(item) for item in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    return str(detail)


_CODES_BY_STATUS = {404: "not_found", 403: "permission_denied", 405: "method_not_allowed"}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = _CODES_BY_STATUS.get(response.status_code, "error")
    if isinstance(exc, APIException):
        code = getattr(exc.detail, "code", None) or exc.default_code
    response.data = {
        "error": {
            "status": response.status_code,
            "code": str(code),
            "message": _flatten(response.data.get("detail", response.data)),
        }
    }
    return response
