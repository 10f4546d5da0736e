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
from analytics.drafts import draft_currencies, draft_read, parameter
from analytics.ranges import (
    DAY,
    HOUR,
    hour_after,
    hour_floor,
    moment_in,
    range_problem,
)
from dispatch.models import Agent, CallChannel, ConfirmationStatus
from dispatch.money import exponent
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import draft_of

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
# What a support lead narrows the calls by, beside the range, the agent and the tool.
CALL_FILTERS = ("customer", "session", "channel", "q")
# The shortest text the search in the raw arguments looks for: the trigram index that keeps it
# fast reads three characters at least.
SEARCH_SHORTEST = 3


class CallsForm(ScopeForm):
    """The calls behind a figure: the scope's, narrowed by what the figure counts."""

    code = forms.CharField(required=False, max_length=64, strip=True)
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), *OUTCOME_WORDS.items()])
    status = forms.ChoiceField(required=False, choices=[("", "any"), *ConfirmationStatus.choices])
    decided_by = forms.CharField(required=False, max_length=150, strip=True)
    customer = forms.CharField(required=False, max_length=64, strip=True)
    session = forms.CharField(required=False, max_length=128, strip=True)
    channel = forms.ChoiceField(required=False, choices=[("", "Any channel"), *CallChannel.choices])
    q = forms.CharField(
        label="Search the arguments",
        required=False,
        min_length=SEARCH_SHORTEST,
        max_length=200,
        strip=True,
    )


THRESHOLD_LABELS = {
    "auto_approve_below": (
        "Auto-approve below",
        "the customer's sum below which no human is asked",
    ),
    "two_reviewers_from": ("Two reviewers from", "empty: one is always enough"),
    "max_amount": ("Maximum amount", "above it a call is refused"),
    "daily_cap": ("Daily cap", "what the agent moves without a human per UTC day; empty: none"),
}


class DraftForm(forms.Form):
    """The what-if's draft: the window, and each currency's thresholds in its major units; a
    field left as the page filled it keeps the current value."""

    auto_approve_window_seconds = forms.CharField(
        label="Window",
        required=False,
        help_text="seconds over which a customer's money moved or on its way adds up",
        widget=forms.TextInput(attrs={"inputmode": "numeric"}),
    )

    def __init__(self, data: Any, *, policy: Policy) -> None:
        super().__init__(data)
        self.policy = policy
        self.currencies = draft_currencies(policy)
        for currency in self.currencies:
            places = exponent(currency)
            for threshold, (label, help_text) in THRESHOLD_LABELS.items():
                self.fields[parameter(currency, threshold)] = forms.CharField(
                    label=f"{label} ({currency})",
                    help_text=f"{help_text}; in {currency}, "
                    + (f"with up to {places} decimals" if places else "in whole units"),
                    required=False,
                    widget=forms.TextInput(attrs={"inputmode": "decimal"}),
                )

    def draft(self) -> Policy:
        """The current policy where the form is silent or wrong (each wrong value says why on
        its field), the draft where it speaks."""
        self.is_valid()
        read = draft_read(
            {name: str(self.data[name]) for name in self.fields if name in self.data},
            self.currencies,
            self.policy,
        )
        for name, problem in read.problems.items():
            self.add_error(name, problem)
        changes: dict[str, int | None] = {}
        if read.window is not None:
            changes["auto_approve_window_seconds"] = read.window
        return draft_of(self.policy, changes, read.currencies)
