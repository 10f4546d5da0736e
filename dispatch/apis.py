"""The agent API v1: one view per operation, thin; the work is in services and selectors."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.utils.http import parse_header_parameters
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import ValidationError
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import ValidationError as DRFValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch import doors, host_keys, selectors
from dispatch.authentication import AgentRateThrottle, AgentTokenAuthentication, IsAgent
from dispatch.envelopes import (
    HOST_FIELDS,
    CallEnvelope,
    CallResultDoc,
    CodeCatalogueDoc,
    ConfirmationDoc,
    ErrorEnvelope,
    SessionCallsDoc,
    ToolListDoc,
)
from dispatch.errors import (
    MalformedEnvelope,
    PayloadTooLarge,
    SessionBoundElsewhere,
    UnsupportedBody,
    WithdrawalRefused,
)
from dispatch.formats import FORMATS, tools_in_format
from dispatch.models import Agent, AuditRecord
from dispatch.pipeline.messages import describe_validation_error
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.state import SessionConflict
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch
from dispatch.withdrawal import NOT_FOUND, DecisionRefused, held_call_withdraw

ERRORS = {
    401: OpenApiResponse(ErrorEnvelope, description="missing or invalid token"),
    403: OpenApiResponse(ErrorEnvelope, description="not an agent token"),
    429: OpenApiResponse(
        ErrorEnvelope,
        description="throttled: the agent over its rate (`throttled`), or too many failed "
        "authentications from the address (`authentication_throttled`); retryable",
    ),
    500: OpenApiResponse(ErrorEnvelope, description="unexpected error; `error_id` is in the log"),
    503: OpenApiResponse(ErrorEnvelope, description="the database is unavailable; retryable"),
}
# What an operation that takes no query parameter answers to one.
QUERY_REFUSED = {
    400: OpenApiResponse(ErrorEnvelope, description="a query parameter (it takes none)")
}


class JsonOnly(DefaultContentNegotiation):
    """JSON whatever the Accept header asks for: an agent host reads nothing else."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class JsonApi(APIView):
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonOnly
    # The query parameters the operation documents. Any other is refused with a 400, as an
    # unknown field of a body is: a misspelt `limt=5` is said, never silently ignored.
    query_parameters: ClassVar[frozenset[str]] = frozenset()

    def query_parameter_known(self, name: str) -> bool:
        return name in self.query_parameters

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # After authentication and permissions: who may not call it learns nothing of it.
        super().initial(request, *args, **kwargs)
        unknown = sorted(
            name for name in request.query_params if not self.query_parameter_known(name)
        )
        if unknown:
            shown = ", ".join(repr(name[:32]) for name in unknown[:5])
            known = ", ".join(sorted(self.query_parameters)) or "none"
            raise DRFValidationError(
                {"query": f"unknown parameter {shown}; this operation takes {known}"}
            )


class AgentApi(JsonApi):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentRateThrottle]
    # Bodies are read as strict JSON by the views themselves; this keeps the schema from
    # offering form encodings that would only be refused.
    parser_classes = [JSONParser]

    def agent(self, request: Request) -> Agent:
        assert isinstance(request.user, Agent)
        return request.user


