"""The system of record: orders, the refund ledger, and the gateway's fault switch.

Invariant, enforced by the gateway's conditional update and backed by the check constraints:
the sum of an order's refunds == its refunded_cents <= its total_cents.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q

from orders.tools import ORDER_ID_PATTERN


class Currency(models.TextChoices):
    """ISO 4217 codes; amounts are in each one's own minor units (its exponent: BRL, USD and EUR
    2, JPY 0, KWD 3)."""

    BRL = "BRL", "BRL"
    USD = "USD", "USD"
    EUR = "EUR", "EUR"
    JPY = "JPY", "JPY"
    KWD = "KWD", "KWD"


class RefundReason(models.TextChoices):
    """Every version's reasons: refund_order's three, then those refund_order_v2 added."""

    DAMAGED = "damaged", "Damaged"
    NOT_DELIVERED = "not_delivered", "Not delivered"
    CUSTOMER_REQUEST = "customer_request", "Customer request"
    WRONG_ITEM = "wrong_item", "Wrong item"
    RETURNED = "returned", "Returned"
    GOODWILL = "goodwill", "Goodwill"


class RefundApproval(models.TextChoices):
    POLICY = "policy", "Policy"
    REVIEWER = "reviewer", "Reviewer"


class Order(models.Model):
    order_id = models.CharField(
        max_length=16,
        unique=True,
        validators=[
            RegexValidator(ORDER_ID_PATTERN, "ORD- followed by 1 to 12 ASCII digits, e.g. ORD-1001")
        ],
    )
    customer_id = models.CharField(max_length=32, db_index=True)
    total_cents = models.PositiveBigIntegerField(help_text="in minor units: 25.90 is 2590")
    currency = models.CharField(max_length=3, choices=Currency.choices)
    refunded_cents = models.BigIntegerField(
        default=0, help_text="changed only by the refund gateway, with a ledger row"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(total_cents__gt=0), name="orders_order_total_cents_positive"
            ),
            models.CheckConstraint(
                condition=Q(refunded_cents__gte=0) & Q(refunded_cents__lte=F("total_cents")),
                name="orders_order_refunded_cents_within_total",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.order_id} ({self.customer_id})"


class Refund(models.Model):
    """One refund that took effect. Append-only: nothing updates or deletes a row."""

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="refunds")
    idempotency_key = models.CharField(max_length=128, unique=True)
    amount_cents = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, choices=Currency.choices)
    reason = models.CharField(max_length=32, choices=RefundReason.choices)
    # Who let the money move: the agent's policy, with no human, or reviewers, named in approved_by.
    approval = models.CharField(max_length=16, choices=RefundApproval.choices)
    approved_by = models.CharField(max_length=200, blank=True)
    # Kept so that a replayed receipt is identical to the first, whatever happened since.
    refunded_cents_after = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(amount_cents__gt=0), name="orders_refund_amount_cents_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"RF-{self.pk}: {self.amount_cents} {self.currency}"


class GatewayFault(models.Model):
    """Failures the refund gateway injects on purpose, each consumed by one refund attempt.

    A single row (pk=1) in the database rather than process memory, so that tests, the demo and
    every web process and worker see the same switch.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    fail_before_commit = models.PositiveIntegerField(
        default=0, help_text="next refunds to fail with a transient error, writing nothing"
    )
    lose_response_after_commit = models.PositiveIntegerField(
        default=0, help_text="next refunds to take effect and then lose their response"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="orders_gatewayfault_singleton"),
        ]

    def __str__(self) -> str:
        return (
            f"gateway faults: fail before commit {self.fail_before_commit}, "
            f"lose response after commit {self.lose_response_after_commit}"
        )
