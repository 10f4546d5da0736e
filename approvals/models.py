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
