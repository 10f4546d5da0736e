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
from analytics.drafts import THRESHOLDS, limits_in_major_units, parameter
from analytics.forms import RANGES, DraftForm, Scope, scope_from
from analytics.heavy import RangeTooHeavy, manager_deadline, too_heavy_message
from analytics.permissions import managers_only
from analytics.replay import policy_what_if
from approvals.money import money
from dispatch.models import Agent
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
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
    "possible_duplicate": "repeats money held, approved or moved in another conversation",
    "no_thresholds": "a currency the draft sets no thresholds for",
    "always": "a tool a human always decides",
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


def _draft_groups(form: DraftForm, policy: Policy, draft: Policy) -> list[dict[str, Any]]:
    """Each currency's thresholds, in its major units: the field, the value in force, and
    whether the draft changes it."""
    groups = []
    for currency in form.currencies:
        current = limits_in_major_units(policy.limits(currency), currency)
        drafted = limits_in_major_units(draft.limits(currency), currency)
        groups.append(
            {
                "currency": currency,
                "held": policy.limits(currency) is None,
                "fields": [
                    {
                        "field": form[parameter(currency, threshold)],
                        "current": current[threshold],
                        "value": form.data.get(parameter(currency, threshold), current[threshold]),
                        "changed": drafted[threshold] != current[threshold],
                    }
                    for threshold in THRESHOLDS
                ],
            }
        )
    return groups


def _window_field(form: DraftForm, policy: Policy, draft: Policy) -> dict[str, Any]:
    current = str(policy.auto_approve_window_seconds)
    return {
        "field": form["auto_approve_window_seconds"],
        "current": current,
        "value": form.data.get("auto_approve_window_seconds", current),
        "changed": draft.auto_approve_window_seconds != policy.auto_approve_window_seconds,
    }


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
        groups=_draft_groups(form, policy, draft),
        window=_window_field(form, policy, draft),
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
