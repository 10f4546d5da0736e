"""The records' filters, read from the query string: the URL is the state."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from django.utils import timezone
from django_filters.widgets import DateRangeWidget

from dispatch.models import Agent, Confirmation, ConfirmationStatus, SecurityEvent
from dispatch.registry import tool_registry
from orders.models import Currency, Order

DATE_RANGE = DateRangeWidget(attrs={"type": "date"})


class ConfirmationFilter(django_filters.FilterSet):
    """Every state, a pending one past its expiry counted as expired (as the history does)."""

    status = django_filters.ChoiceFilter(
        choices=ConfirmationStatus.choices, method="filter_status", empty_label="Any status"
    )
    agent = django_filters.ModelChoiceFilter(
        queryset=Agent.objects.order_by("name"), empty_label="Any agent"
    )
    tool = django_filters.ChoiceFilter(choices=(), empty_label="Any tool")
    customer = django_filters.CharFilter(field_name="customer_id", label="Customer")
    created = django_filters.DateFromToRangeFilter(
        field_name="created_at", label="Held between", widget=DATE_RANGE
    )

    class Meta:
        model = Confirmation
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters["tool"].extra["choices"] = [
            (spec.name, spec.title) for spec in sorted(tool_registry, key=lambda s: s.name)
        ]

    def filter_status(
        self, queryset: QuerySet[Confirmation], name: str, value: Any
    ) -> QuerySet[Confirmation]:
        now = timezone.now()
        if value == ConfirmationStatus.EXPIRED:
            past = Q(status=ConfirmationStatus.PENDING, expires_at__lte=now)
            return queryset.filter(Q(status=value) | past)
        if value == ConfirmationStatus.PENDING:
            return queryset.filter(status=value, expires_at__gt=now)
        return queryset.filter(status=value)


class SecurityEventFilter(django_filters.FilterSet):
    reason = django_filters.CharFilter(label="Reason")
    status = django_filters.NumberFilter(label="Status")
    agent = django_filters.ModelChoiceFilter(
        queryset=Agent.objects.order_by("name"), empty_label="Any agent"
    )
    address = django_filters.CharFilter(field_name="client_address", label="Address")
    at = django_filters.DateFromToRangeFilter(label="Between", widget=DATE_RANGE)

    class Meta:
        model = SecurityEvent
        fields: list[str] = []


class OrderFilter(django_filters.FilterSet):
    order = django_filters.CharFilter(field_name="order_id", lookup_expr="icontains", label="Order")
    customer = django_filters.CharFilter(field_name="customer_id", label="Customer")
    currency = django_filters.ChoiceFilter(choices=Currency.choices, empty_label="Any currency")
    refunded = django_filters.ChoiceFilter(
        choices=[("yes", "With refunds"), ("no", "Without refunds")],
        method="filter_refunded",
        empty_label="With or without refunds",
        label="Refunds",
    )

    class Meta:
        model = Order
        fields: list[str] = []

    def filter_refunded(self, queryset: QuerySet[Order], name: str, value: Any) -> QuerySet[Order]:
        if value == "yes":
            return queryset.filter(refunded_cents__gt=0)
        return queryset.filter(refunded_cents=0)
