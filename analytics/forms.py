"""What a manager asks for, from the query string: the range and the filters (every page), the
filters of the calls behind a figure, and the what-if's draft.

Everything lives in the URL, so that a view can be bookmarked and sent to a colleague. Dates and
times are read in the reader's time zone (analytics/ranges.py); the range is cut at UTC hours,
which the rollups count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils import timezone

from analytics import formatting
from analytics.ranges import (
    DAY,
    HOUR,
    hour_after,
    hour_floor,
    moment_in,
    range_problem,
)
from dispatch.models import Agent, ConfirmationStatus
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import DRAFT_FIELDS, draft_of

RANGES: dict[str, tuple[str, timedelta]] = {
    "24h": ("Last 24 hours", DAY),
    "7d": ("Last 7 days", 7 * DAY),
    "30d": ("Last 30 days", 30 * DAY),
}
DEFAULT_RANGE = "24h"
# The chart over time shows at most this many bars: the smallest bucket that fits is chosen.
MOST_BUCKETS = 31
BUCKETS = (HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY)


class ScopeForm(forms.Form):
    range = forms.ChoiceField(
        choices=[*((key, label) for key, (label, _) in RANGES.items()), ("custom", "Custom")],
        required=False,
    )
    # A date (YYYY-MM-DD, a whole day in the reader's time zone) or an exact ISO 8601 time.
    since = forms.CharField(required=False, max_length=40, strip=True)
    until = forms.CharField(required=False, max_length=40, strip=True)
    agent = forms.ModelChoiceField(
        queryset=Agent.objects.all(), required=False, empty_label="All agents"
    )
    tool = forms.CharField(required=False, max_length=128, strip=True)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("range") in RANGES:
            # A range chosen by name wins over the dates a form without JavaScript also sends.
            return data
        since_text, until_text = data.get("since"), data.get("until")
        if not since_text and not until_text:
            return data
        zone = timezone.get_current_timezone()
        try:
            until = (
                moment_in(until_text, zone, end=True) if until_text else hour_after(timezone.now())
            )
            since = moment_in(since_text, zone, end=False) if since_text else until - DAY
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None
        since, until = hour_floor(since), hour_after(until)
        problem = range_problem(since, until)
        if problem is not None:
            raise forms.ValidationError(problem)
        data["since_moment"], data["until_moment"] = since, until
        return data


@dataclass(frozen=True)
class Scope:
    """What a page counts: the hours from `since` to `until`, of one agent and one tool or all."""

    since: datetime
    until: datetime
    range_key: str
    agent: Agent | None = None
    tool: str | None = None

    @property
    def span(self) -> timedelta:
        return self.until - self.since

    @property
    def bucket(self) -> timedelta:
        return next((b for b in BUCKETS if self.span / b <= MOST_BUCKETS), BUCKETS[-1])

    @property
    def agent_id(self) -> int | None:
        return None if self.agent is None else self.agent.pk

    def previous(self) -> Scope:
        return Scope(self.since - self.span, self.since, "custom", self.agent, self.tool)

    def span_words(self) -> str:
        hours = round(self.span / HOUR)
        if hours % 24 or hours == 24:
            return f"{hours} hours"
        return f"{hours // 24} days"

    def label(self) -> str:
        if self.range_key in RANGES:
            return RANGES[self.range_key][0]
        return f"{formatting.when(self.since)} to {formatting.when(self.until)}"

    def filters(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "agent_id": self.agent_id,
            "tool": self.tool,
        }

    def exact(self, **extra: object) -> dict[str, str]:
        """The query of the calls behind a figure: this exact range and these filters."""
        params = {"since": formatting.iso(self.since), "until": formatting.iso(self.until)}
        if self.agent is not None:
            params["agent"] = str(self.agent.pk)
        if self.tool:
            params["tool"] = self.tool
        params.update({key: str(value) for key, value in extra.items() if value not in (None, "")})
        return params

    def since_date(self) -> str:
        """The first day of the range in the reader's time zone, for a date field."""
        return timezone.localtime(self.since).date().isoformat()

    def until_date(self) -> str:
        """The last day of the range (both included) in the reader's time zone."""
        return timezone.localtime(self.until - timedelta(microseconds=1)).date().isoformat()


def scope_from(query: QueryDict) -> tuple[Scope, ScopeForm]:
    """The scope a query string asks for; where it asks for something impossible, the form says
    why and the page shows the default range (with the filters that were valid)."""
    form = ScopeForm(query)
    form.is_valid()
    # The fields that were valid are kept: a bad date does not also drop the agent filter.
    data = form.cleaned_data
    agent = data.get("agent")
    tool = data.get("tool") or None
    if "since_moment" in data:
        return Scope(data["since_moment"], data["until_moment"], "custom", agent, tool), form
    range_key = data.get("range") or DEFAULT_RANGE
    if range_key not in RANGES:
        range_key = DEFAULT_RANGE
    until = hour_after(timezone.now())
    return Scope(until - RANGES[range_key][1], until, range_key, agent, tool), form


OUTCOME_WORDS = {
    "rejected": "rejected",
    "correctable": "rejected, fixable by the model",
    "replayed": "replayed",
    "held": "held for a human",
}
DRILLDOWN_FILTERS = ("code", "outcome", "status", "decided_by")


class CallsForm(ScopeForm):
    """The calls behind a figure: the scope's, narrowed by what the figure counts."""

    code = forms.CharField(required=False, max_length=64, strip=True)
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), *OUTCOME_WORDS.items()])
    status = forms.ChoiceField(required=False, choices=[("", "any"), *ConfirmationStatus.choices])
    decided_by = forms.CharField(required=False, max_length=150, strip=True)


FIELD_LABELS = {
    "auto_approve_below_cents": ("Auto-approve below", "minor units, such as 5000 for 50.00"),
    "auto_approve_window_seconds": (
        "Auto-approve window",
        "seconds over which a customer's money moved or on its way adds up",
    ),
    "two_reviewers_from_cents": ("Two reviewers from", "minor units; empty: one is always enough"),
    "max_amount_cents": ("Maximum amount", "minor units; above it a call is refused"),
    "daily_cap_cents": ("Daily cap", "minor units per currency and UTC day; empty: none"),
}


class DraftForm(forms.Form):
    """The what-if's draft thresholds; a field left as the page filled it keeps the current
    value."""

    def __init__(self, data: Any, *, policy: Policy) -> None:
        super().__init__(data)
        for name, (low, high, _) in DRAFT_FIELDS.items():
            label, help_text = FIELD_LABELS[name]
            self.fields[name] = forms.IntegerField(
                label=label,
                help_text=help_text,
                min_value=low,
                max_value=high,
                required=False,
                widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
            )
        self.policy = policy

    def draft(self) -> Policy:
        """The current policy where the form is invalid or silent, the draft where it speaks."""
        self.is_valid()
        changes: dict[str, int | None] = {}
        for name, (_, _, nullable) in DRAFT_FIELDS.items():
            if name in self.errors or name not in self.data:
                continue
            value = self.cleaned_data.get(name)
            if value is not None or nullable:
                changes[name] = value
        return draft_of(self.policy, changes)
