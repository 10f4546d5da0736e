from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
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


# What the ledger's rows refer to: fixed once an order has a refund.
_FIXED_ONCE_REFUNDED = ("customer_id", "total_cents")


class OrderForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Order
        fields = ("order_id", "customer_id", "total_cents", "currency")

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        if self.instance.pk is None:
            return cleaned
        # The form was built from the order as it was read; a refund may have landed since. The
        # lock (the admin's save is one transaction) keeps one from landing before the save.
        current = Order.objects.select_for_update().filter(pk=self.instance.pk).first()
        if current is None or current.refunded_cents == 0:
            return cleaned
        total = cleaned.get("total_cents")
        if total is not None and total < current.refunded_cents:
            self.add_error(
                "total_cents",
                f"{current.refunded_cents} is already refunded; the total cannot be less, and it "
                "cannot change at all once the order has a refund.",
            )
        for name in _FIXED_ONCE_REFUNDED:
            changed = name in cleaned and cleaned[name] != getattr(current, name)
            if changed and name not in self.errors:
                self.add_error(name, "This order has a refund now, so this cannot change.")
        return cleaned


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = OrderForm
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
        fixed = ("order_id", "currency", "refunded_cents", "created_at")
        # By the ledger's invariant an order has refunds exactly when refunded_cents is not 0.
        if obj.refunded_cents:
            return (*fixed, *_FIXED_ONCE_REFUNDED)
        return fixed

    def save_model(self, request: HttpRequest, obj: Order, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Only what the form changed: refunded_cents as it was read must never be written back
        # over a refund that landed meanwhile.
        fields = [name for name in form.changed_data if name in form.fields]
        if fields:
            obj.save(update_fields=fields)


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
    """Shown only where the gateway reads the switch (TOOLGATE_GATEWAY_FAULTS): elsewhere,
    production above all, it would look like a control and do nothing."""

    list_display = ("__str__", "fail_before_commit", "lose_response_after_commit", "updated_at")
    readonly_fields = ("updated_at",)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return settings.TOOLGATE_GATEWAY_FAULTS and super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: GatewayFault | None = None) -> bool:
        return settings.TOOLGATE_GATEWAY_FAULTS and super().has_view_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: GatewayFault | None = None) -> bool:
        return settings.TOOLGATE_GATEWAY_FAULTS and super().has_change_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return (
            settings.TOOLGATE_GATEWAY_FAULTS
            and super().has_add_permission(request)
            and not GatewayFault.objects.exists()
        )

    def has_delete_permission(self, request: HttpRequest, obj: GatewayFault | None = None) -> bool:
        return False
