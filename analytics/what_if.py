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
from analytics.figures import version_note
from analytics.forms import RANGES, DraftForm, Scope, scope_from
from analytics.heavy import RangeTooHeavy, manager_deadline, too_heavy_message
from analytics.permissions import managers_only
from analytics.replay import policy_what_if
from approvals.selectors import PLAIN_WORDS, hold_explanation
from dispatch.models import Agent
from dispatch.money import money
from dispatch.pipeline import allowance
from dispatch.pipeline.allowance import HoldReason
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    HELD_OUTCOMES,
    ONE_REVIEWER,
    OUTCOMES,
    OVER_MAXIMUM,
    REFUSED,
    TWO_REVIEWERS,
    Verdict,
    WhatIf,
)
from dispatch.registry import tool_registry

OUTCOME_LABELS = {
    AUTO_EXECUTED: "Auto-executed",
    ONE_REVIEWER: "Held for one reviewer",
    TWO_REVIEWERS: "Held for two reviewers",
    REFUSED: "Refused",
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


def outcome_rows(result: WhatIf) -> list[OutcomeRow]:
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


def tool_rows(result: WhatIf) -> list[dict[str, Any]]:
    """Each tool's own outcomes, recorded and under the draft: where a tool has versions, each
    version is judged apart (each has its own human rule in the policy)."""
    return [
        {
            "tool": tool,
            "note": version_note(tool),
            "outcomes": [
                {
                    "label": OUTCOME_LABELS[outcome],
                    "actual": outcomes.actual[outcome].calls,
                    "draft": outcomes.draft[outcome].calls,
                }
                for outcome in OUTCOMES
            ],
        }
        for tool, outcomes in result.by_tool.items()
    ]


def moved_calls(result: WhatIf, policy: Policy, draft: Policy) -> list[dict[str, Any]]:
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
                    "reason": move_reason(verdict, policy, draft),
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


# Which threshold of a currency each rule weighs the call against.
_THRESHOLD_OF = {
    allowance.AMOUNT: "auto_approve_below_cents",
    allowance.WINDOW_SUM: "auto_approve_below_cents",
    allowance.BELOW_AUTO_APPROVE: "auto_approve_below_cents",
    allowance.AGENT_DAILY_CAP: "daily_cap_cents",
    allowance.TWO_REVIEWERS: "two_reviewers_from_cents",
    allowance.ONE_REVIEWER: "two_reviewers_from_cents",
    OVER_MAXIMUM: "max_amount_cents",
}


def move_reason(verdict: Verdict, policy: Policy, draft: Policy) -> str:
    """Why the draft sends a call where it does, in a manager's words: the rule that decided it
    (the pipeline's own reason, dispatch.pipeline.allowance), with the threshold it was weighed
    against under the draft and under the policy in force. The hold reasons read as a reviewer
    reads them (approvals.selectors.hold_explanation)."""
    call, rule = verdict.call, verdict.rule
    if rule is None:
        return ""
    currency = call.currency
    data = rule.data

    def amount(key: str) -> str:
        value = data.get(key)
        return money(value, currency) if isinstance(value, int) else "none"

    def in_force(kind: str) -> str:
        threshold = _THRESHOLD_OF.get(kind)
        if threshold is None:
            return ""
        now, drafted = policy.limits(currency), draft.limits(currency)
        if now is None:
            return f" (in force: no thresholds in {currency}, a human decides every call)"
        value = getattr(now, threshold)
        if drafted is not None and getattr(drafted, threshold) == value:
            # The same threshold: the sum moved, as calls before it went another way.
            return " (as in force; the calls before it went another way under the draft)"
        return f" (in force: {'none' if value is None else money(value, currency)})"

    if rule.kind == OVER_MAXIMUM:
        return (
            f"{money(call.amount_cents, currency)} is above {amount('max_amount_cents')}, the "
            f"most the draft lets an agent move in one call{in_force(rule.kind)}."
        )
    if rule.kind == allowance.NEVER:
        return f"The draft has no human decide a {call.tool}."
    if rule.kind == allowance.BELOW_AUTO_APPROVE:
        before = f" ({amount('earlier_cents')} before it)" if data.get("earlier_cents") else ""
        words = (
            f"With the customer's sum in the window, {amount('sum_cents')}{before}, below "
            f"{amount('auto_approve_below_cents')}, the draft lets it move without a human"
            f"{in_force(rule.kind)}"
        )
        if data.get("daily_cap_cents") is not None:
            words += (
                f"; the agent's {amount('agent_day_cents')} without a human today is within "
                f"its daily cap of {amount('daily_cap_cents')}{in_force(allowance.AGENT_DAILY_CAP)}"
            )
        return words + "."
    reviewers = verdict.reviewers
    reviewers_words = "" if reviewers is None else _reviewers_words(reviewers, currency, in_force)
    if call.outcome in HELD_OUTCOMES and verdict.outcome in HELD_OUTCOMES:
        # Held either way: the sum against the two-reviewer line decided.
        return reviewers_words
    spec = tool_registry.get(call.tool)
    explained = hold_explanation(
        rule._asdict(), currency, spec.action_words if spec is not None else PLAIN_WORDS
    )
    words = explained.summary if explained is not None else rule.message
    words = words.rstrip(".") + in_force(rule.kind) + "."
    if verdict.outcome == TWO_REVIEWERS:
        words += " " + reviewers_words
    return words


def _reviewers_words(reviewers: HoldReason, currency: str, in_force: Any) -> str:
    line = reviewers.data.get("two_reviewers_from_cents")
    total = money(int(reviewers.data["sum_cents"]), currency)
    if line is None:
        return (
            "The draft names no sum from which two reviewers must approve: one is enough"
            f"{in_force(reviewers.kind)}."
        )
    line_words = f"{money(int(line), currency)}, from which the draft needs two reviewers"
    if reviewers.kind == allowance.TWO_REVIEWERS:
        return (
            f"The customer's sum with it, {total}, is not below {line_words}"
            f"{in_force(reviewers.kind)}."
        )
    return (
        f"The customer's sum with it, {total}, is below {line_words}{in_force(reviewers.kind)}: "
        "one is enough."
    )


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
        # The draft as the propose form sends it on (the what-if's own parameters).
        propose_fields=[
            (name, value)
            for name, values in request.GET.lists()
            if name not in ("agent", "range", "since", "until")
            for value in values
        ],
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
    context.update(
        result=result,
        rows=outcome_rows(result),
        moves=moved_calls(result, policy, draft),
        tools=tool_rows(result) if len(result.by_tool) > 1 else [],
    )
    return render(request, "analytics/what_if.html", context)
