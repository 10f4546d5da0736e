"""Confirmations: high-risk calls that passed every check and wait for a human."""

from __future__ import annotations

from django.db import models


class ConfirmationStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    EXECUTED = "executed"
    FAILED = "failed"


class Confirmation(models.Model):
    """The exact validated arguments a human is asked about, and everything they were judged by."""

    id = models.CharField(max_length=32, primary_key=True)
    key = models.CharField(max_length=64, db_index=True)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField()
    arguments_hash = models.CharField(max_length=64)
    agent = models.ForeignKey(
        "dispatch.Agent", on_delete=models.PROTECT, related_name="confirmations"
    )
    session_id = models.CharField(max_length=128)
    customer_id = models.CharField(max_length=64)
    policy_version = models.PositiveIntegerField()
    reviewers_required = models.PositiveSmallIntegerField(default=1)
    amount_cents = models.PositiveBigIntegerField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=ConfirmationStatus.choices, default=ConfirmationStatus.PENDING
    )
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["status", "expires_at"], name="confirmation_queue_idx")]

    def __str__(self) -> str:
        return f"{self.tool} {self.id} ({self.status})"
