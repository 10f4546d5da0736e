"""What humans do with held calls: their votes, the event log of each confirmation, and what a
reviewer may decide. The held call itself is dispatch.Confirmation."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dispatch.models import Confirmation


class ReviewerLimit(models.Model):
    """The largest amount a reviewer's approval decides alone, in one currency (set by an admin).

    A reviewer with no limit for a currency has no cap in it. Above the limit their approval is a
    vote: the confirmation executes once a reviewer whose limit covers the amount approved too.
    """

    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approval_limits"
    )
    currency = models.CharField(max_length=16)
    max_amount_cents = models.PositiveBigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reviewer", "currency"], name="reviewer_limit_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} up to {self.max_amount_cents} {self.currency}"


class ReviewerToken(models.Model):
    """A person's own API token (one per user); its hash only. Their groups decide what it opens."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token"
    )
    token_prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.user} ({self.token_prefix}…)"


class Vote(models.Model):
    """One reviewer's approval of one confirmation."""

    confirmation = models.ForeignKey(Confirmation, on_delete=models.PROTECT, related_name="votes")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="votes"
    )
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["confirmation", "reviewer"], name="vote_once_per_reviewer"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} approved {self.confirmation_id}"


class EventKind(models.TextChoices):
    VOTED = "voted"
    # A reviewer said a possible duplicate is a separate one (a deliberate second action).
    SEPARATE = "separate"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"
    EXECUTING = "executing"
    EXECUTED = "executed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"
    # The agent's host withdrew the held call (before any approval).
    WITHDRAWN = "withdrawn"
    # Undecided after the notification rule's minutes: the next group was told; and again
    # shortly before it expires.
    ESCALATED = "escalated"
    REMINDED = "reminded"
    # A reviewer changed the held call before approving: on the edited call, who, and its
    # arguments before and after; on the original, the call that took its place.
    EDITED = "edited"
    SUPERSEDED = "superseded"


class ConfirmationEvent(models.Model):
    """The append-only log of one confirmation: who (a reviewer, or the worker), when, what."""

    confirmation = models.ForeignKey(Confirmation, on_delete=models.PROTECT, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    # The reviewer who acted; none for the worker or the expiry.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="confirmation_events",
    )
    # "worker", "expiry", or the reviewer's user name as it was then.
    actor_label = models.CharField(max_length=150)
    message = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    # Its link in its confirmation's chain (dispatch/pipeline/audit_chain.py), and the hash's
    # MAC under the audit key (dispatch/audit_keys.py).
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True)
    chain_hash = models.CharField(max_length=64, blank=True, default="")
    chain_mac = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["confirmation", "at"], name="event_confirmation_idx")]

    def __str__(self) -> str:
        return f"{self.confirmation_id} {self.kind} by {self.actor_label}"


class WebhookDeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    # Every attempt failed; nothing more is tried.
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One event of a confirmation sent to its agent's webhook, and how its sending went.

    The body is fixed when the event happens, so a retry sends the same state, not a later one.
    """

    confirmation = models.ForeignKey(
        Confirmation, on_delete=models.PROTECT, related_name="webhook_deliveries"
    )
    event = models.CharField(max_length=16)
    # Where the last attempt went: the agent's webhook URL at the time.
    url = models.URLField(max_length=500)
    payload = models.JSONField()
    status = models.CharField(
        max_length=16,
        choices=WebhookDeliveryStatus.choices,
        default=WebhookDeliveryStatus.PENDING,
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    # The receiver's HTTP status of the last attempt; none when it was not reached.
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # When its next attempt is due, while it is pending: its task is sent for that moment. One
    # found well past it lost its task (the broker was down), and the sweep sends it again.
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["status", "created_at"], name="webhook_delivery_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.confirmation_id} ({self.status})"


class NotificationChannel(models.TextChoices):
    EMAIL = "email"
    SLACK = "slack"


class NotificationStage(models.TextChoices):
    # The call was held: the reviewers who may decide it are told.
    HELD = "held"
    # Undecided after the rule's minutes: the next group (or named people) is told.
    ESCALATED = "escalated"
    # Undecided shortly before it expires: told once more.
    EXPIRING = "expiring"


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    # Every attempt failed; nothing more is tried.
    FAILED = "failed"
    # Nothing to send: the channel is off for the agent, no one to tell, or decided meanwhile.
    SKIPPED = "skipped"


class NotificationRule(models.Model):
    """Where an agent's held calls are announced and when they are escalated; an agent without
    one follows the TOOLGATE_NOTIFY_* settings."""

    agent = models.OneToOneField(
        "dispatch.Agent", on_delete=models.CASCADE, related_name="notification_rule"
    )
    email = models.BooleanField(default=True, help_text="e-mail the reviewers who may decide")
    slack_channel = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="Slack channel id (C0123...); empty: TOOLGATE_SLACK_CHANNEL, none if unset",
    )
    escalate_after_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="undecided this long after the hold: escalate"
    )
    escalate_group = models.CharField(
        max_length=150, blank=True, default="", help_text="the group told when it escalates"
    )
    escalate_users = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="+", help_text="people told as well"
    )
    remind_before_expiry_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="undecided this long before expiry: tell them again"
    )

    def __str__(self) -> str:
        return f"notifications of {self.agent}"


class Notification(models.Model):
    """One announcement of a held call on one channel, and how its sending went: the outbox row
    written in the hold's own transaction (or by the escalation sweep), sent after commit, retried
    with backoff, and swept again when its task was lost (as WebhookDelivery)."""

    confirmation = models.ForeignKey(
        Confirmation, on_delete=models.PROTECT, related_name="notifications"
    )
    stage = models.CharField(max_length=16, choices=NotificationStage.choices)
    channel = models.CharField(max_length=8, choices=NotificationChannel.choices)
    status = models.CharField(
        max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    # Who was told (user ids, e-mail); a retry skips them.
    recipients_done = models.JSONField(default=list, blank=True)
    # Where the Slack message is (channel id and ts), for chat.update once it is decided.
    slack_channel = models.CharField(max_length=32, blank=True, default="")
    slack_ts = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["confirmation", "stage", "channel"], name="notification_once_per_stage"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="notification_due_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.stage} of {self.confirmation_id} by {self.channel} ({self.status})"


class SlackLink(models.Model):
    """A reviewer's Slack user, proven from both sides: Toolgate showed the reviewer a one-time
    code, and that Slack user sent it back in a signed request from the configured workspace."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_link"
    )
    # A pending link has a code's hash and no Slack user yet.
    code_hash = models.CharField(max_length=64, blank=True, default="")
    code_expires_at = models.DateTimeField(null=True, blank=True)
    team_id = models.CharField(max_length=32, blank=True, default="")
    slack_user_id = models.CharField(max_length=32, blank=True, default="")
    linked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"],
                condition=~models.Q(slack_user_id=""),
                name="slack_link_one_reviewer_per_slack_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} as {self.slack_user_id or '(not linked yet)'}"


