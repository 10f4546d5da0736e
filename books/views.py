"""The administrators' page of the books: every breach the reconciler found, the latest first,
with what it means and where to look (books/reconciler.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import django_tables2 as tables
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET
from django_tables2 import RequestConfig

from approvals.tables import ID, when
from books.checks import checks
from books.models import BooksWatermark, Breach

PAGE_SIZE = 50

View = Callable[..., HttpResponse]


def is_administrator(user: Any) -> bool:
    """Staff and superusers: the administrators the admin is kept for."""
    return bool(user.is_active and (user.is_staff or user.is_superuser))


def administrators_only(view: View) -> View:
    """Anonymous users go to the login (before anything is read); others who are not staff get
    a 403."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_administrator(request.user):
            raise PermissionDenied("This page is for administrators.")
        return view(request, *args, **kwargs)

    return wrapped


class BreachTable(tables.Table):  # type: ignore[misc]
    last_found_at = tables.Column(verbose_name="Last found")
    invariant = tables.Column(verbose_name="Invariant", attrs=ID)
    subject = tables.Column(verbose_name="Look at", attrs=ID)
    detail = tables.Column(verbose_name="What the books say", attrs={"td": {"class": "why"}})
    by_sweep = tables.Column(verbose_name="Found by")

    class Meta:
        model = Breach
        fields = ("last_found_at", "invariant", "subject", "detail", "by_sweep")
        order_by_field = "sort"
        empty_text = ""
        attrs = {"class": "striped records"}

    def render_last_found_at(self, value: Any, record: Breach) -> SafeString:
        return format_html(
            '<span title="first found {}">{}</span>',
            record.first_found_at.isoformat(timespec="seconds"),
            when(value),
        )

    def render_invariant(self, value: str) -> SafeString:
        return format_html("<code>{}</code>", value)

    def render_subject(self, value: str, record: Breach) -> SafeString:
        if not record.look_at:
            return format_html("{}", value)
        return format_html('<a href="{}">{}</a>', record.look_at, value)

    def render_by_sweep(self, value: bool) -> str:
        return "full sweep" if value else "changes"


@require_GET
@administrators_only
def breaches(request: HttpRequest) -> HttpResponse:
    table = BreachTable(Breach.objects.all(), order_by=request.GET.get("sort") or "-last_found_at")
    RequestConfig(request, paginate={"per_page": PAGE_SIZE}).configure(table)
    return render(
        request,
        "books/breaches.html",
        {
            "table": table,
            "watermark": BooksWatermark.objects.filter(pk=1).first(),
            # The checks are PostgreSQL statements: on another database nothing is checked.
            "checkable": connection.vendor == "postgresql",
            "invariants": [(check.invariant, check.words) for check in checks()],
        },
    )
