"""The policy changes' pages: managers draft a change (from the what-if, or a reviewer's limit
here; an administrator drafts from the admin), read its difference and its what-if over the last
30 days in money, and another manager approves it (approvals/policy_changes.py decides)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from analytics.drafts import THRESHOLDS, limits_in_major_units, parameter
from analytics.forms import DraftForm
from analytics.heavy import RangeTooHeavy, manager_deadline, too_heavy_message
from analytics.permissions import managers_only
from analytics.replay import policy_what_if
from analytics.what_if import moved_calls, outcome_rows
from approvals.models import PolicyChange, PolicyChangeKind, PolicyChangeStatus
from approvals.policy_changes import (
    OWN_DRAFT,
    PolicyChangeRefused,
    change_difference,
    limit_change_draft,
    policy_change_approve,
    policy_change_draft,
    policy_change_withdraw,
    proposal_of_snapshot,
    proposal_snapshot,
)
from approvals.reviewers import REVIEWERS_GROUP
from dispatch.models import Agent
from dispatch.money import AmountInvalid, minor_units
from dispatch.security import page_origin, security_event_record

# The what-if a draft shows before anyone approves it.
WHAT_IF_DAYS = 30
_LISTED = 50


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


@require_GET
@managers_only
def policy_changes(request: HttpRequest) -> HttpResponse:
    changes = PolicyChange.objects.select_related("agent", "reviewer", "drafted_by", "decided_by")
    return render(
        request,
        "analytics/policy_changes.html",
        {
            "drafts": list(changes.filter(status=PolicyChangeStatus.DRAFT)),
            "settled": list(changes.exclude(status=PolicyChangeStatus.DRAFT)[:_LISTED]),
            "reviewers": User.objects.filter(groups__name=REVIEWERS_GROUP, is_active=True)
            .order_by("username")
            .distinct(),
        },
    )


def _what_if_context(request: HttpRequest, change: PolicyChange) -> dict[str, Any]:
    """The draft against the version it was drafted on, over the agent's last 30 days."""
    assert change.agent is not None and change.base_policy is not None
    policy = change.base_policy.snapshot()
    draft = proposal_snapshot(change.proposal, change.base_policy.version + 1)
    until = timezone.now()
    since = until - timedelta(days=WHAT_IF_DAYS)
    query: dict[str, str] = {
        "agent": str(change.agent_id),
        "range": "30d",
        "auto_approve_window_seconds": str(draft.auto_approve_window_seconds),
    }
    for currency, limits in (draft.currencies or {}).items():
        shown = limits_in_major_units(limits, currency)
        query.update({parameter(currency, name): shown[name] for name in THRESHOLDS})
    context: dict[str, Any] = {
        "what_if_url": reverse("analytics:what-if") + "?" + urlencode(query),
        "since": since,
        "until": until,
    }
    try:
        result = policy_what_if(
            agent_id=change.agent.pk,
            since=since,
            until=until,
            draft=draft,
            deadline=manager_deadline(request),
        )
    except RangeTooHeavy:
        context["too_heavy"] = too_heavy_message()
        return context
    context.update(
        result=result, rows=outcome_rows(result), moves=moved_calls(result, policy, draft)
    )
    return context


def _detail(
    request: HttpRequest, change: PolicyChange, *, refused: str = "", status: int = 200
) -> HttpResponse:
    """The change's page; a refusal shows it without the what-if, which runs only under
    /analytics/'s slot and time budget (analytics/heavy.py)."""
    context: dict[str, Any] = {
        "change": change,
        "difference": change_difference(change),
        "events": list(change.events.order_by("chain_seq")),
        "own": change.drafted_by_id == request.user.pk,
        "refused": refused,
        "is_draft": change.status == PolicyChangeStatus.DRAFT,
    }
    if (
        change.kind == PolicyChangeKind.POLICY
        and change.status == PolicyChangeStatus.DRAFT
        and not refused
    ):
        context.update(_what_if_context(request, change))
        assert change.agent is not None
        context["moved_since"] = change.agent.current_policy_id != change.base_policy_id
    return render(request, "analytics/policy_change.html", context, status=status)


def _change(change_id: int) -> PolicyChange:
    return get_object_or_404(
        PolicyChange.objects.select_related(
            "agent", "base_policy", "reviewer", "drafted_by", "decided_by", "policy"
        ),
        pk=change_id,
    )


