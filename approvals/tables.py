"""The confirmations' tables (django-tables2): one row a held call, sortable, paginated, which
the approvals' history and the records' confirmations list with, each naming its columns; and
the queue's compact list, one row a call waiting for a decision."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import django_tables2 as tables
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from approvals.models import ConfirmationEvent
from approvals.selectors import ReviewItem, deciders, effective_status
from approvals.templatetags.review import moment, status_pill
from dispatch.models import Confirmation
from dispatch.money import money
from dispatch.registry import tool_registry

ID = {"td": {"class": "id"}}
NUM = {"td": {"class": "num"}, "th": {"class": "num"}}
# Characters of a reason shown in a row.
REASON_SHOWN = 60
# Characters of a long id shown in a row; the whole id is on hover and on its page.
ID_SHOWN = 10


def confirmation_subject(confirmation: Confirmation) -> str:
    spec = tool_registry.get(confirmation.tool)
    if spec is None or spec.subject_field is None:
        return ""
    return str(confirmation.arguments.get(spec.subject_field, ""))


def when(value: datetime | None) -> SafeString | str:
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


def _reviewer_detail_url(confirmation_id: str) -> str:
    return reverse("approvals:detail", args=[confirmation_id])


# django-tables2 ships no types.
class ConfirmationTable(tables.Table):  # type: ignore[misc]
    """Every column a page may list of a held call. A page names the ones it shows, in order
    (`columns`), where a held call's id and its "Details" lead (`detail_url`: the reviewer's
    page of it unless told), and where a customer's id leads (`customer_url`; plain text if
    none)."""

    created_at = tables.Column(verbose_name="Held")
    closed_at = tables.DateTimeColumn(
        verbose_name="Decided", format="j M Y, H:i", order_by=("closed_at", "created_at")
    )
    amount_cents = tables.Column(verbose_name="Amount", attrs=NUM)
    subject = tables.Column(verbose_name="For", empty_values=(), orderable=False)
    customer_id = tables.Column(verbose_name="Customer", attrs=ID)
    agent = tables.Column(verbose_name="Agent", order_by=("agent__name",), attrs=ID)
    status = tables.Column(verbose_name="Status")
    reviewers = tables.Column(verbose_name="Reviewers", empty_values=(), orderable=False)
    why = tables.Column(
        verbose_name="Reason", empty_values=(), orderable=False, attrs={"td": {"class": "why"}}
    )
    id = tables.Column(verbose_name="Confirmation", attrs=ID)
    link = tables.Column(
        verbose_name=format_html('<span class="sr-only">{}</span>', "Details"),
        empty_values=(),
        orderable=False,
    )

    class Meta:
        model = Confirmation
        fields = ("created_at", "closed_at", "amount_cents", "customer_id", "agent", "status", "id")
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped history"}

    def __init__(
        self,
        data: QuerySet[Confirmation],
        *args: Any,
        columns: Sequence[str],
        detail_url: Callable[[str], str] | None = None,
        customer_url: Callable[[str], str] | None = None,
        **kwargs: Any,
    ) -> None:
        events = Prefetch("events", queryset=ConfirmationEvent.objects.order_by("at", "id"))
        shown = set(columns)
        left_out = [name for name in self.base_columns if name not in shown]
        super().__init__(
            data.prefetch_related(events),
            *args,
            sequence=columns,
            exclude=left_out,
            **kwargs,
        )
        self.detail_url = detail_url or _reviewer_detail_url
        self.customer_url = customer_url

    def render_created_at(self, value: datetime | None) -> SafeString | str:
        return when(value)

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

    def render_customer_id(self, value: str) -> SafeString | str:
        if self.customer_url is None:
            return value
        url = self.customer_url(value)
        return format_html('<a href="{}" title="Held calls of {}">{}</a>', url, value, value)

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

    def render_id(self, value: str) -> SafeString:
        return format_html('<a href="{}">{}</a>', self.detail_url(value), short_id(value))

    def render_link(self, record: Confirmation) -> str:
        return format_html(
            '<a href="{}" aria-label="Details of {}">Details</a>',
            self.detail_url(record.pk),
            record.pk,
        )


def _triage_row_id(record: ReviewItem) -> str:
    return f"row-{record.id}"


class TriageTable(tables.Table):  # type: ignore[misc]
    """The queue as a compact list: one row a held call, as it waits (amount, what, customer, why
    it was held, when it expires, the approvals so far), the soonest to expire first. Each row
    is an item of the queue's keys; choosing it opens its card, where everything a decision
    needs is. A row approves directly only what one click settles as the card would: a call
    that asks for a reviewer's word (a possible duplicate) or a second look opens its card."""

    amount = tables.Column(
        verbose_name="Amount",
        empty_values=(),
        attrs={"td": {"class": "num amount"}, "th": {"class": "num"}},
    )
    what = tables.Column(verbose_name="What", empty_values=(), attrs={"td": {"class": "what"}})
    customer = tables.Column(
        verbose_name="Customer", empty_values=(), attrs={"td": {"class": "id customer"}}
    )
    why = tables.Column(verbose_name="Why held", empty_values=(), attrs={"td": {"class": "why"}})
    expires = tables.Column(
        verbose_name="Expires", empty_values=(), attrs={"td": {"class": "expires"}}
    )
    votes = tables.Column(
        verbose_name="Approvals", empty_values=(), attrs={"td": {"class": "votes"}}
    )
    decide = tables.Column(
        verbose_name=format_html('<span class="sr-only">{}</span>', "Decide"),
        empty_values=(),
        attrs={"td": {"class": "decide"}},
    )

    class Meta:
        orderable = False
        empty_text = ""
        attrs = {"class": "triage"}
        row_attrs = {
            "class": lambda record: "item soon" if record.expiring_soon else "item",
            "id": _triage_row_id,
            "tabindex": "-1",
        }

    def __init__(self, data: Sequence[ReviewItem], *, next_url: str, csrf_token: str) -> None:
        super().__init__(data)
        self.next_url = next_url
        self.csrf_token = csrf_token

    def render_amount(self, record: ReviewItem) -> str:
        return record.amount or "—"

    def render_what(self, record: ReviewItem) -> SafeString:
        return format_html(
            '<a class="detail-link" href="{}">{}{}</a>',
            _reviewer_detail_url(record.id),
            record.tool_label,
            format_html(' · <span class="id">{}</span>', record.subject) if record.subject else "",
        )

    def render_customer(self, record: ReviewItem) -> str:
        return record.confirmation.customer_id

    def render_why(self, record: ReviewItem) -> SafeString | str:
        flags = []
        if record.duplicate is not None and record.duplicate.needs_word:
            flags.append(format_html('<span class="flag">{}</span> ', "Possible duplicate"))
        summary = record.hold.summary if record.hold is not None else ""
        return format_html(
            '{}<span title="{}">{}</span>', SafeString("".join(flags)), summary, summary or "—"
        )

    def render_expires(self, record: ReviewItem) -> SafeString | str:
        return moment(record.confirmation.expires_at)

    def render_votes(self, record: ReviewItem) -> str:
        approvals = record.approvals
        return f"{len(approvals.voters)} of {approvals.required}"

    def render_decide(self, record: ReviewItem) -> SafeString:
        card = _reviewer_detail_url(record.id)
        asks_more = (record.duplicate is not None and record.duplicate.needs_word) or (
            record.second_look is not None
        )
        yours = record.approvals.yours
        if yours == "voted":
            return format_html('<span class="muted">You approved</span>')
        if asks_more:
            return format_html(
                '<a href="{}" class="open" title="It asks more than a click: decide on its card">'
                "Open…</a>",
                card,
            )
        label = "Vote" if yours == "votes" else "Approve"
        return format_html(
            '<form class="approve" method="post" action="{}">'
            '<input type="hidden" name="csrfmiddlewaretoken" value="{}">'
            '<input type="hidden" name="next" value="{}">'
            '<button type="submit" aria-label="{} {}" title="{}">{}</button></form>'
            '<a class="reject-link" href="{}?reject=1" aria-label="Reject {}">Reject…</a>',
            reverse("approvals:approve", args=[record.id]),
            self.csrf_token,
            self.next_url,
            label,
            record.title,
            "Your approval counts as a vote; another reviewer's is needed too"
            if yours == "votes"
            else "Your approval executes it",
            label,
            card,
            record.title,
        )
