"""Confirmations and their logs, read-only: reviewers decide in their own queue, not in the admin.
An admin sets here what each reviewer may approve alone."""

from __future__ import annotations

from django.contrib import admin

from approvals.models import (
    ConfirmationEvent,
    Notification,
    NotificationRule,
    ReviewerLimit,
    SlackLink,
    WebhookDelivery,
)
from dispatch.admin import ReadOnlyAdmin
from dispatch.models import Confirmation


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
class ReviewerLimitAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What a reviewer's approval decides alone, per currency; above it, it is a vote."""

    list_display = ("reviewer", "currency", "max_amount_cents")
    list_filter = ("currency",)
    list_select_related = ("reviewer",)
    search_fields = ("reviewer__username",)
    ordering = ("reviewer__username", "currency")
    autocomplete_fields = ("reviewer",)


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