class CallCreateApi(AgentApi):
    @extend_schema(
        operation_id="calls_create",
        summary="Submit one raw tool call",
        description=(
            "Every pipeline outcome, rejections included, is a 200 whose body says `ok`. "
            "Status codes other than 200 are about the envelope. The examples are real: each "
            "request with the answer it got (ok, replayed, held, and rejected at each stage)."
        ),
        parameters=[
            OpenApiParameter(
                host_keys.HEADER,
                str,
                location=OpenApiParameter.HEADER,
                required=False,
                pattern=r"^[\x20-\x7e]{1,255}$",
                description=(
                    "Optional; printable ASCII, 1 to 255 characters, chosen by the host (such as "
                    "a UUID) and kept across its restarts. The same key with the same "
                    "`customer_id`, `tool` and `arguments` gets the final answer again, byte for "
                    "byte, with `Idempotent-Replayed: true`, and nothing runs again, whatever the "
                    "`session_id` (a host that restarts under a new session cannot act twice). "
                    "Only final answers are kept: a 200 whose `retryable` is false, whose `code` "
                    "is not `INTERNAL_ERROR` and whose `data` does not say `outcome: unknown`; "
                    "after any other, the same request runs again in the session of the key's "
                    "first request, which finishes the first call rather than running a new one. "
                    "The same key with another request is a 422; while a request with it runs, "
                    "another is a 409 (retryable). Keys are per agent and kept at least 24 hours."
                ),
            )
        ],
        request=CallEnvelope,
        responses={
            200: CallResultDoc,
            400: OpenApiResponse(
                ErrorEnvelope,
                description="malformed envelope or Idempotency-Key, or a query parameter (it "
                "takes none)",
            ),
            409: OpenApiResponse(
                ErrorEnvelope,
                description=(
                    "session bound to another customer (`session_conflict`), or a request with "
                    "this Idempotency-Key still in progress (`idempotency_key_in_progress`, "
                    "retryable)"
                ),
            ),
            413: OpenApiResponse(ErrorEnvelope, description="body over the size limit"),
            415: OpenApiResponse(ErrorEnvelope, description="body not sent as application/json"),
            422: OpenApiResponse(
                ErrorEnvelope,
                description="this Idempotency-Key was sent with another request "
                "(`idempotency_key_reused`)",
            ),
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response | HttpResponse:
        agent = self.agent(request)
        envelope = self._envelope(request)
        key = self._idempotency_key(request)
        if key is None:
            return Response(_call(agent, envelope, session_id=envelope.session_id).as_dict())
        # Under the host's Idempotency-Key (dispatch/host_keys.py): the key's final answer if it
        # has one, else the call's, run in the session of the key's first request.
        claimed = host_keys.host_key_claim(
            agent=agent,
            key=key,
            request_hash=host_keys.request_hash(
                customer_id=envelope.customer_id, tool=envelope.tool, arguments=envelope.arguments
            ),
            session_id=envelope.session_id,
        )
        if isinstance(claimed, host_keys.Answer):
            replayed = HttpResponse(
                claimed.body, status=claimed.status_code, content_type="application/json"
            )
            replayed["Idempotent-Replayed"] = "true"
            return replayed
        try:
            result = _call(
                agent,
                envelope,
                session_id=claimed.session_id,
                on_result=partial(_key_answer_keep, claimed),
            )
        except BaseException:
            # An envelope error or a failure is not the key's answer: the key is given up.
            host_keys.host_key_release(claim=claimed)
            raise
        return HttpResponse(_rendered(result), content_type="application/json")

    @staticmethod
    def _idempotency_key(request: Request) -> str | None:
        key = request.headers.get(host_keys.HEADER)
        if key is None or host_keys.KEY_PATTERN.fullmatch(key):
            return key
        if not key:
            problem = "it is empty"
        elif len(key) > 255:
            problem = f"it has {len(key)}"
        else:
            problem = "it has others"
        raise MalformedEnvelope(
            f"The {host_keys.HEADER} header must be 1 to 255 printable ASCII characters "
            f"(such as a UUID); {problem}."
        )

    def _envelope(self, request: Request) -> CallEnvelope:
        self._require_json(request)
        limit = settings.TOOLGATE_MAX_BODY_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise MalformedEnvelope("Content-Length is not a number.") from None
        if declared > limit:
            raise PayloadTooLarge(f"The body is {declared} bytes; the limit is {limit}.")
        try:
            body = request.body
        except RequestDataTooBig:
            raise PayloadTooLarge(f"The body is over the limit of {limit} bytes.") from None
        if len(body) > limit:
            raise PayloadTooLarge(f"The body is over the limit of {limit} bytes.")
        try:
            document = doors.message_read(body)
        except doors.Unreadable as exc:
            if exc.field is not None:
                raise MalformedEnvelope(f"{exc.field}: {exc}; send it without.") from None
            raise MalformedEnvelope(f"The body is {exc}.") from None
        if not isinstance(document, dict):
            raise MalformedEnvelope(
                "The body must be a JSON object with session_id, customer_id, tool and arguments."
            )
        for field in HOST_FIELDS:
            value = document.get(field)
            # What the host vouches for is kept as sent. A NUL in the model's tool or arguments
            # goes on to the pipeline instead, which refuses it with an audit record.
            problem = doors.unstorable(value) if isinstance(value, str) else None
            if problem is not None:
                raise MalformedEnvelope(f"{field}: {problem}; send it without.")
        try:
            return CallEnvelope.model_validate(document, strict=True)
        except ValidationError as exc:
            raise MalformedEnvelope(describe_validation_error(CallEnvelope, exc)) from None

    @staticmethod
    def _require_json(request: Request) -> None:
        # A body is read as what its type says, or refused: what a proxy, a filter or a log in
        # front reads as text or a form must not execute as a call. JSON is UTF-8 (RFC 8259).
        sent = request.META.get("CONTENT_TYPE", "")
        media_type, parameters = parse_header_parameters(sent)
        charset = parameters.get("charset", "utf-8").lower()
        if media_type == "application/json" and charset == "utf-8":
            return
        shown = repr(sent[:64]) if sent else "no Content-Type"
        raise UnsupportedBody(f"The body must be sent as application/json (UTF-8), not {shown}.")


def _call(
    agent: Agent,
    envelope: CallEnvelope,
    *,
    session_id: str,
    on_result: Callable[[CallResult], None] | None = None,
) -> CallResult:
    """The envelope's call, in `session_id` (the envelope's, or its key's first request's)."""
    try:
        return call_dispatch(
            agent=agent,
            session_id=session_id,
            customer_id=envelope.customer_id,
            tool=envelope.tool,
            arguments=envelope.arguments,
            context=envelope.context,
            on_result=on_result,
        )
    except SessionConflict:
        raise SessionBoundElsewhere() from None


def _key_answer_keep(claim: host_keys.Claim, result: CallResult) -> None:
    """The call's answer kept against its key, in the call's transaction: as the key's answer
    if final, else as unfinished (the same request with this key runs it again in the claim's
    session, where the pipeline finishes it under its own key)."""
    if host_keys.answer_is_final(result):
        host_keys.host_key_answer(claim=claim, status_code=200, body=_rendered(result))
    else:
        host_keys.host_key_unfinished(claim=claim, status_code=200, body=_rendered(result))


def _rendered(result: CallResult) -> bytes:
    # What Response(result.as_dict()) sends: the same renderer, with no indent.
    return JSONRenderer().render(result.as_dict())


class ToolListApi(AgentApi):
    query_parameters = frozenset({"format"})

    @extend_schema(
        operation_id="tools_list",
        summary="The tools this agent may call",
        parameters=[
            OpenApiParameter(
                "format",
                str,
                enum=sorted(FORMATS),
                default="neutral",
                description=(
                    "The shape of each tool. `neutral`: Toolgate's own, with the input schema and "
                    "the flags (writes, risk, codes). `openai`: Chat Completions function tools, "
                    '`{"type": "function", "function": {"name", "description", "parameters"}}`, '
                    'with `"strict": true` where the schema is one OpenAI\'s strict mode accepts '
                    "(every object closed, every property required, only supported keywords). "
                    "`responses`: the Responses API's function tools, flat, "
                    '`{"type": "function", "name", "description", "parameters", "strict"}`. '
                    '`anthropic`: Messages API tools, `{"name", "description", "input_schema"}`, '
                    'with `"strict": true` where Anthropic\'s strict tool use accepts the schema '
                    "(no numeric or length bounds). Any other value is a 400."
                ),
            )
        ],
        responses={
            200: ToolListDoc,
            400: OpenApiResponse(ErrorEnvelope, description="unknown format or query parameter"),
            **ERRORS,
        },
    )
    def get(self, request: Request) -> Response:
        shape = request.query_params.get("format", "neutral")
        if shape not in FORMATS:
            raise DRFValidationError(
                {"format": f"must be one of {', '.join(sorted(FORMATS))}, not {shape[:32]!r}"}
            )
        specs = selectors.tools_for_agent(self.agent(request))
        return Response({"format": shape, "tools": tools_in_format(specs, shape)})


class CodeListApi(AgentApi):
    @extend_schema(
        operation_id="codes_list",
        summary="The catalogue of result codes",
        responses={200: CodeCatalogueDoc, **QUERY_REFUSED, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response({"codes": [code.as_dict() for code in tool_registry.catalogue]})


class NotFoundApi(JsonApi):
    """Any path under the prefix that names no endpoint."""

    authentication_classes = []
    permission_classes = [AllowAny]

    def query_parameter_known(self, name: str) -> bool:
        return True

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        raise NotFound("The agent API has no such endpoint; GET /api/schema/ lists them.")


class SessionCallsPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 500

    def get_limit(self, request: Request) -> int:
        return _whole_number(request, self.limit_query_param, self.default_limit, 1, self.max_limit)

    def get_offset(self, request: Request) -> int:
        return _whole_number(request, self.offset_query_param, 0, 0, 2**31 - 1)


def _whole_number(request: Request, name: str, default: int, low: int, high: int) -> int:
    """A query parameter that must be a whole number in [low, high] if given: anything else is
    a 400 naming it, never a silent default."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
        raise DRFValidationError(
            {name: f"must be a whole number from {low} to {high}, not {text[:32]!r}"}
        )
    return int(text)


def _call_as_dict(record: AuditRecord) -> dict[str, Any]:
    return {
        "call_id": record.call_id,
        "at": record.at.isoformat(),
        "step": record.step,
        "tool": record.tool,
        "ok": record.ok,
        "code": record.code,
        "message": record.message,
        "replayed": record.replayed,
        "arguments": record.arguments,
        "confirmation_id": record.confirmation_id or None,
        "duration_ms": round(record.duration_ms, 3),
        "channel": record.channel,
    }


class SessionCallsApi(AgentApi):
    query_parameters = frozenset({"limit", "offset"})

    @extend_schema(
        operation_id="session_calls_list",
        summary="This agent's calls in one session, in order",
        parameters=[
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": 500},
                description="page size (default 100, at most 500)",
            ),
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                description="calls to skip (default 0)",
            ),
        ],
        responses={
            200: SessionCallsDoc,
            400: OpenApiResponse(
                ErrorEnvelope,
                description="a limit or offset out of range, or an unknown query parameter",
            ),
            404: ErrorEnvelope,
            **ERRORS,
        },
    )
    def get(self, request: Request, session_id: str) -> Response:
        agent = self.agent(request)
        # An id no database can store names no session (and PostgreSQL would refuse the query).
        session = (
            None
            if doors.unstorable(session_id)
            else selectors.session_get(agent=agent, session_id=session_id)
        )
        if session is None:
            raise NotFound("This agent has no session with that id.")
        paginator = SessionCallsPagination()
        page = paginator.paginate_queryset(
            selectors.session_calls(agent=agent, session_id=session_id), request, view=self
        )
        return Response(
            {
                "session_id": session.session_id,
                "customer_id": session.customer_id,
                "count": paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "results": [_call_as_dict(record) for record in page or []],
            }
        )


_NO_CONFIRMATION = "This agent has no confirmation with that id."


class ConfirmationDetailApi(AgentApi):
    @extend_schema(
        operation_id="confirmations_retrieve",
        summary="The state of a held call of this agent, and its final result",
        responses={200: ConfirmationDoc, **QUERY_REFUSED, 404: ErrorEnvelope, **ERRORS},
    )
    def get(self, request: Request, confirmation_id: str) -> Response:
        confirmation = (
            None
            if doors.unstorable(confirmation_id)
            else selectors.confirmation_get(
                agent=self.agent(request), confirmation_id=confirmation_id
            )
        )
        if confirmation is None:
            raise NotFound(_NO_CONFIRMATION)
        return Response(selectors.confirmation_state(confirmation))


class ConfirmationWithdrawApi(AgentApi):
    @extend_schema(
        operation_id="confirmations_withdraw",
        summary="Withdraw a held call of this agent before a reviewer approves it",
        description=(
            "The agent's host takes back a held call (the user changed their mind, the "
            "conversation ended): it becomes `withdrawn`, nothing executes, its money no longer "
            "counts toward the customer's sum, and an identical call is judged anew. Refused "
            "once a reviewer approved it, or voted to (409 `already_approved`), and once it was "
            "rejected, expired, invalidated or withdrawn (409 `already_decided`); nothing moves "
            "then. A withdrawal and an approval at the same moment: exactly one of them happens."
        ),
        request=None,
        responses={
            200: ConfirmationDoc,
            **QUERY_REFUSED,
            404: ErrorEnvelope,
            409: OpenApiResponse(
                ErrorEnvelope, description="`already_approved` or `already_decided`"
            ),
            **ERRORS,
        },
    )
    def post(self, request: Request, confirmation_id: str) -> Response:
        agent = self.agent(request)
        if doors.unstorable(confirmation_id):
            raise NotFound(_NO_CONFIRMATION)
        try:
            withdrawn = held_call_withdraw(confirmation_id=confirmation_id, agent=agent)
        except DecisionRefused as refused:
            if refused.code == NOT_FOUND:
                raise NotFound(_NO_CONFIRMATION) from None
            raise WithdrawalRefused(refused.message, refused.code) from None
        return Response(selectors.confirmation_state(withdrawn))
