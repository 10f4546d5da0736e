"""The records that managers and support leads read, in the site's layout rather than the admin:
held calls in every state, the requests the agent API refused, and orders with their refunds.

Read-only: reviewers decide in their queue (approvals), administrators configure in the admin.
Every filter lives in the query string (records/filters.py), every list is a django-tables2 table
(records/tables.py), and each row links to what explains it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from django.apps import apps
from django.contrib.auth.models import User
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django_tables2 import RequestConfig

from analytics.permissions import is_manager, managers_and_reviewers, managers_only
from analytics.views import confirmation_url
from approvals.reviewers import is_reviewer
from approvals.selectors import confirmation_item, effective_status
from approvals.tables import ConfirmationTable, when
from dispatch.models import AuditRecord, Confirmation, Movement, SecurityEvent
from dispatch.money import money
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED
from dispatch.pipeline.review import Fact, FactKind, ReviewView
from orders.models import Order, Refund
from records.filters import ConfirmationFilter, OrderFilter, SecurityEventFilter
from records.tables import OrderTable, SecurityEventTable, filtered_url

PAGE_SIZE = 50
# The reasons counted above the security events' table.
REASONS_COUNTED = 12
# What the confirmations list of a held call: when it was held, and its own page.
CONFIRMATION_COLUMNS = (
    "created_at",
    "amount_cents",
    "subject",
    "customer_id",
    "agent",
    "status",
    "reviewers",
    "id",
)


def _filtered(request: HttpRequest) -> bool:
    return any(value for key, value in request.GET.items() if key not in ("page", "sort"))


# Confirmations ---------------------------------------------------------------------------------


@require_GET
@managers_only
def confirmations(request: HttpRequest) -> HttpResponse:
    held = Confirmation.objects.select_related("agent").order_by("-created_at", "-id")
    filters = ConfirmationFilter(request.GET, queryset=held)
    table = ConfirmationTable(
        filters.qs,
        columns=CONFIRMATION_COLUMNS,
        detail_url=lambda pk: reverse("records:confirmation", args=[pk]),
        customer_url=lambda customer: filtered_url("records:confirmations", customer=customer),
        order_by=request.GET.get("sort") or "-created_at",
        attrs={"class": "striped records"},
    )
    RequestConfig(request, paginate={"per_page": PAGE_SIZE}).configure(table)
    return render(
        request,
        "records/confirmations.html",
        {"filter": filters, "table": table, "filtered": _filtered(request)},
    )


@require_GET
@managers_and_reviewers
def confirmation(request: HttpRequest, confirmation_id: str) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)  # the decorator let only a signed-in user in
    item = confirmation_item(confirmation_id=confirmation_id, reader=user)
    if item is None:
        raise Http404("No such confirmation.")
    held = item.confirmation
    # The call that held it was recorded moments before it: the time bounds read the audit
    # trail by its index on `at`.
    call = (
        AuditRecord.objects.filter(
            at__gte=held.created_at - timedelta(hours=1),
            at__lte=held.created_at + timedelta(hours=1),
            confirmation_id=held.id,
            code=CONFIRMATION_REQUIRED.name,
            replayed=False,
        )
        .order_by("at", "id")
        .first()
    )
    order = Order.objects.filter(order_id=item.subject).first() if item.subject else None
    return render(
        request,
        "records/confirmation.html",
        {
            "item": item,
            "c": held,
            "call": call,
            "order": order,
            "customer_orders_url": filtered_url("records:orders", customer=held.customer_id),
            "customer_held_url": filtered_url("records:confirmations", customer=held.customer_id),
            "is_manager": is_manager(user),
            "is_reviewer": is_reviewer(user),
        },
    )


# Security events -------------------------------------------------------------------------------


@require_GET
@managers_only
def security_events(request: HttpRequest) -> HttpResponse:
    events = SecurityEvent.objects.select_related("agent").order_by("-at", "-id")
    filters = SecurityEventFilter(request.GET, queryset=events)
    found = filters.qs
    table = SecurityEventTable(found, order_by=request.GET.get("sort") or "-at")
    RequestConfig(request, paginate={"per_page": PAGE_SIZE}).configure(table)
    counts = [
        {
            **row,
            "url": filtered_url(
                "records:security",
                **{
                    **{key: value for key, value in request.GET.items() if key != "page"},
                    "reason": row["reason"],
                },
            ),
        }
        for row in found.order_by()
        .values("reason", "status")
        .annotate(events=Count("id"))
        .order_by("-events", "reason")[:REASONS_COUNTED]
    ]
    return render(
        request,
        "records/security.html",
        {
            "filter": filters,
            "table": table,
            "counts": counts,
            "filtered": _filtered(request),
        },
    )


# Orders and their refunds ----------------------------------------------------------------------


@runtime_checkable
class OrderDesk(Protocol):
    """An app whose domain keeps orders of its own and declares a customer's for this page (its
    AppConfig's `customer_orders`), each as a reviewer sees it: listed without naming the
    domain."""

    verbose_name: str

    def customer_orders(self, customer_id: str) -> Sequence[ReviewView]: ...


@dataclass(frozen=True)
class Cell:
    value: str
    money: bool = False


@dataclass(frozen=True)
class DeskOrders:
    """A desk's orders of one customer: a row an order, a column a fact its domain declares."""

    name: str
    # The facts' labels, each marked as money or not (an amount is set right, as a number is).
    labels: tuple[Cell, ...]
    rows: tuple[tuple[str, tuple[Cell, ...]], ...]


