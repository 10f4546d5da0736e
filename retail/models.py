"""The retail desk's system of record: users with their addresses and payment methods, products
and their variants, orders with their items, fulfilments and payment history.

Loaded from τ²-bench's retail database (`manage.py load_retail`, docs/retail.md). Every amount is
an integer number of US cents: the data's dollars with cents (47.84) are held as 4784 and given
back as the very same values.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class PaymentSource(models.TextChoices):
    GIFT_CARD = "gift_card", "Gift card"
    PAYPAL = "paypal", "PayPal"
    CREDIT_CARD = "credit_card", "Credit card"


class TransactionType(models.TextChoices):
    PAYMENT = "payment", "Payment"
    REFUND = "refund", "Refund"


class RetailUser(models.Model):
    user_id = models.CharField(max_length=64, unique=True)
    first_name = models.CharField(max_length=100)
    last_name = models.CharField(max_length=100)
    email = models.CharField(max_length=254, db_index=True)
    # The default address.
    address1 = models.CharField(max_length=200)
    address2 = models.CharField(max_length=200, blank=True)
    city = models.CharField(max_length=100)
    state = models.CharField(max_length=100)
    country = models.CharField(max_length=100)
    zip = models.CharField(max_length=20, db_index=True)

    class Meta:
        verbose_name = "retail user"

    def __str__(self) -> str:
        return self.user_id


class PaymentMethod(models.Model):
    user = models.ForeignKey(RetailUser, on_delete=models.CASCADE, related_name="payment_methods")
    payment_method_id = models.CharField(max_length=64)
    source = models.CharField(max_length=16, choices=PaymentSource.choices)
    # A credit card's.
    brand = models.CharField(max_length=32, blank=True)
    last_four = models.CharField(max_length=4, blank=True)
    # A gift card's, in cents; None for the others.
    balance_cents = models.BigIntegerField(null=True, blank=True)
    # Its place in the user's profile, as the data lists them.
    position = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "payment_method_id"], name="retail_payment_method_once_per_user"
            ),
            models.CheckConstraint(
                condition=Q(balance_cents__isnull=True) | Q(balance_cents__gte=0),
                name="retail_gift_card_balance_not_negative",
            ),
        ]
        ordering = ["user", "position"]

    def __str__(self) -> str:
        return self.payment_method_id


class Product(models.Model):
    product_id = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["position"]

    def __str__(self) -> str:
        return f"{self.name} ({self.product_id})"


class Variant(models.Model):
    """One item of a product with its options: the id an order's item and a change name."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="variants")
    item_id = models.CharField(max_length=32, unique=True)
    options = models.JSONField()
    available = models.BooleanField()
    price_cents = models.PositiveBigIntegerField()
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["product", "position"]

    def __str__(self) -> str:
        return self.item_id


class OrderStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    # Its items were modified once: nothing more may be changed or cancelled.
    PENDING_ITEM_MODIFIED = "pending (item modified)", "Pending (items modified)"
    PROCESSED = "processed", "Processed"
    DELIVERED = "delivered", "Delivered"
    CANCELLED = "cancelled", "Cancelled"
    RETURN_REQUESTED = "return requested", "Return requested"
    EXCHANGE_REQUESTED = "exchange requested", "Exchange requested"


class RetailOrder(models.Model):
    order_id = models.CharField(max_length=32, unique=True)
    user = models.ForeignKey(RetailUser, on_delete=models.CASCADE, related_name="orders")
    # Its place in the user's list of orders, as the data lists them.
    user_position = models.PositiveIntegerField()
    address1 = models.CharField(max_length=200)
    address2 = models.CharField(max_length=200, blank=True)
    city = models.CharField(max_length=100)
    state = models.CharField(max_length=100)
    country = models.CharField(max_length=100)
    zip = models.CharField(max_length=20)
    status = models.CharField(max_length=32, choices=OrderStatus.choices)
    # [{"tracking_id": [...], "item_ids": [...]}], as the carrier reported them.
    fulfillments = models.JSONField(default=list)
    cancel_reason = models.CharField(max_length=64, blank=True, default="")
    exchange_items = models.JSONField(null=True, blank=True)
    exchange_new_items = models.JSONField(null=True, blank=True)
    exchange_payment_method_id = models.CharField(max_length=64, blank=True, default="")
    exchange_price_difference_cents = models.BigIntegerField(null=True, blank=True)
    return_items = models.JSONField(null=True, blank=True)
    # The text fields above are "" until an action sets them (the data has no such key then).
    return_payment_method_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        verbose_name = "retail order"

    def __str__(self) -> str:
        return self.order_id


class OrderItem(models.Model):
    order = models.ForeignKey(RetailOrder, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    product_id = models.CharField(max_length=32)
    item_id = models.CharField(max_length=32)
    price_cents = models.PositiveBigIntegerField()
    options = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "position"], name="retail_item_position")
        ]
        ordering = ["order", "position"]

    def __str__(self) -> str:
        return f"{self.name} {self.item_id}"


class Payment(models.Model):
    """One line of an order's payment history: a payment or a refund, to a method by its id."""

    order = models.ForeignKey(RetailOrder, on_delete=models.CASCADE, related_name="payments")
    position = models.PositiveIntegerField()
    transaction_type = models.CharField(max_length=16, choices=TransactionType.choices)
    amount_cents = models.BigIntegerField()
    payment_method_id = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["order", "position"], name="retail_payment_position"),
            models.CheckConstraint(
                condition=Q(amount_cents__gte=0), name="retail_payment_amount_not_negative"
            ),
        ]
        ordering = ["order", "position"]

    def __str__(self) -> str:
        return f"{self.transaction_type} {self.amount_cents} {self.payment_method_id}"


class Operation(models.Model):
    """What a write did under its idempotency key: a repeated key gets this answer back and
    changes nothing again; an execution whose answer was lost is reconciled from it."""

    idempotency_key = models.CharField(max_length=128, unique=True)
    tool = models.CharField(max_length=64)
    subject = models.CharField(max_length=64)
    result = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    # The transaction that recorded it, set by the database on PostgreSQL whatever the insert
    # says: balances, payments and items change only in a transaction that recorded one
    # (dispatch/store/guards.py).
    transaction_id = models.BigIntegerField(null=True, blank=True, editable=False, db_index=True)

    def __str__(self) -> str:
        return f"{self.tool} {self.subject}"
