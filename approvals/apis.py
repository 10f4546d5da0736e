"""Reviewers decide on the API: approve, or reject with a reason.

A reviewer is a user in the `reviewers` group, signed in in the browser (with its CSRF token) or
sending their personal token (`Authorization: Token <token>`, from `create_reviewer_token`).
Agents send tokens the same way: an agent's token is recognised as one, and refused, always:
nothing an agent can do decides a confirmation.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import APIException, NotFound
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.factors import FactorLocked, factor_check, factor_fresh
from approvals.provider_check import ProviderCheckUnavailable, ProviderUserGone
from approvals.reviewers import is_reviewer, reviewer_authenticate
from approvals.services import (
    ConfirmationError,
    ConfirmationNotFound,
    FactorRequired,
    ReasonRequired,
    SecondLookRequired,
)
from approvals.services import confirmation_approve as approve
from approvals.services import confirmation_reject as reject
from dispatch.apis import JsonApi
from dispatch.authentication import AgentTokenAuthentication
from dispatch.envelopes import ConfirmationDoc, ErrorEnvelope
from dispatch.models import Agent, Confirmation
from dispatch.pipeline.decision import FACTOR_REQUIRED
from dispatch.pipeline.messages import describe_validation_error
from dispatch.selectors import confirmation_state


class PersonalTokenAuthentication(AgentTokenAuthentication):
    """`Token <token>`: an agent's token first, so that it is known (and refused) as an agent's;
    then a person's."""

    refusal = "Invalid token, or its user or agent is disabled."

    def token_holder(self, token: str) -> Agent | User | None:
        agent = super().token_holder(token)
        return agent if agent is not None else reviewer_authenticate(token)


class IsReviewer(BasePermission):
    message = "Only reviewers (members of the 'reviewers' group) decide confirmations."

    def has_permission(self, request: Request, view: APIView) -> bool:
        if isinstance(request.user, Agent):
            self.message = "An agent's token never decides a confirmation; a reviewer does."
            return False
        return is_reviewer(request.user)


