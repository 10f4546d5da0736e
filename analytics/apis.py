"""GET /api/v1/metrics and /api/v1/metrics/what-if: the dashboard's figures and the what-if, for
managers only (analytics/permissions.py). Times are read and written in UTC."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from analytics.drafts import (
    THRESHOLDS,
    WINDOW,
    draft_currencies,
    draft_read,
    unknown_parameters,
)
from analytics.heavy import ManagerApi, manager_deadline
from analytics.permissions import IsManager
from analytics.ranges import DAY, HOUR, moment_in, range_problem
from analytics.replay import policy_what_if
from analytics.selectors import call_figures, confirmation_outcomes, rollups_freshness
from approvals.apis import PersonalTokenAuthentication
from dispatch import doors
from dispatch.envelopes import NO_NUL, ErrorEnvelope
from dispatch.models import Agent
from dispatch.pipeline.allowance import HoldReason
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    DRAFT_FIELDS,
    OUTCOMES,
    DraftError,
    Tally,
    WhatIf,
    draft_of,
)
from dispatch.registry import tool_registry

# A currency's draft threshold, such as BRL_auto_approve_below.
_DRAFT_THRESHOLD = re.compile(r"[A-Z]{3}_(?:" + "|".join(THRESHOLDS) + ")")

AGENT_ID = {"type": "integer", "minimum": 1, "maximum": 10**18 - 1}
# The page sends every field, an empty one meaning "as the policy has it"; so may the API.
_WINDOW_SCHEMA = {
    "anyOf": [
        {
            "type": "integer",
            "minimum": DRAFT_FIELDS[WINDOW][0],
            "maximum": DRAFT_FIELDS[WINDOW][1],
        },
        {"type": "string", "maxLength": 0},
    ]
}
# What no schema can say of a request, answered 400 with the parameter named.
_UNSAYABLE = (
    "a time that is not one, a since not before its until, a range over a year, an agent that "
    "does not exist or has no policy, a draft value out of range, or an unknown query parameter"
)

# What the API says of the times it reads and writes.
TIME_ZONE = "UTC"
_IN_UTC = "a time without an offset is UTC; a date alone is that whole UTC day"


class MetricsApi(ManagerApi):
    authentication_classes = [SessionAuthentication, PersonalTokenAuthentication]
    permission_classes = [IsManager]
    query_parameters = frozenset({"since", "until", "agent", "tool", "bucket"})

    @extend_schema(
        operation_id="metrics_read",
        summary="Call and confirmation figures for a time range (managers only)",
        parameters=[
            OpenApiParameter(
                "since", str, description=f"ISO 8601 ({_IN_UTC}); default: 24 hours ago"
            ),
            OpenApiParameter("until", str, description=f"ISO 8601 ({_IN_UTC}); default: now"),
            OpenApiParameter("agent", AGENT_ID, description="an agent's id"),
            OpenApiParameter("tool", NO_NUL, description="a tool's name"),
            OpenApiParameter("bucket", str, enum=["hour", "day"], default="hour"),
        ],
        responses={
            200: OpenApiResponse(description="the figures of analytics/selectors.py"),
            400: OpenApiResponse(ErrorEnvelope, description=_UNSAYABLE),
            401: ErrorEnvelope,
            403: ErrorEnvelope,
            429: OpenApiResponse(
                ErrorEnvelope,
                description="too many failed authentications from the address; retryable",
            ),
            503: OpenApiResponse(
                ErrorEnvelope,
                description="managers_busy: other reports are running, send it again after "
                "Retry-After; range_too_heavy: the range cannot be read in time, ask for a "
                "shorter one",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        since, until = _range(params, default=DAY)
        agent = params.get("agent")
        if agent is not None and not _agent_id(agent):
            raise ValidationError({"agent": "must be an agent's id (a whole number)"})
        tool = params.get("tool")
        problem = None if tool is None else doors.unstorable(tool)
        if problem is not None:
            raise ValidationError({"tool": problem})
        bucket = params.get("bucket", "hour")
        if bucket not in {"hour", "day"}:
            raise ValidationError({"bucket": "must be hour or day"})
        window: dict[str, Any] = {
            "since": since,
            "until": until,
            "agent_id": int(agent) if agent is not None else None,
            "tool": params.get("tool") or None,
        }
        calls = call_figures(**window, bucket=DAY if bucket == "day" else HOUR)
        freshness = rollups_freshness()
        return Response(
            {
                "time_zone": TIME_ZONE,
                # The rollups' calls arrived before filled_until; the later ones are counted
                # from their records.
                "rollups": {
                    "filled_until": _iso(freshness.filled_until),
                    "filled_at": _iso(freshness.filled_at),
                },
                "since": since.isoformat(),
                "until": until.isoformat(),
                "calls": calls.as_dict(),
                "confirmations": confirmation_outcomes(**window),
                # Where each tool with versions stands among them (docs/tools.md): its figures
                # are its own, under its own name, in `calls`.
                "tool_versions": [
                    {
                        "tool": spec.name,
                        "replaces": spec.replaces,
                        "replaced_by": tool_registry.replaced_by(spec.name),
                        "retired": spec.retired,
                    }
                    for line in tool_registry.version_lines()
                    for spec in line
                ],
            }
        )


def _agent_id(text: str) -> bool:
    """Whether the text can be an agent's id: a positive whole number that fits the column."""
    return text.isascii() and text.isdigit() and len(text) < 19 and int(text) > 0


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def _range(params: Any, *, default: timedelta) -> tuple[datetime, datetime]:
    """The query's since and until, read in UTC: until defaults to now, since to `default`
    before it."""
    until = _moment(params.get("until"), "until", end=True) or timezone.now()
    since = _moment(params.get("since"), "since", end=False) or until - default
    problem = range_problem(since, until)
    if problem is not None:
        raise ValidationError({"since": problem})
    return since, until


