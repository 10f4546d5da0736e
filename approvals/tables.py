"""The history's table: one row a confirmation, sortable, paginated (django-tables2)."""

from __future__ import annotations

from typing import Any

import django_tables2 as tables
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from django.utils.html import format_html

from approvals.models import ConfirmationEvent
from approvals.selectors import deciders, effective_status
from approvals.templatetags.review import status_pill
from dispatch.models import Confirmation
from dispatch.money import money
from dispatch.registry import tool_registry

# Characters of a reason shown in a row.
REASON_SHOWN = 60


def confirmation_subject(confirmation: Confirmation) -> str:
    spec = tool_registry.get(confirmation.tool)
    if spec is None or spec.subject_field is None:
        return ""
    return str(confirmation.arguments.get(spec.subject_field, ""))


# django-tables2 ships no types.
class HistoryTable(tables.Table):  # type: ignore[misc]
    closed_at = tables.DateTimeColumn(
        verbose_name="Decided", format="j M Y, H:i", order_by=("closed_at", "created_at")
    )
    amount_cents = tables.Column(verbose_name="Amount", attrs={"td": {"class": "num"}})
    subject = tables.Column(verbose_name="For", empty_values=(), orderable=False)
    customer_id = tables.Column(verbose_name="Customer", attrs={"td": {"class": "id"}})
    agent = tables.Column(verbose_name="Agent", order_by=("agent__name",))
    status = tables.Column(verbose_name="Status")
    reviewers = tables.Column(verbose_name="Reviewers", empty_values=(), orderable=False)
    why = tables.Column(
        verbose_name="Reason", empty_values=(), orderable=False, attrs={"td": {"class": "why"}}
    )
    link = tables.Column(
        verbose_name=format_html('<span class="sr-only">{}</span>', "Details"),
        empty_values=(),
        orderable=False,
    )

    class Meta:
        model = Confirmation
        fields = ("closed_at", "amount_cents", "subject", "customer_id", "agent", "status")
        sequence = (
            "closed_at",
            "amount_cents",
            "subject",
            "customer_id",
            "agent",
            "status",
            "reviewers",
            "why",
            "link",
        )
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped history"}

    def __init__(self, data: QuerySet[Confirmation], *args: Any, **kwargs: Any) -> None:
        events = Prefetch("events", queryset=ConfirmationEvent.objects.order_by("at", "id"))
        super().__init__(data.prefetch_related(events), *args, **kwargs)

    def render_amount_cents(self, value: int, record: Confirmation) -> str:
        return money(value, record.currency)

    def render_subject(self, record: Confirmation) -> str:
        """What was held, as the queue's card names it: the action, and what it is for (an id,
        which never breaks inside)."""
        spec = tool_registry.get(record.tool)
        action = spec.title if spec is not None else record.tool
        subject = confirmation_subject(record)
        if not subject:
            return action
        return format_html('{} · <span class="id">{}</span>', action, subject)

    def render_status(self, record: Confirmation) -> str:
        return status_pill(effective_status(record))

    def render_reviewers(self, record: Confirmation) -> str:
        return ", ".join(deciders(record.events.all())) or "—"

    def render_why(self, record: Confirmation) -> str:
        """The rejection's reason, or why nothing executed; a long one is cut, whole on hover."""
        reason = record.decision_reason
        if not reason and isinstance(record.result, dict) and not record.result.get("ok", True):
            reason = str(record.result.get("message", ""))
        if not reason:
            return "—"
        if len(reason) <= REASON_SHOWN:
            return reason
        return format_html('<span title="{}">{}…</span>', reason, reason[:REASON_SHOWN].rstrip())

    def render_link(self, record: Confirmation) -> str:
        return format_html(
            '<a href="{}" aria-label="Details of {}">Details</a>',
            reverse("approvals:detail", args=[record.pk]),
            record.pk,
        )