class SlackRequest(models.Model):
    """A signed Slack request seen, by its signature: the same one again is a replay. Kept a
    little longer than Slack's five minutes, then pruned."""

    signature = models.CharField(max_length=80, unique=True)
    at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"Slack request at {self.at:%Y-%m-%d %H:%M:%S}"


class PolicyChangeKind(models.TextChoices):
    # A new version of an agent's policy.
    POLICY = "policy"
    # A reviewer's approval limit in one currency (ReviewerLimit), set or removed.
    LIMIT = "limit"


class PolicyChangeStatus(models.TextChoices):
    DRAFT = "draft"
    APPROVED = "approved"
    WITHDRAWN = "withdrawn"


class PolicyChange(models.Model):
    """A change to an agent's policy or to a reviewer's limit, drafted by one person and applied
    only when another manager approves it (approvals/policy_changes.py).

    Policies are insert-only, so a draft lives here until then. On PostgreSQL a trigger refuses
    to change what a draft proposes, to settle it twice, or to record its author as its approver
    (migration approvals 0008); the application's role may not delete one.
    """

    kind = models.CharField(max_length=8, choices=PolicyChangeKind.choices)
    agent = models.ForeignKey(
        "dispatch.Agent",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="policy_changes",
    )
    # The version in force when it was drafted: approving it after another version took its
    # place is refused (the difference shown would no longer be the difference applied).
    base_policy = models.ForeignKey(
        "dispatch.Policy", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="limit_changes",
    )
    currency = models.CharField(max_length=16, blank=True, default="")
    # A policy: every field of the new version (allowed_tools, currency_limits in minor units,
    # human_rules, auto_approve_window_seconds, step_budget, repeat_limit,
    # confirmation_ttl_seconds). A limit: {"max_amount_cents": n}, or n null to remove it.
    proposal = models.JSONField()
    note = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=12, choices=PolicyChangeStatus.choices, default=PolicyChangeStatus.DRAFT
    )
    drafted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    drafted_at = models.DateTimeField()
    # Who approved or withdrew it, and when.
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # The version its approval made.
    policy = models.ForeignKey(
        "dispatch.Policy", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-drafted_at", "-id"]
        indexes = [models.Index(fields=["status", "drafted_at"], name="policy_change_status_idx")]

    def __str__(self) -> str:
        return f"{self.kind} change {self.pk} ({self.status})"


class PolicyEventKind(models.TextChoices):
    DRAFTED = "drafted"
    APPROVED = "approved"
    WITHDRAWN = "withdrawn"
    # The emergency path: one person disables (or enables again) an agent at once.
    DISABLED = "disabled"
    ENABLED = "enabled"


class PolicyEvent(models.Model):
    """Who drafted, approved or withdrew each change, and who disabled an agent alone: append-only,
    chained per agent (a reviewer's limits: per reviewer), sealed and verified with the audit."""

    chain = models.CharField(max_length=64)
    at = models.DateTimeField()
    kind = models.CharField(max_length=12, choices=PolicyEventKind.choices)
    change = models.ForeignKey(
        PolicyChange, on_delete=models.PROTECT, null=True, blank=True, related_name="events"
    )
    agent = models.ForeignKey(
        "dispatch.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    actor_label = models.CharField(max_length=150)
    data = models.JSONField(default=dict, blank=True)
    chain_seq = models.PositiveBigIntegerField()
    chain_hash = models.CharField(max_length=64)
    # The hash's MAC under the audit key (docs/audit.md), as a confirmation event's.
    chain_mac = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "chain_seq"], name="policy_event_chain_place"),
        ]

    def __str__(self) -> str:
        return f"{self.chain} {self.kind} by {self.actor_label}"