class DecisionRefused(APIException):
    """The decision cannot be made as asked: already decided, or already voted for."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "confirmation_conflict"


class FactorRefused(APIException):
    """An approval above its policy's second-factor line without a fresh factor, or with a wrong
    or reused code."""

    status_code = status.HTTP_403_FORBIDDEN
    default_code = FACTOR_REQUIRED


class FactorLockedOut(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "second_factor_locked"


class DecisionInvalid(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid_decision"


NOT_ONLY_SPACES = (
    "[^\\t\\n\\u000b\\u000c\\r\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028\\u2029\\u202f\\u205f\\u3000]"
)


class RejectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="RejectRequest")

    reason: str = Field(
        min_length=1,
        max_length=1000,
        description="why it is rejected, with something other than spaces (a 400 otherwise); "
        "the agent's model reads it in the result's message",
        # A character that is not whitespace as the service reads it (Python's str.split()),
        # spelt out so that every regular-expression dialect reads it the same.
        json_schema_extra={"pattern": NOT_ONLY_SPACES},
    )


APPROVE_EXAMPLES = [
    OpenApiExample("Approve", value={}, request_only=True, description="An approval, no more."),
    OpenApiExample(
        "Approve a possible duplicate",
        value={"separate": True},
        request_only=True,
        description="The reviewer's word that a possible duplicate is a separate one.",
    ),
    OpenApiExample(
        "Approve above the second-look amount",
        value={"confirmed": True},
        request_only=True,
        description="The second look that an amount above the policy's `confirm_above` needs.",
    ),
]

REJECT_EXAMPLES = [
    OpenApiExample(
        "Reject with a reason",
        value={"reason": "Not what the customer asked for: offer store credit instead."},
        request_only=True,
        description="The reason reaches the agent's model in the result's message.",
    ),
]


class ApproveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="ApproveRequest")

    separate: bool = Field(
        default=False,
        description="the reviewer's explicit word that a possible duplicate is a separate one; "
        "without it, approving a possible duplicate is refused (409 `possible_duplicate`)",
    )
    totp: str | None = Field(
        default=None,
        min_length=6,
        max_length=8,
        pattern="^[0-9]+$",
        description="a code of the reviewer's authenticator app, given now: an amount above the "
        "policy's `factor_above` needs it with a reviewer's token (403 "
        "`second_factor_required` without it, `second_factor_invalid` for a wrong or reused "
        "one, 429 `second_factor_locked` after too many wrong ones)",
    )
    confirmed: bool = Field(
        default=False,
        description="the reviewer's second look at an amount above the policy's `confirm_above` "
        "in its currency; without it, approving such an amount is refused (400 "
        "`confirmation_required`), and nothing is recorded",
    )


_ERRORS = {
    401: OpenApiResponse(ErrorEnvelope, description="no credentials, or an invalid token"),
    403: OpenApiResponse(
        ErrorEnvelope,
        description="not a reviewer, an agent's token, a session request without CSRF token, or "
        "an amount above the policy's `factor_above` without a fresh second factor "
        "(`second_factor_required`) or with a wrong or used code (`second_factor_invalid`), "
        "or a single sign-on reviewer the identity provider no longer vouches for "
        "(`provider_user_gone`; their token stops working)",
    ),
    404: OpenApiResponse(ErrorEnvelope, description="no such confirmation"),
    429: OpenApiResponse(
        ErrorEnvelope,
        description="too many failed authentications from the address "
        "(`authentication_throttled`); retryable after Retry-After",
    ),
    409: OpenApiResponse(
        ErrorEnvelope,
        description="no longer pending (`already_decided`), this reviewer approved it already "
        "(`already_voted`), or a possible duplicate approved without `separate` "
        "(`possible_duplicate`)",
    ),
    500: OpenApiResponse(ErrorEnvelope, description="unexpected error; `error_id` is in the log"),
    503: OpenApiResponse(
        ErrorEnvelope,
        description="the database is unavailable, or a single sign-on reviewer's identity "
        "provider could not be asked (`provider_check_unavailable`); retryable",
    ),
}

_STATE = OpenApiResponse(
    ConfirmationDoc,
    description="the confirmation's state after the decision, as GET "
    "/api/v1/confirmations/{confirmation_id} answers it",
)


class ReviewerApi(JsonApi):
    authentication_classes = [PersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [IsReviewer]
    parser_classes = [JSONParser]

    def reviewer(self, request: Request) -> User:
        assert isinstance(request.user, User)
        return request.user

    @staticmethod
    def require_confirmation(confirmation_id: str) -> None:
        if not Confirmation.objects.filter(pk=confirmation_id).exists():
            raise NotFound("There is no confirmation with that id.")

    @staticmethod
    def answer(confirmation_id: str) -> Response:
        # Read again: an execution that ran right after the commit (no broker) has moved it on.
        return Response(confirmation_state(Confirmation.objects.get(pk=confirmation_id)))


class ProviderRefused(APIException):
    """A single sign-on reviewer the identity provider no longer vouches for: their token is
    deleted with this answer."""

    status_code = status.HTTP_403_FORBIDDEN
    default_code = "provider_user_gone"


class ProviderUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "provider_check_unavailable"


def _refused(exc: ConfirmationError) -> APIException:
    if isinstance(exc, ProviderUserGone):
        return ProviderRefused(exc.message, exc.code)
    if isinstance(exc, ProviderCheckUnavailable):
        return ProviderUnavailable(exc.message, exc.code)
    if isinstance(exc, FactorRequired):
        return FactorRefused(exc.message, exc.code)
    if isinstance(exc, ConfirmationNotFound):
        return NotFound("There is no confirmation with that id.")
    if isinstance(exc, ReasonRequired | SecondLookRequired):
        return DecisionInvalid(exc.message, exc.code)
    return DecisionRefused(exc.message, exc.code)


class ConfirmationApproveApi(ReviewerApi):
    @extend_schema(
        operation_id="confirmations_approve",
        summary="Approve a held call (reviewers only)",
        description=(
            "Records this reviewer's approval. The customer's sum of this moment (everything "
            "moved or on its way in the policy's window, this call once) decides how many "
            "different reviewers must approve and whose approval limit covers it. Once they "
            "have, the call is checked again against the state of now and, if it still passes, "
            "executed in the background; if not, it is `invalidated`. The body is optional: "
            '`{"separate": true}` approves a possible duplicate as a separate one; '
            '`{"confirmed": true}` is the second look that an amount above the policy\'s '
            "`confirm_above` needs."
        ),
        request=ApproveRequest,
        examples=APPROVE_EXAMPLES,
        responses={
            200: _STATE,
            400: OpenApiResponse(
                ErrorEnvelope,
                description="a malformed body, or an amount above the policy's `confirm_above` "
                "approved without `confirmed` (`confirmation_required`)",
            ),
            **_ERRORS,
        },
    )
    def post(self, request: Request, confirmation_id: str) -> Response:
        body = self._body(request)
        self.require_confirmation(confirmation_id)
        reviewer = self.reviewer(request)
        try:
            approve(
                confirmation_id=confirmation_id,
                reviewer=reviewer,
                separate=body.separate,
                confirmed=body.confirmed,
                factor=self._factor(request, reviewer, body.totp),
            )
        except ConfirmationError as exc:
            raise _refused(exc) from None
        return self.answer(confirmation_id)

    @staticmethod
    def _factor(request: Request, reviewer: User, code: str | None) -> bool:
        """A TOTP code in the request, checked now; without one, a browser session's fresh
        factor (a token alone carries none)."""
        if code is None:
            return isinstance(
                request.successful_authenticator, SessionAuthentication
            ) and factor_fresh(request._request)
        try:
            valid = factor_check(request=request._request, user=reviewer, code=code)
        except FactorLocked:
            raise FactorLockedOut(
                "Too many wrong codes: wait for the lockout to end, as after wrong passwords."
            ) from None
        if not valid:
            raise FactorRefused(
                "That code is wrong, or was used already: send the one the app shows now.",
                "second_factor_invalid",
            )
        return True

    @staticmethod
    def _body(request: Request) -> ApproveRequest:
        data: Any = request.data
        if data in (None, "") or (hasattr(data, "__len__") and not len(data)):
            return ApproveRequest()
        if not isinstance(data, dict):
            raise DecisionInvalid(
                'The body, if any, must be a JSON object: {"separate": true}.', "malformed_body"
            )
        try:
            return ApproveRequest.model_validate(data, strict=True)
        except ValidationError as exc:
            message = describe_validation_error(ApproveRequest, exc)
            raise DecisionInvalid(message, "malformed_body") from None


class ConfirmationRejectApi(ReviewerApi):
    @extend_schema(
        operation_id="confirmations_reject",
        summary="Reject a held call with a reason (reviewers only)",
        description="Nothing executes; the reason reaches the agent's model.",
        request=RejectRequest,
        examples=REJECT_EXAMPLES,
        responses={
            200: _STATE,
            400: OpenApiResponse(ErrorEnvelope, description="no reason, or a malformed body"),
            **_ERRORS,
        },
    )
    def post(self, request: Request, confirmation_id: str) -> Response:
        body = self._body(request)
        self.require_confirmation(confirmation_id)
        try:
            reject(
                confirmation_id=confirmation_id,
                reviewer=self.reviewer(request),
                reason=body.reason,
            )
        except ConfirmationError as exc:
            raise _refused(exc) from None
        return self.answer(confirmation_id)

    @staticmethod
    def _body(request: Request) -> RejectRequest:
        data: Any = request.data
        if not isinstance(data, dict):
            raise DecisionInvalid(
                'The body must be a JSON object: {"reason": "..."}.', "malformed_body"
            )
        try:
            return RejectRequest.model_validate(data, strict=True)
        except ValidationError as exc:
            message = describe_validation_error(RejectRequest, exc)
            raise DecisionInvalid(message, "malformed_body") from None


class PersonalTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = PersonalTokenAuthentication
    name = "ReviewerToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>`: a reviewer's personal token, printed once by "
            "`create_reviewer_token`. Agents' tokens are refused here (403).",
        }
