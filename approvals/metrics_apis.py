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

from dispatch.apis import JsonApi
from dispatch.envelopes import ErrorEnvelope
from dispatch.metrics import call_figures, confirmation_outcomes

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
    authentication_classes = [SessionAuthentication]
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
        until = _moment(params.get("until"), "until") or timezone.now()
        since = _moment(params.get("since"), "since") or until - timedelta(hours=24)
        if since >= until or until - since > LONGEST_RANGE:
            raise ValidationError({"since": "must be before until, and at most a year before it"})
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
