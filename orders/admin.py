from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from orders.models import GatewayFault, Order, Refund

# django-stubs makes the admin classes generic, but at runtime they cannot be subscripted.

_REFUND_FIELDS = (
    "idempotency_key",
    "amount_cents",
    "currency",
    "reason",
    "approval",
    "approved_by",
    "refunded_cents_after",
    "created_at",
)


class RefundInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Refund
    fields = _REFUND_FIELDS
    readonly_fields = _REFUND_FIELDS
    extra = 0
    can_delete = False
    ordering = ("pk",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "order_id",
        "customer_id",
        "total_cents",
        "currency",
        "refunded_cents",
        "created_at",
    )
    search_fields = ("order_id", "customer_id")
    list_filter = ("currency",)
    ordering = ("-created_at",)
    inlines = (RefundInline,)

    def get_readonly_fields(
        self, request: HttpRequest, obj: Order | None = None
    ) -> tuple[str, ...]:
        # Money moves only through the gateway; an order's identity and currency are fixed once
        # refunds may refer to them.
        if obj is None:
            return ("refunded_cents",)
        return ("order_id", "currency", "refunded_cents", "created_at")


@admin.register(Refund)
class RefundAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The ledger is append-only: the admin shows it and never writes to it."""

    list_display = (
        "__str__",
        "order",
        "amount_cents",
        "currency",
        "reason",
        "approval",
        "approved_by",
        "created_at",
    )
    list_select_related = ("order",)
    search_fields = ("order__order_id", "order__customer_id", "idempotency_key", "approved_by")
    list_filter = ("approval", "currency", "reason")
    ordering = ("-created_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Refund | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Refund | None = None) -> bool:
        return False


@admin.register(GatewayFault)
class GatewayFaultAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("__str__", "fail_before_commit", "lose_response_after_commit", "updated_at")
    readonly_fields = ("updated_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not GatewayFault.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: GatewayFault | None = None) -> bool:
        return False