def _moment(text: str | None, name: str, *, end: bool) -> datetime | None:
    if not text:
        return None
    try:
        return moment_in(text, UTC, end=end)
    except ValueError as error:
        raise ValidationError({name: f"{error} Such as 2026-12-03T10:00Z."}) from None


class PolicyWhatIfApi(ManagerApi):
    authentication_classes = [SessionAuthentication, PersonalTokenAuthentication]
    permission_classes = [IsManager]
    query_parameters = frozenset({"agent", "since", "until", WINDOW})

    def query_parameter_known(self, name: str) -> bool:
        return name in self.query_parameters or _DRAFT_THRESHOLD.fullmatch(name) is not None

    @extend_schema(
        operation_id="metrics_policy_what_if",
        summary="What a policy change would have done to an agent's past calls (managers only)",
        description=(
            "The agent's recorded money-moving calls in the range are judged again by the "
            "pipeline's policy stages under its current policy with the given changes. Outcomes: "
            + ", ".join(OUTCOMES)
            + ". Money is in minor units per currency. Nothing executes and nothing is written."
        ),
        parameters=[
            OpenApiParameter("agent", AGENT_ID, required=True, description="an agent's id"),
            OpenApiParameter(
                "since", str, description=f"ISO 8601 ({_IN_UTC}); default: 7 days ago"
            ),
            OpenApiParameter("until", str, description=f"ISO 8601 ({_IN_UTC}); default: now"),
            OpenApiParameter(
                WINDOW,
                _WINDOW_SCHEMA,
                description="the draft's window of the customer's sum, in seconds; empty: the "
                "policy's own",
            ),
            OpenApiParameter(
                "{CUR}_{threshold}",
                str,
                description="a currency's draft threshold in its major units, such as "
                "BRL_auto_approve_below=100 (100.00 BRL), JPY_max_amount=30000, "
                "KWD_daily_cap=12.250; the thresholds: " + ", ".join(THRESHOLDS) + "; empty for "
                "no such limit where one may be none; a currency the policy sets none for takes "
                "its maximum first",
            ),
        ],
        responses={
            200: OpenApiResponse(
                description="per outcome, the recorded and the draft's calls and money; the "
                "calls that would move between outcomes, with examples"
            ),
            400: OpenApiResponse(ErrorEnvelope, description=_UNSAYABLE),
            401: ErrorEnvelope,
            403: ErrorEnvelope,
            429: OpenApiResponse(
                ErrorEnvelope,
                description="too many failed authentications from the address; retryable",
            ),
            503: OpenApiResponse(
                ErrorEnvelope,
                description="managers_busy: other reports are running, send it again after "
                "Retry-After; range_too_heavy: the range cannot be read in time, ask for a "
                "shorter one",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        since, until = _range(params, default=7 * DAY)
        agent_id = params.get("agent", "")
        agent = (
            Agent.objects.select_related("current_policy").filter(pk=int(agent_id)).first()
            if _agent_id(agent_id)
            else None
        )
        if agent is None:
            raise ValidationError({"agent": "must be the id of an agent"})
        if agent.current_policy is None:
            raise ValidationError({"agent": f"agent {agent.name} has no policy"})
        policy = agent.current_policy.snapshot()
        currencies = draft_currencies(policy)
        unknown = unknown_parameters(params, policy, WHAT_IF_PARAMETERS)
        read = draft_read({name: params.get(name, "") for name in params}, currencies, policy)
        if unknown or read.problems:
            # Nothing is left out in silence: every parameter it cannot read is said.
            raise ValidationError({**unknown, **read.problems})
        try:
            draft = draft_of(
                policy,
                {} if read.window is None else {WINDOW: read.window},
                read.currencies,
            )
        except DraftError as error:
            raise ValidationError({error.field: error.message}) from None
        result = policy_what_if(
            agent_id=agent.pk,
            since=since,
            until=until,
            draft=draft,
            deadline=manager_deadline(request),
        )
        return Response(
            {
                "time_zone": TIME_ZONE,
                "since": since.isoformat(),
                "until": until.isoformat(),
                "agent": agent.pk,
                "policy": _thresholds_json(policy, currencies),
                "draft": _thresholds_json(draft, currencies),
                **what_if_as_json(result),
            }
        )


# The what-if's parameters besides its draft (DRF's `format` chooses the renderer).
WHAT_IF_PARAMETERS = ("agent", "since", "until", "format")


def _thresholds_json(policy: Policy, currencies: list[str]) -> dict[str, Any]:
    """The window, and each currency's thresholds in its minor units (null: no such limit; a
    currency with none at all is null: its calls are held for a human)."""
    shown: dict[str, Any] = {}
    for currency in currencies:
        limits = policy.limits(currency)
        shown[currency] = None if limits is None else limits._asdict()
    return {WINDOW: policy.auto_approve_window_seconds, "currencies": shown}


def _rule_json(rule: HoldReason | None) -> dict[str, Any] | None:
    if rule is None:
        return None
    return {"kind": rule.kind, "message": rule.message, "data": dict(rule.data)}


def what_if_as_json(result: WhatIf) -> dict[str, Any]:
    def tally(t: Tally) -> dict[str, Any]:
        return {"calls": t.calls, "cents": dict(t.cents)}

    return {
        "calls": result.calls,
        "outcomes": [
            {
                "outcome": outcome,
                "actual": tally(result.actual[outcome]),
                "what_if": tally(result.draft[outcome]),
            }
            for outcome in OUTCOMES
        ],
        "moves": [
            {
                "from": move.actual,
                "to": move.draft,
                **tally(move.tally),
                "examples": [
                    {
                        "call_id": v.call.call_id,
                        "at": v.call.at.isoformat(),
                        "session_id": v.call.session_id,
                        "customer_id": v.call.customer_id,
                        "tool": v.call.tool,
                        "subject": v.call.subject,
                        "amount_cents": v.call.amount_cents,
                        "currency": v.call.currency,
                        "reason": v.reason,
                        # The rule that decided, in the pipeline's terms (minor units).
                        "rule": _rule_json(v.rule),
                        "reviewers": _rule_json(v.reviewers),
                    }
                    for v in move.examples
                ],
            }
            for move in result.moves
        ],
        "reasons": dict(result.reasons),
        # Each tool's own outcomes (each version of a tool apart), recorded and under the draft.
        "by_tool": {
            tool: [
                {
                    "outcome": outcome,
                    "actual": tally(outcomes.actual[outcome]),
                    "what_if": tally(outcomes.draft[outcome]),
                }
                for outcome in OUTCOMES
            ]
            for tool, outcomes in result.by_tool.items()
        },
    }
