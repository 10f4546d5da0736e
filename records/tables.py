"""The records' tables (django-tables2): one row a record, sortable, paginated; amounts in their
currency's own format, ids that never wrap, and the detail one click away."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import django_tables2 as tables
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from approvals.models import ConfirmationEvent
from approvals.selectors import deciders, effective_status
from approvals.tables import confirmation_subject
from approvals.templatetags.review import status_pill
from dispatch.models import Confirmation, SecurityEvent
from dispatch.money import money
from dispatch.registry import tool_registry
from orders.models import Order

ID = {"td": {"class": "id"}}
NUM = {"td": {"class": "num"}, "th": {"class": "num"}}


def filtered_url(name: str, **params: str) -> str:
    """A list's URL with its filters in the query string."""
    return reverse(name) + "?" + urlencode(params)


# Characters of a long id shown in a row; the whole id is on hover and on its page.
ID_SHOWN = 10


def _when(value: datetime | None) -> SafeString | str:
    """The local date and time, short (4 Dec 14:02), with the exact one on hover."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    exact = local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or "")
    short = f"{local.day} {local:%b %H:%M}"
    if local.year != timezone.localtime().year:
        short = f"{local.day} {local:%b %Y %H:%M}"
    return format_html('<time datetime="{}" title="{}">{}</time>', value.isoformat(), exact, short)


def short_id(value: str) -> SafeString:
    shown = value if len(value) <= ID_SHOWN else value[:ID_SHOWN] + "…"
    return format_html('<code title="{}">{}</code>', value, shown)


# django-tables2 ships no types.
class ConfirmationTable(tables.Table):  # type: ignore[misc]
    created_at = tables.Column(verbose_name="Held")
    amount_cents = tables.Column(verbose_name="Amount", attrs=NUM)
    subject = tables.Column(verbose_name="For", empty_values=(), orderable=False)
    customer_id = tables.Column(verbose_name="Customer", attrs=ID)
    agent = tables.Column(verbose_name="Agent", order_by=("agent__name",), attrs=ID)
    status = tables.Column(verbose_name="Status")
    reviewers = tables.Column(verbose_name="Reviewers", empty_values=(), orderable=False)
    id = tables.Column(verbose_name="Confirmation", attrs=ID)

    class Meta:
        model = Confirmation
        fields = ("created_at", "amount_cents", "customer_id", "agent", "status", "id")
        sequence = (
            "created_at",
            "amount_cents",
            "subject",
            "customer_id",
            "agent",
            "status",
            "reviewers",
            "id",
        )
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped records"}

    def __init__(self, data: QuerySet[Confirmation], *args: Any, **kwargs: Any) -> None:
        events = Prefetch("events", queryset=ConfirmationEvent.objects.order_by("at", "id"))
        super().__init__(data.prefetch_related(events), *args, **kwargs)

    def render_created_at(self, value: Any) -> SafeString | str:
        return _when(value)

    def render_amount_cents(self, value: int, record: Confirmation) -> str:
        return money(value, record.currency)

    def render_subject(self, record: Confirmation) -> str:
        spec = tool_registry.get(record.tool)
        action = spec.title if spec is not None else record.tool
        subject = confirmation_subject(record)
        if not subject:
            return action
        return format_html('{} · <span class="id">{}</span>', action, subject)

    def render_customer_id(self, value: str) -> SafeString:
        url = filtered_url("records:confirmations", customer=value)
        return format_html('<a href="{}" title="Held calls of {}">{}</a>', url, value, value)

    def render_status(self, record: Confirmation) -> str:
        return status_pill(effective_status(record))

    def render_reviewers(self, record: Confirmation) -> str:
        return ", ".join(deciders(record.events.all())) or "—"

    def render_id(self, value: str) -> SafeString:
        url = reverse("records:confirmation", args=[value])
        return format_html('<a href="{}">{}</a>', url, short_id(value))


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
        return _when(value)

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
        return _when(value)

    def render_total_cents(self, value: int, record: Order) -> str:
        return money(value, record.currency)

    def render_refunded_cents(self, value: int, record: Order) -> str:
        return money(value, record.currency) if value else "—"

    def render_remaining(self, record: Order) -> str:
        return money(record.total_cents - record.refunded_cents, record.currency)