@require_GET
@managers_only
def policy_change(request: HttpRequest, change_id: int) -> HttpResponse:
    return _detail(request, _change(change_id))


@require_POST
@managers_only
def policy_change_approve_view(request: HttpRequest, change_id: int) -> HttpResponse:
    change = _change(change_id)
    try:
        policy_change_approve(change_id=change.pk, approver=_user(request))
    except PolicyChangeRefused as refused:
        status = 403 if refused.code == OWN_DRAFT else 409
        if refused.code == OWN_DRAFT:
            security_event_record(
                origin=page_origin(request),
                agent=change.agent,
                status=403,
                reason=refused.code,
                detail=f"{_user(request).get_username()} approving their own policy change "
                f"{change.pk}",
            )
        return _detail(request, _change(change_id), refused=refused.message, status=status)
    messages.success(request, "Approved: the change is in force.")
    return HttpResponseRedirect(reverse("analytics:policy-change", args=[change.pk]))


@require_POST
@managers_only
def policy_change_withdraw_view(request: HttpRequest, change_id: int) -> HttpResponse:
    change = _change(change_id)
    try:
        policy_change_withdraw(change_id=change.pk, user=_user(request))
    except PolicyChangeRefused as refused:
        return _detail(request, _change(change_id), refused=refused.message, status=409)
    messages.success(request, "Withdrawn: nothing was applied.")
    return HttpResponseRedirect(reverse("analytics:policy-change", args=[change.pk]))


@require_POST
@managers_only
def policy_change_propose(request: HttpRequest) -> HttpResponse:
    """The what-if's draft (its window and thresholds), proposed as a change of the policy."""
    agent_id = str(request.POST.get("agent", ""))
    agent = get_object_or_404(
        Agent.objects.select_related("current_policy"),
        pk=int(agent_id) if agent_id.isdigit() else 0,
    )
    back = reverse("analytics:what-if") + "?" + _query_without(request.POST, "csrfmiddlewaretoken")
    if agent.current_policy is None:
        messages.error(request, f"{agent.name} has no policy to change.")
        return HttpResponseRedirect(back)
    form = DraftForm(request.POST, policy=agent.current_policy.snapshot())
    draft = form.draft()
    if form.errors:
        messages.error(request, "The draft has values that were not taken: correct them first.")
        return HttpResponseRedirect(back)
    try:
        change = policy_change_draft(
            agent=agent,
            proposal=proposal_of_snapshot(agent.current_policy, draft),
            drafted_by=_user(request),
            note=str(request.POST.get("note", ""))[:2000],
        )
    except PolicyChangeRefused as refused:
        messages.error(request, refused.message)
        return HttpResponseRedirect(back)
    messages.success(request, "Drafted: another manager approves it before it is in force.")
    return HttpResponseRedirect(reverse("analytics:policy-change", args=[change.pk]))


def _query_without(data: QueryDict, *names: str) -> str:
    kept = data.copy()
    for name in (*names, "note"):
        kept.pop(name, None)
    return kept.urlencode()


@require_POST
@managers_only
def limit_change_propose(request: HttpRequest) -> HttpResponse:
    """A reviewer's limit in one currency, drafted: an amount in its major units, or empty for no
    limit."""
    back = reverse("analytics:policy-changes")
    reviewer_id = str(request.POST.get("reviewer", ""))
    reviewer = User.objects.filter(pk=int(reviewer_id)).first() if reviewer_id.isdigit() else None
    currency = str(request.POST.get("currency", "")).strip().upper()
    text = str(request.POST.get("amount", "")).strip()
    if reviewer is None:
        messages.error(request, "Choose a reviewer.")
        return HttpResponseRedirect(back)
    try:
        cents = None if not text else minor_units(text, currency)
        change = limit_change_draft(
            reviewer=reviewer,
            currency=currency,
            max_amount_cents=cents,
            drafted_by=_user(request),
            note=str(request.POST.get("note", ""))[:2000],
        )
    except (AmountInvalid, PolicyChangeRefused) as error:
        messages.error(request, getattr(error, "message", str(error)))
        return HttpResponseRedirect(back)
    messages.success(request, "Drafted: another manager approves it before it is in force.")
    return HttpResponseRedirect(reverse("analytics:policy-change", args=[change.pk]))
