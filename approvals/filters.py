"""The history's filters, read from the query string: the URL is the state."""

from __future__ import annotations

from typing import Any

import django_filters
from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.utils import timezone
from django_filters.widgets import DateRangeWidget

from approvals.models import EventKind
from approvals.selectors import REVIEWERS_GROUP
from dispatch.models import Agent, Confirmation, ConfirmationStatus

# Every status but pending: a pending item past its expiry is listed as expired.
HISTORY_STATUSES = [
    (status.value, status.label)
    for status in ConfirmationStatus
    if status != ConfirmationStatus.PENDING
]
ACTING = (EventKind.VOTED, EventKind.APPROVED, EventKind.REJECTED, EventKind.RECONCILED)


class HistoryFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=HISTORY_STATUSES, method="filter_status", empty_label="Any status"
    )
    reviewer = django_filters.ModelChoiceFilter(
        queryset=User.objects.filter(groups__name=REVIEWERS_GROUP).order_by("username"),
        method="filter_reviewer",
        empty_label="Any reviewer",
        label="Reviewer",
    )
    agent = django_filters.ModelChoiceFilter(
        queryset=Agent.objects.order_by("name"), empty_label="Any agent"
    )
    decided = django_filters.DateFromToRangeFilter(
        field_name="closed_at",
        label="Decided between",
        widget=DateRangeWidget(attrs={"type": "date"}),
    )

    class Meta:
        model = Confirmation
        fields: list[str] = []

    def filter_status(
        self, queryset: QuerySet[Confirmation], name: str, value: Any
    ) -> QuerySet[Confirmation]:
        if value == ConfirmationStatus.EXPIRED:
            past = Q(status=ConfirmationStatus.PENDING, expires_at__lte=timezone.now())
            return queryset.filter(Q(status=value) | past)
        return queryset.filter(status=value)

    def filter_reviewer(
        self, queryset: QuerySet[Confirmation], name: str, value: Any
    ) -> QuerySet[Confirmation]:
        return queryset.filter(events__actor=value, events__kind__in=ACTING).distinct()
