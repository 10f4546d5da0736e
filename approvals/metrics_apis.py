"""GET /api/v1/metrics: the figures of the dashboard, for managers' credentials only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.apis import PersonalTokenAuthentication
from dispatch.apis import JsonApi
from dispatch.envelopes import ErrorEnvelope
from dispatch.metrics import call_figures, confirmation_outcomes, policy_what_if
from dispatch.models import Agent

MANAGERS = "managers"
LONGEST_RANGE = timedelta(days=366)


class IsManager(BasePermission):
    message = "Only managers may read the metrics."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(
            getattr(user, "is_authenticated", False)
            and hasattr(user, "groups")
            and (user.is_superuser or user.groups.filter(name=MANAGERS).exists())
        )


class MetricsApi(JsonApi):
    authentication_classes = [SessionAuthentication, PersonalTokenAuthentication]
    permission_classes = [IsManager]

    @extend_schema(
        operation_id="metrics_read",
        summary="Call and confirmation figures for a time range (managers only)",
        parameters=[
            OpenApiParameter("since", str, description="ISO 8601; default: 24 hours ago"),
            OpenApiParameter("until", str, description="ISO 8601; default: now"),
            OpenApiParameter("agent", int, description="an agent's id"),
            OpenApiParameter("tool", str, description="a tool's name"),
            OpenApiParameter("bucket", str, enum=["hour", "day"], default="hour"),
        ],
        responses={
            200: OpenApiResponse(description="the figures of dispatch/metrics.py"),
            400: ErrorEnvelope,
            401: ErrorEnvelope,
            403: ErrorEnvelope,
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        since, until = _range(params, default=timedelta(hours=24))
        agent = params.get("agent")
        if agent is not None and not agent.isdigit():
            raise ValidationError({"agent": "must be an agent's id (a whole number)"})
        bucket = params.get("bucket", "hour")
        if bucket not in {"hour", "day"}:
            raise ValidationError({"bucket": "must be hour or day"})
        window: dict[str, Any] = {
            "since": since,
            "until": until,
            "agent_id": int(agent) if agent is not None else None,
            "tool": params.get("tool") or None,
        }
        calls = call_figures(
            **window, bucket=timedelta(days=1) if bucket == "day" else timedelta(hours=1)
        )
        return Response(
            {
                "since": since.isoformat(),
                "until": until.isoformat(),
                "calls": calls.as_dict(),
                "confirmations": confirmation_outcomes(**window),
            }
        )


def _range(params: Any, *, default: timedelta) -> tuple[datetime, datetime]:
    """The query's since and until: until defaults to now, since to `default` before it."""
    until = _moment(params.get("until"), "until") or timezone.now()
    since = _moment(params.get("since"), "since") or until - default
    if since >= until or until - since > LONGEST_RANGE:
        raise ValidationError({"since": "must be before until, and at most a year before it"})
    return since, until


def _moment(text: str | None, name: str) -> datetime | None:
    if not text:
        return None
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is None:
        raise ValidationError({name: "must be ISO 8601, such as 2026-12-03T10:00Z"})
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


# The policy fields a what-if may change, with their bounds.
WHAT_IF_FIELDS = {
    "auto_approve_below_cents": (0, 2**63 - 1),
    "auto_approve_window_seconds": (60, 2**31 - 1),
    "daily_cap_cents": (0, 2**63 - 1),
    "max_amount_cents": (1, 2**63 - 1),
}


class PolicyWhatIfApi(JsonApi):
    authentication_classes = [SessionAuthentication, PersonalTokenAuthentication]
    permission_classes = [IsManager]

    @extend_schema(
        operation_id="metrics_policy_what_if",
        summary="What a policy change would have done to an agent's past calls (managers only)",
        parameters=[
            OpenApiParameter("agent", int, required=True, description="an agent's id"),
            OpenApiParameter("since", str, description="ISO 8601; default: 7 days ago"),
            OpenApiParameter("until", str, description="ISO 8601; default: now"),
            *[
                OpenApiParameter(name, int, description="the changed value")
                for name in WHAT_IF_FIELDS
            ],
        ],
        responses={
            200: OpenApiResponse(description="actual and what-if tallies: (calls, cents)"),
            400: ErrorEnvelope,
            401: ErrorEnvelope,
            403: ErrorEnvelope,
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        since, until = _range(params, default=timedelta(days=7))
        agent = params.get("agent", "")
        if not agent.isdigit() or not Agent.objects.filter(pk=int(agent)).exists():
            raise ValidationError({"agent": "must be the id of an agent"})
        changes: dict[str, int] = {}
        for name, (low, high) in WHAT_IF_FIELDS.items():
            text = params.get(name)
            if text is None:
                continue
            if not text.isdigit() or not low <= int(text) <= high:
                raise ValidationError({name: f"must be a whole number from {low} to {high}"})
            changes[name] = int(text)
        try:
            result = policy_what_if(agent_id=int(agent), since=since, until=until, changes=changes)
        except ValueError as exc:
            raise ValidationError({"agent": str(exc)}) from None
        return Response({"since": since.isoformat(), "until": until.isoformat(), **result})