def _cell(fact: Fact | None, currency: str) -> Cell:
    if fact is None:
        return Cell("—")
    if fact.kind is FactKind.MONEY and isinstance(fact.value, int):
        return Cell(money(fact.value, currency), money=True)
    if fact.kind is FactKind.DATE:
        return Cell(when(datetime.fromisoformat(str(fact.value))))
    return Cell(str(fact.value))


def _desk_orders(customer_id: str, order_id: str, currency: str) -> list[DeskOrders]:
    """The customer's orders at each desk that declares them, under the page's filters of an
    order's id (any part) and currency."""
    desks: list[DeskOrders] = []
    for config in apps.get_app_configs():
        if not isinstance(config, OrderDesk):
            continue
        views = [
            view
            for view in config.customer_orders(customer_id)
            if view.found
            and order_id.lower() in view.subject.lower()
            and currency in ("", view.currency)
        ]
        kinds = {fact.label: fact.kind for view in views for fact in view.facts}
        rows = []
        for view in views:
            facts = {fact.label: fact for fact in view.facts}
            rows.append(
                (view.subject, tuple(_cell(facts.get(label), view.currency) for label in kinds))
            )
        labels = tuple(Cell(label, kind is FactKind.MONEY) for label, kind in kinds.items())
        if rows:
            desks.append(DeskOrders(str(config.verbose_name), labels, tuple(rows)))
    return desks


@require_GET
@managers_and_reviewers
def orders(request: HttpRequest) -> HttpResponse:
    placed = Order.objects.annotate(refund_count=Count("refunds")).order_by("-created_at", "-id")
    filters = OrderFilter(request.GET, queryset=placed)
    table = OrderTable(filters.qs, order_by=request.GET.get("sort") or "-created_at")
    RequestConfig(request, paginate={"per_page": PAGE_SIZE}).configure(table)
    customer = request.GET.get("customer", "").strip()
    # The desks' orders have no refunds of this page's kind: a filter by them leaves them out.
    listed = customer and not request.GET.get("refunded")
    order_id, currency = request.GET.get("order", "").strip(), request.GET.get("currency", "")
    return render(
        request,
        "records/orders.html",
        {
            "filter": filters,
            "table": table,
            "filtered": _filtered(request),
            "customer": customer,
            "desks": _desk_orders(customer, order_id, currency) if listed else [],
            "desk_names": [
                config.verbose_name
                for config in apps.get_app_configs()
                if isinstance(config, OrderDesk)
            ],
        },
    )


@dataclass(frozen=True)
class RefundRow:
    refund: Refund
    amount: str
    refunded_after: str
    # Who let it move: "policy", or the reviewers' names.
    approved_by: str
    confirmation_url: str | None
    session_url: str | None


@dataclass(frozen=True)
class HeldRow:
    confirmation: Confirmation
    status: str
    amount: str
    url: str | None


def _refund_rows(refunds: list[Refund], user: Any) -> list[RefundRow]:
    """The refunds with where each came from: the money movement under the same key names the
    session and, for a reviewer's approval, the confirmation."""
    moved = {
        movement.key: movement
        for movement in Movement.objects.filter(key__in=[r.idempotency_key for r in refunds])
    }
    rows = []
    for refund in refunds:
        movement = moved.get(refund.idempotency_key)
        session_url = None
        held_url = None
        if movement is not None:
            session_url = reverse(
                "analytics:session", args=[movement.agent_id, movement.session_id]
            )
            held_url = confirmation_url(user, movement.confirmation_id)
        rows.append(
            RefundRow(
                refund=refund,
                amount=money(refund.amount_cents, refund.currency),
                refunded_after=money(refund.refunded_cents_after, refund.currency),
                approved_by=refund.approved_by or refund.get_approval_display().lower(),
                confirmation_url=held_url,
                session_url=session_url,
            )
        )
    return rows


def _held_rows(order: Order, user: Any) -> list[HeldRow]:
    """The held calls whose money is this order's, in any state: their money rows name them, and
    are read by the customer's index."""
    movements = Movement.objects.filter(
        customer_id=order.customer_id, currency=order.currency, subject=order.order_id
    ).exclude(confirmation_id="")
    ids = [movement.confirmation_id for movement in movements]
    held = Confirmation.objects.filter(pk__in=ids).order_by("-created_at")
    return [
        HeldRow(
            confirmation=confirmation,
            status=effective_status(confirmation),
            amount=money(confirmation.amount_cents or 0, confirmation.currency or order.currency),
            url=confirmation_url(user, confirmation.id),
        )
        for confirmation in held
    ]


@require_GET
@managers_and_reviewers
def order(request: HttpRequest, order_id: str) -> HttpResponse:
    placed = get_object_or_404(Order, order_id=order_id)
    refunds: QuerySet[Refund] = placed.refunds.order_by("created_at", "id")
    rows = _refund_rows(list(refunds), request.user)
    held = _held_rows(placed, request.user)
    waiting = [row for row in held if row.status in ("pending", "approved", "executing")]
    return render(
        request,
        "records/order.html",
        {
            "order": placed,
            "total": money(placed.total_cents, placed.currency),
            "refunded": money(placed.refunded_cents, placed.currency),
            "refundable": money(placed.total_cents - placed.refunded_cents, placed.currency),
            "refund_rows": rows,
            "held_rows": held,
            "waiting": waiting,
            "waiting_sum": money(
                sum(row.confirmation.amount_cents or 0 for row in waiting), placed.currency
            ),
            "calls_url": filtered_url("analytics:calls", customer=placed.customer_id, range="30d"),
            "customer_orders_url": filtered_url("records:orders", customer=placed.customer_id),
            "is_manager": is_manager(request.user),
        },
    )
