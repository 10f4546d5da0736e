"""Confirmations and their logs, read-only: reviewers decide in their own queue, not in the admin.
What each reviewer may approve alone is shown here, and changed by a policy change that a second
manager approves (approvals/policy_changes.py), as are new policy versions drafted here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from approvals.models import (
    ConfirmationEvent,
    Notification,
    NotificationRule,
    PolicyChange,
    ReviewerLimit,
    SlackLink,
    WebhookDelivery,
)
from approvals.policy_changes import PolicyChangeRefused, agent_active_set, policy_change_draft
from dispatch.admin import AgentAdmin, PolicyAdmin, ReadOnlyAdmin
from dispatch.models import Agent, Confirmation, Policy


@admin.register(Confirmation)
class ConfirmationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "tool",
        "agent",
        "customer_id",
        "amount_cents",
        "reviewers_required",
        "status",
        "created_at",
        "expires_at",
        "decided_at",
    )
    list_filter = ("status", "tool", "reviewers_required", "agent")
    list_select_related = ("agent",)
    search_fields = ("id", "session_id", "customer_id", "key")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """Each event sent to an agent's webhook, and how its sending went (approvals.webhooks)."""

    list_display = (
        "created_at",
        "event",
        "confirmation",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "delivered_at",
    )
    list_filter = ("status", "event", "confirmation__agent")
    list_select_related = ("confirmation",)
    search_fields = ("confirmation__id", "url")
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")


@admin.register(ReviewerLimit)
class ReviewerLimitAdmin(ReadOnlyAdmin):
    """What a reviewer's approval decides alone, per currency; above it, it is a vote. Changed by
    a policy change another manager approves (the Policy changes page)."""

    list_display = ("reviewer", "currency", "max_amount_cents")
    list_filter = ("currency",)
    list_select_related = ("reviewer",)
    search_fields = ("reviewer__username",)
    ordering = ("reviewer__username", "currency")


@admin.register(ConfirmationEvent)
class ConfirmationEventAdmin(ReadOnlyAdmin):
    """Each confirmation's log: who voted, decided or executed, and when. Append-only."""

    list_display = ("at", "confirmation", "kind", "actor_label", "message")
    list_filter = ("kind",)
    list_select_related = ("confirmation",)
    search_fields = ("confirmation__id", "actor_label")
    date_hierarchy = "at"
    ordering = ("-at", "-id")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """Each announcement of a held call on a channel, and how its sending went
    (approvals.notifications); failed ones say why."""

    list_display = (
        "created_at",
        "stage",
        "channel",
        "confirmation",
        "status",
        "attempts",
        "last_attempt_at",
        "last_error",
    )
    list_filter = ("status", "channel", "stage")
    search_fields = ("confirmation__id",)
    ordering = ("-created_at",)


@admin.register(NotificationRule)
class NotificationRuleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Per agent: e-mail on or off, its Slack channel, and when it escalates to whom."""

    list_display = ("agent", "email", "slack_channel", "escalate_after_minutes", "escalate_group")
    filter_horizontal = ("escalate_users",)


@admin.register(SlackLink)
class SlackLinkAdmin(ReadOnlyAdmin):
    """Reviewers' Slack users, linked by the reviewer's one-time code (approvals.slack)."""

    list_display = ("user", "team_id", "slack_user_id", "linked_at")
    exclude = ("code_hash",)


@admin.register(PolicyChange)
class PolicyChangeAdmin(ReadOnlyAdmin):
    """Drafted changes of policies and reviewers' limits; managers approve them on their pages."""

    list_display = ("id", "kind", "agent", "reviewer", "currency", "status", "drafted_by")
    list_filter = ("kind", "status")
    list_select_related = ("agent", "reviewer", "drafted_by")
    ordering = ("-drafted_at", "-id")


class DraftedPolicyAdmin(PolicyAdmin):
    """A new version added here is drafted: another manager approves it before it is in force."""

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        assert isinstance(request.user, User)
        proposal = {
            "allowed_tools": list(obj.allowed_tools),
            "human_rules": form.cleaned_data["human_rules"],
            "currency_limits": {
                currency: limits._asdict()
                for currency, limits in form.cleaned_data["currency_limits"].items()
            },
            "auto_approve_window_seconds": obj.auto_approve_window_seconds,
            "step_budget": obj.step_budget,
            "repeat_limit": obj.repeat_limit,
            "confirmation_ttl_seconds": obj.confirmation_ttl_seconds,
        }
        try:
            drafted = policy_change_draft(
                agent=obj.agent, proposal=proposal, drafted_by=request.user
            )
        except PolicyChangeRefused as refused:
            request._policy_change_refused = refused.message  # type: ignore[attr-defined]
            return
        request._policy_change = drafted  # type: ignore[attr-defined]

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        # Nothing was added: the draft is recorded in its agent's chain of policy events.
        return None

    def response_add(
        self, request: HttpRequest, obj: Policy, post_url_continue: str | None = None
    ) -> HttpResponse:
        refused = getattr(request, "_policy_change_refused", None)
        if refused is not None:
            self.message_user(request, f"Nothing was drafted: {refused}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        drafted: PolicyChange = request._policy_change  # type: ignore[attr-defined]
        self.message_user(
            request,
            f"Drafted policy change #{drafted.pk}: it is in force once another manager approves "
            "it on the Policy changes page.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse("admin:approvals_policychange_change", args=[drafted.pk])
        )


class RecordedAgentAdmin(AgentAdmin):
    """Disabling an agent stays one person's act, at once, recorded as such in its chain."""

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        if not (change and "is_active" in form.changed_data):
            super().save_model(request, obj, form, change)
            return
        assert isinstance(request.user, User)
        active = obj.is_active
        obj.is_active = not active
        super().save_model(request, obj, form, change)
        agent_active_set(agent=obj, active=active, actor=request.user, reason="the admin's form")

    @admin.action(description="Disable the selected agents at once (their tokens stop working)")
    def disable_agents(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        self._set_active(request, queryset, active=False)

    @admin.action(description="Enable the selected agents")
    def enable_agents(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        self._set_active(request, queryset, active=True)

    def _set_active(self, request: HttpRequest, queryset: QuerySet[Agent], *, active: bool) -> None:
        assert isinstance(request.user, User)
        changed = sum(
            agent_active_set(agent=agent, active=active, actor=request.user, reason="admin action")
            for agent in queryset
        )
        words = "Enabled" if active else "Disabled"
        self.message_user(request, f"{words} {changed} agent(s).", messages.SUCCESS)


admin.site.unregister(Policy)
admin.site.register(Policy, DraftedPolicyAdmin)
admin.site.unregister(Agent)
admin.site.register(Agent, RecordedAgentAdmin)
