"""The records' tables (django-tables2): one row a record, sortable, paginated; amounts in their
currency's own format, ids that never wrap, and the detail one click away. The confirmations are
listed with the approvals' table (approvals.tables.ConfirmationTable), as the history is."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from approvals.tables import ID, NUM, when
from dispatch.models import SecurityEvent
from dispatch.money import money
from orders.models import Order


def filtered_url(name: str, **params: str) -> str:
    """A list's URL with its filters in the query string."""
    return reverse(name) + "?" + urlencode(params)


# django-tables2 ships no types.
class SecurityEventTable(tables.Table):  # type: ignore[misc]
    at = tables.Column(verbose_name="When")
    status = tables.Column(verbose_name="Status", attrs=NUM)
    reason = tables.Column(verbose_name="Reason", attrs=ID)
    agent = tables.Column(verbose_name="Agent", order_by=("agent__name",), default="—", attrs=ID)
    client_address = tables.Column(verbose_name="Address", attrs=ID, default="—")
    request = tables.Column(verbose_name="Request", empty_values=(), orderable=False)
    detail = tables.Column(verbose_name="Detail", attrs={"td": {"class": "why"}}, default="—")
    channel = tables.Column(verbose_name="Channel")

    class Meta:
        model = SecurityEvent
        fields = ("at", "status", "reason", "agent", "client_address", "detail", "channel")
        sequence = (
            "at",
            "status",
            "reason",
            "agent",
            "client_address",
            "request",
            "detail",
            "channel",
        )
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped records"}

    def render_at(self, value: Any) -> SafeString | str:
        return when(value)

    def render_reason(self, value: str) -> SafeString:
        url = filtered_url("records:security", reason=value)
        return format_html('<a href="{}"><code>{}</code></a>', url, value)

    def render_client_address(self, value: str) -> SafeString:
        url = filtered_url("records:security", address=value)
        return format_html('<a href="{}">{}</a>', url, value)

    def render_request(self, record: SecurityEvent) -> SafeString:
        return format_html("<code>{} {}</code>", record.method, record.path)


class OrderTable(tables.Table):  # type: ignore[misc]
    order_id = tables.Column(verbose_name="Order", attrs=ID)
    customer_id = tables.Column(verbose_name="Customer", attrs=ID)
    created_at = tables.Column(verbose_name="Placed")
    total_cents = tables.Column(verbose_name="Total", attrs=NUM)
    refunded_cents = tables.Column(verbose_name="Refunded", attrs=NUM)
    refund_count = tables.Column(verbose_name="Refunds", attrs=NUM)
    remaining = tables.Column(
        verbose_name="Refundable", attrs=NUM, empty_values=(), orderable=False
    )

    class Meta:
        model = Order
        fields = ("order_id", "customer_id", "created_at", "total_cents", "refunded_cents")
        sequence = (
            "order_id",
            "customer_id",
            "created_at",
            "total_cents",
            "refunded_cents",
            "refund_count",
            "remaining",
        )
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped records"}

    def render_order_id(self, value: str) -> SafeString:
        return format_html('<a href="{}">{}</a>', reverse("records:order", args=[value]), value)

    def render_customer_id(self, value: str) -> SafeString:
        url = filtered_url("records:orders", customer=value)
        return format_html('<a href="{}" title="Orders of {}">{}</a>', url, value, value)

    def render_created_at(self, value: Any) -> SafeString | str:
        return when(value)

    def render_total_cents(self, value: int, record: Order) -> str:
        return money(value, record.currency)

    def render_refunded_cents(self, value: int, record: Order) -> str:
        return money(value, record.currency) if value else "—"

    def render_remaining(self, record: Order) -> str:
        return money(record.total_cents - record.refunded_cents, record.currency)
