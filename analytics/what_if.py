"""The policy what-if page: a manager drafts an agent's money thresholds and sees, in calls and in
money, where the agent's recorded calls of a range would have gone under the draft.

The calls are judged again by the pipeline's own policy stages (dispatch.pipeline.what_if,
through analytics/replay.py). The page only reads: a GET with everything in the query string, so a
draft is a URL that can be shared, and nothing executes or is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from analytics import formatting
from analytics.forms import RANGES, DraftForm, Scope, scope_from
from analytics.heavy import RangeTooHeavy, manager_deadline, too_heavy_message
from analytics.permissions import managers_only
from analytics.replay import policy_what_if
from approvals.money import money
from dispatch.models import Agent
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    DRAFT_FIELDS,
    ONE_REVIEWER,
    OUTCOMES,
    REFUSED,
    TWO_REVIEWERS,
    WhatIf,
)

OUTCOME_LABELS = {
    AUTO_EXECUTED: "Auto-executed",
    ONE_REVIEWER: "Held for one reviewer",
    TWO_REVIEWERS: "Held for two reviewers",
    REFUSED: "Refused",
}
# Why the draft holds or refuses a call, in a manager's words.
REASON_LABELS = {
    "amount": "amount not below the auto-approve amount",
    "window_sum": "with the customer's money moved or on its way in the window, not below it",
    "agent_daily_cap": "over the agent's daily cap",
    "possible_duplicate": "repeats money moved in another conversation",
    "over_maximum": "over the maximum amount",
}


@dataclass(frozen=True)
class OutcomeRow:
    label: str
    outcome: str
    actual: str
    draft: str
    actual_calls: int
    draft_calls: int
    change: str


def _outcome_rows(result: WhatIf) -> list[OutcomeRow]:
    rows = []
    for outcome in OUTCOMES:
        before, after = result.actual[outcome], result.draft[outcome]
        difference = after.calls - before.calls
        rows.append(
            OutcomeRow(
                label=OUTCOME_LABELS[outcome],
                outcome=outcome,
                actual=formatting.amounts(before),
                draft=formatting.amounts(after),
                actual_calls=before.calls,
                draft_calls=after.calls,
                change=f"{difference:+,}" if difference else "no change",
            )
        )
    return rows


def _moves(result: WhatIf) -> list[dict[str, Any]]:
    return [
        {
            "actual": OUTCOME_LABELS[move.actual],
            "draft": OUTCOME_LABELS[move.draft],
            "calls": formatting.calls(move.tally.calls),
            "amount": formatting.amounts(move.tally),
            "examples": [
                {
                    "call_id": verdict.call.call_id,
                    "at": verdict.call.at,
                    "session_id": verdict.call.session_id,
                    "customer_id": verdict.call.customer_id,
                    "tool": verdict.call.tool,
                    "subject": verdict.call.subject,
                    "amount": money(verdict.call.amount_cents, verdict.call.currency),
                    "reason": REASON_LABELS.get(verdict.reason, verdict.reason),
                }
                for verdict in move.examples
            ],
            "more": move.tally.calls - len(move.examples),
        }
        for move in result.moves
    ]


def _draft_fields(form: DraftForm, policy: Policy, draft: Policy) -> list[dict[str, Any]]:
    """Each threshold's field, beside the current policy's value and whether the draft changes
    it."""
    return [
        {
            "field": form[name],
            "current": _policy_value(policy, name),
            "value": form.data.get(name, _policy_value(policy, name)),
            "changed": getattr(draft, name) != getattr(policy, name),
        }
        for name in DRAFT_FIELDS
    ]


def _policy_value(policy: Policy, name: str) -> str:
    value = getattr(policy, name)
    return "" if value is None else str(value)


@require_GET
@managers_only
def what_if(request: HttpRequest) -> HttpResponse:
    agents = list(
        Agent.objects.filter(current_policy__isnull=False)
        .select_related("current_policy")
        .order_by("name")
    )
    scope, scope_form = scope_from(request.GET)
    agent = next((a for a in agents if scope.agent and a.pk == scope.agent.pk), None)
    if agent is None and agents:
        agent = agents[0]
    context: dict[str, Any] = {"agents": agents, "agent": agent, "ranges": RANGES}
    if agent is None or agent.current_policy is None:
        return render(request, "analytics/what_if.html", context)
    scope = Scope(scope.since, scope.until, scope.range_key, agent)
    policy = agent.current_policy.snapshot()
    form = DraftForm(request.GET, policy=policy)
    draft = form.draft()
    context.update(
        scope=scope,
        scope_form=scope_form,
        form=form,
        fields=_draft_fields(form, policy, draft),
        changed=draft != policy,
        since_date=scope.since_date(),
        until_date=scope.until_date(),
        tz_name=timezone.get_current_timezone_name(),
    )
    try:
        result = policy_what_if(
            agent_id=agent.pk,
            since=scope.since,
            until=scope.until,
            draft=draft,
            deadline=manager_deadline(request),
        )
    except RangeTooHeavy:
        # The form stays, with what was asked, and the message takes the table's place.
        context.update(too_heavy=too_heavy_message())
        return render(request, "analytics/what_if.html", context, status=503)
    context.update(result=result, rows=_outcome_rows(result), moves=_moves(result))
    return render(request, "analytics/what_if.html", context)
