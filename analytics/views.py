"""The managers' pages: the dashboard, the calls behind each of its figures, a session's timeline
and the CSV of the table of calls by tool and code.

Every figure comes from analytics.selectors, the one metrics module; these views only choose the
range and filters (all in the query string, so a URL is a view that can be shared) and lay the
figures out. The pages work without JavaScript; static/analytics/analytics.js draws the charts
from the same figures and makes their bars into links.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.views.decorators.http import require_GET

from analytics.selectors import (
    NOT_REJECTED,
    CallFigures,
    call_figures,
    calls_behind,
    confirmation_outcomes,
    held_calls_behind,
    held_count,
)
from approvals.models import ConfirmationEvent, EventKind
from approvals.selectors import MANAGERS_GROUP, REVIEWERS_GROUP, user_in_group
from dispatch.models import Agent, AuditRecord, Confirmation, ConfirmationStatus
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, LOOP_DETECTED, OK, STEP_LIMIT, Code
from dispatch.registry import tool_registry

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
RANGES: dict[str, tuple[str, timedelta]] = {
    "24h": ("Last 24 hours", DAY),
    "7d": ("Last 7 days", 7 * DAY),
    "30d": ("Last 30 days", 30 * DAY),
}
DEFAULT_RANGE = "24h"
# A custom range reads at most a year of hourly rollups.
LONGEST_RANGE = 366 * DAY
# The chart over time shows at most this many bars: the smallest bucket that fits is chosen.
MOST_BUCKETS = 31
BUCKETS = (HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY)
# Codes the chart over time shows one by one; the rest of the rejections are stacked as one.
CODES_CHARTED = 7
CALLS_PER_PAGE = 50
# How much of the raw arguments a list shows; the call's own page shows them whole.
RAW_SHOWN = 160

# The pipeline's stages (PRODUCT.md, "The pipeline"), by the number each code carries.
STAGES = {
    0: "step budget",
    1: "tool",
    2: "JSON",
    3: "schema",
    4: "idempotency",
    5: "business rules",
    6: "policy",
    7: "confirmation",
    8: "execution",
}
# The outcomes of held calls, final ones first, in the order the chart shows them.
OUTCOMES = (
    ConfirmationStatus.EXECUTED,
    ConfirmationStatus.REJECTED,
    ConfirmationStatus.EXPIRED,
    ConfirmationStatus.INVALIDATED,
    ConfirmationStatus.FAILED,
    ConfirmationStatus.UNKNOWN,
    ConfirmationStatus.PENDING,
    ConfirmationStatus.APPROVED,
    ConfirmationStatus.EXECUTING,
)
# The events that settle a pending confirmation, and so say who decided it.
DECISION_KINDS = (EventKind.APPROVED, EventKind.REJECTED, EventKind.INVALIDATED, EventKind.EXPIRED)
TABLE_SORTS = {
    "calls": lambda row: (-row.calls, row.tool, row.code),
    "tool": lambda row: (row.tool, row.code),
    "code": lambda row: (row.code, row.tool),
    "recovery": lambda row: (
        -(row.recovery_rate if row.recovery_rate is not None else -1.0),
        -row.calls,
        row.tool,
        row.code,
    ),
}


# Who may read what ------------------------------------------------------------------------------

View = Callable[..., HttpResponse]


def _in_group(user: AbstractBaseUser | AnonymousUser, *groups: str) -> bool:
    return any(user_in_group(user, group) for group in groups)


def _members_only(*groups: str) -> Callable[[View], View]:
    """Anonymous users go to the login; signed-in users outside the groups get a 403."""

    def decorate(view: View) -> View:
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not _in_group(request.user, *groups):
                raise PermissionDenied(
                    "This page is for members of the "
                    + " or ".join(f"'{group}'" for group in groups)
                    + " group. An administrator can add you."
                )
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


managers_only = _members_only(MANAGERS_GROUP)
# A session's timeline is also where a reviewer reads what the agent did before a held call.
managers_and_reviewers = _members_only(MANAGERS_GROUP, REVIEWERS_GROUP)


# The range and filters, from the query string ---------------------------------------------------


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
        try:
            until = _moment(until_text, end=True) if until_text else _next_hour(timezone.now())
            since = _moment(since_text, end=False) if since_text else until - DAY
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None
        since, until = _floor_hour(since), _next_hour(until)
        if since >= until:
            raise forms.ValidationError("The range must start before it ends.")
        if until - since > LONGEST_RANGE:
            raise forms.ValidationError("A range may be at most a year long.")
        data["since_moment"], data["until_moment"] = since, until
        return data


def _moment(text: str, *, end: bool) -> datetime:
    """A date is a whole day in the reader's time zone: since its start, until its end."""
    try:
        day = parse_date(text)
        moment = None if day is not None else parse_datetime(text)
    except ValueError:
        day, moment = None, None
    if day is not None:
        if not date(2000, 1, 1) <= day <= date(9000, 1, 1):
            raise ValueError(f"{text} is not a date this service has calls for.")
        start = datetime.combine(day + DAY if end else day, time(), tzinfo=None)
        return timezone.make_aware(start)
    if moment is None:
        raise ValueError(f"'{text}' is neither a date (YYYY-MM-DD) nor a time (ISO 8601).")
    if not datetime(2000, 1, 1, tzinfo=UTC) <= _aware(moment) <= datetime(9000, 1, 1, tzinfo=UTC):
        raise ValueError(f"{text} is not a time this service has calls for.")
    return _aware(moment)


def _aware(moment: datetime) -> datetime:
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def _floor_hour(moment: datetime) -> datetime:
    # In UTC: the rollups count UTC hours, and some zones are not a whole hour off UTC.
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _next_hour(moment: datetime) -> datetime:
    floor = _floor_hour(moment)
    return floor if floor == moment else floor + HOUR


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
        return f"{_when(self.since)} to {_when(self.until)}"

    def filters(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "agent_id": self.agent_id,
            "tool": self.tool,
        }

    def exact(self, **extra: object) -> dict[str, str]:
        """The query of the calls behind a figure: this exact range and these filters."""
        params = {"since": _iso(self.since), "until": _iso(self.until)}
        if self.agent is not None:
            params["agent"] = str(self.agent.pk)
        if self.tool:
            params["tool"] = self.tool
        params.update({key: str(value) for key, value in extra.items() if value not in (None, "")})
        return params


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
    until = _next_hour(timezone.now())
    return Scope(until - RANGES[range_key][1], until, range_key, agent, tool), form


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _when(moment: datetime) -> str:
    local = timezone.localtime(moment)
    return f"{local.day} {local:%b %Y %H:%M}"


def _url(name: str, params: Mapping[str, str], *args: object) -> str:
    return reverse(name, args=args) + ("?" + urlencode(params) if params else "")


# Formatting ------------------------------------------------------------------------------------


def _count(value: int) -> str:
    return f"{value:,}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _code(name: str) -> Code | None:
    try:
        return tool_registry.catalogue[name]
    except KeyError:  # a code no longer declared, in an old record
        return None


def code_kind(name: str) -> str:
    """How a code reads on the pages: passed, held for a human, or rejected."""
    if name == OK.name:
        return "ok"
    if name == CONFIRMATION_REQUIRED.name:
        return "held"
    return "rejected"


# The dashboard ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Headline:
    label: str
    value: str
    # "vs 180 in the 24 hours before"
    previous: str
    # "▲ 12 %", "▼ 2.1 pp", "no change"; a rate changes by percentage points.
    change: str
    definition: str
    url: str


@dataclass(frozen=True)
class TableRow:
    tool: str
    code: str
    meaning: str
    kind: str
    calls: int
    share: float
    correctable: int
    recovered: int
    url: str
    recovery_url: str

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.correctable if self.correctable else None

    @property
    def share_text(self) -> str:
        return _percent(self.share)

    @property
    def recovery_text(self) -> str:
        return _percent(self.recovery_rate)


def _change_in_count(now: int, before: int) -> str:
    if now == before:
        return "no change"
    if before == 0:
        return "▲ new"
    ratio = (now - before) / before
    return f"{'▲' if ratio > 0 else '▼'} {abs(ratio) * 100:.0f} %"


def _change_in_rate(now: float | None, before: float | None) -> str:
    if now is None or before is None:
        return ""
    points = (now - before) * 100
    if abs(points) < 0.05:
        return "no change"
    return f"{'▲' if points > 0 else '▼'} {abs(points):.1f} pp"


def headlines(
    scope: Scope,
    figures: CallFigures,
    before: CallFigures,
    held: int,
    held_before: int,
) -> list[Headline]:
    """The five figures at the top, each beside its value over the period just before."""
    window = f"the {scope.span_words()} before"
    quiet = before.total.calls == 0
    loops, loops_before = _code_calls(figures, LOOP_DETECTED), _code_calls(before, LOOP_DETECTED)

    def count(label: str, now: int, then: int, definition: str, **drill: str) -> Headline:
        return Headline(
            label,
            _count(now),
            f"no calls in {window}" if quiet else f"vs {_count(then)} in {window}",
            "" if quiet else _change_in_count(now, then),
            definition,
            _url("analytics:calls", scope.exact(**drill)),
        )

    def rate(
        label: str, now: float | None, then: float | None, definition: str, **drill: str
    ) -> Headline:
        return Headline(
            label,
            _percent(now),
            f"no calls in {window}" if quiet else f"vs {_percent(then)} in {window}",
            _change_in_rate(now, then),
            definition,
            _url("analytics:calls", scope.exact(**drill)),
        )

    return [
        count(
            "Calls",
            figures.total.calls,
            before.total.calls,
            "Every tool call an agent sent, whatever its outcome.",
        ),
        rate(
            "Rejection rate",
            figures.total.rejection_rate,
            before.total.rejection_rate,
            "Rejected calls out of all calls; a call held for a human is not rejected.",
            outcome="rejected",
        ),
        rate(
            "Recovery rate",
            figures.total.recovery_rate,
            before.total.recovery_rate,
            "Of the rejections the model can fix, the share it fixed within its next 3 calls "
            "to the same tool in the session.",
            outcome="correctable",
        ),
        count(
            "Loop detections",
            loops,
            loops_before,
            "Calls refused because the same call was repeated more often than the policy allows.",
            code=LOOP_DETECTED.name,
        ),
        count(
            "Held calls",
            held,
            held_before,
            "Calls that passed every check and were held for a human to decide.",
            outcome="held",
        ),
    ]


def _code_calls(figures: CallFigures, code: Code) -> int:
    tally = figures.by_code.get(code.name)
    return 0 if tally is None else tally.calls


def table_rows(scope: Scope, figures: CallFigures, sort: str) -> list[TableRow]:
    total = figures.total.calls
    rows = [
        TableRow(
            tool=tool,
            code=code,
            meaning=(known.meaning if (known := _code(code)) is not None else ""),
            kind=code_kind(code),
            calls=tally.calls,
            share=tally.calls / total if total else 0.0,
            correctable=tally.correctable,
            recovered=tally.recovered,
            url=_url("analytics:calls", {**scope.exact(code=code), "tool": tool}),
            recovery_url=_url(
                "analytics:calls", {**scope.exact(code=code, outcome="correctable"), "tool": tool}
            ),
        )
        for (tool, code), tally in figures.by_tool_code.items()
        if tally.calls
    ]
    return sorted(rows, key=TABLE_SORTS.get(sort, TABLE_SORTS["calls"]))


@dataclass(frozen=True)
class Bucket:
    """One bar of the chart over time: its hours, within the scope's range."""

    start: datetime
    end: datetime
    label: str


class Buckets:
    """The bars of the chart over time, and which bar each of call_figures' time keys falls in.

    call_figures keys its counts by hour for buckets under a day, and by calendar day in the
    reader's time zone from a day up (so that a month is 31 rows a code, not 744). Bars under a
    day start at the range's own start; bars of days start at midnight, the first and the last
    cut to the range (a rate over part of a day is still that part's rate)."""

    def __init__(self, scope: Scope) -> None:
        self.size = scope.bucket
        self.scope = scope
        if self.size < DAY:
            count = math.ceil(scope.span / self.size)
            starts = [scope.since + self.size * index for index in range(count)]
        else:
            self.first_day = timezone.localtime(scope.since).date()
            last_day = timezone.localtime(scope.until - timedelta(microseconds=1)).date()
            days = self.size.days
            starts = [
                max(scope.since, _midnight(self.first_day + timedelta(days=offset)))
                for offset in range(0, (last_day - self.first_day).days + 1, days)
            ]
        ends = [*starts[1:], scope.until]
        self.bars = [
            Bucket(start, end, _bucket_label(start, self.size))
            for start, end in zip(starts, ends, strict=True)
        ]

    def index(self, key: datetime) -> int:
        if self.size < DAY:
            return (key - self.scope.since) // self.size
        return (timezone.localtime(key).date() - self.first_day).days // self.size.days

    def counts(self, figures: CallFigures, codes: Iterable[str] | None = None) -> list[int]:
        """Calls per bar, of the codes given or of all."""
        wanted = None if codes is None else set(codes)
        per_bar = [0] * len(self.bars)
        for (key, code), calls in figures.by_bucket_code.items():
            index = self.index(key)
            if (wanted is None or code in wanted) and 0 <= index < len(per_bar):
                per_bar[index] += calls
        return per_bar


def _midnight(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time()))


def _bucket_label(moment: datetime, size: timedelta) -> str:
    local = timezone.localtime(moment)
    return f"{local.day} {local:%b}" if size >= DAY else f"{local.day} {local:%b %H:%M}"


def _series(
    label: str, values: list[float], texts: list[str], urls: list[str], *, look: int | None = None
) -> dict[str, Any]:
    """`look` fixes the series' colour and pattern, so that it keeps them whatever else is shown."""
    return {"label": label, "values": values, "texts": texts, "urls": urls, "look": look}


def _chart(
    title: str, labels: list[str], series: list[dict[str, Any]], *, drawn: bool | None = None
) -> dict[str, Any]:
    """One chart: its categories, and per series the values drawn, the same in words (tooltips
    and the table beside the chart) and the URL of the calls behind each. A chart of nothing
    but zeros has no series: the page says there is nothing to draw."""
    if drawn is None:
        # A series of zeros only would be a legend entry with nothing to show.
        series = [one for one in series if any(one["values"])]
        drawn = bool(series)
    if not drawn:
        return {"title": title, "labels": labels, "series": [], "rows": []}
    rows = [
        {
            "label": label,
            "cells": [{"text": one["texts"][i], "url": one["urls"][i]} for one in series],
        }
        for i, label in enumerate(labels)
    ]
    return {"title": title, "labels": labels, "series": series, "rows": rows}


def chart_data(scope: Scope, figures: CallFigures, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "rejection_over_time": _rejection_over_time(scope, figures),
        "recovery_by_tool": _recovery_by_tool(scope, figures),
        "stuck_by_tool": _stuck_by_tool(scope, figures),
        "confirmation_outcomes": _confirmation_outcomes(scope, outcomes),
        "decision_times": _decision_times(scope, outcomes),
    }


def _rejection_over_time(scope: Scope, figures: CallFigures) -> dict[str, Any]:
    buckets = Buckets(scope)
    per_bar = buckets.counts(figures)
    rejected = sorted(
        (code for code in figures.by_code if code not in NOT_REJECTED),
        key=lambda code: (-figures.by_code[code].calls, code),
    )
    groups = [(code, [code], {"code": code}) for code in rejected[:CODES_CHARTED]]
    if rejected[CODES_CHARTED:]:
        groups.append(("other codes", rejected[CODES_CHARTED:], {"outcome": "rejected"}))
    series = []
    for label, codes, drill in groups:
        counts = buckets.counts(figures, codes)
        rates = [
            n / all_calls if all_calls else 0.0
            for n, all_calls in zip(counts, per_bar, strict=True)
        ]
        series.append(
            _series(
                label,
                [round(100 * rate, 2) for rate in rates],
                [
                    f"{_percent(rate)} ({_count(n)} of {_count(all_calls)})"
                    for rate, n, all_calls in zip(rates, counts, per_bar, strict=True)
                ],
                [
                    _url(
                        "analytics:calls",
                        Scope(bar.start, bar.end, "custom", scope.agent, scope.tool).exact(**drill),
                    )
                    for bar in buckets.bars
                ],
            )
        )
    return _chart("Rejection rate over time", [bar.label for bar in buckets.bars], series)


def _recovery_by_tool(scope: Scope, figures: CallFigures) -> dict[str, Any]:
    tools = sorted(
        (tool for tool, tally in figures.by_tool.items() if tally.correctable),
        key=lambda tool: (-figures.by_tool[tool].correctable, tool),
    )
    tallies = [figures.by_tool[tool] for tool in tools]
    return _chart(
        "Recovery rate by tool",
        tools,
        [
            _series(
                "recovered",
                [round(100 * (t.recovery_rate or 0.0), 2) for t in tallies],
                [
                    f"{_percent(t.recovery_rate)} ({_count(t.recovered)} of "
                    f"{_count(t.correctable)})"
                    for t in tallies
                ],
                [
                    _url("analytics:calls", {**scope.exact(outcome="correctable"), "tool": tool})
                    for tool in tools
                ],
            )
        ],
        # No recovery at all is a finding, not an empty chart.
        drawn=bool(tools),
    )


def _stuck_by_tool(scope: Scope, figures: CallFigures) -> dict[str, Any]:
    replays = {tool: tally.replayed for tool, tally in figures.by_tool.items() if tally.replayed}
    loops = figures.per_tool(LOOP_DETECTED.name)
    limits = figures.per_tool(STEP_LIMIT.name)
    tools = sorted(set(replays) | set(loops) | set(limits))
    series = [
        _series(
            label,
            [counts.get(tool, 0) for tool in tools],
            [_count(counts.get(tool, 0)) for tool in tools],
            [_url("analytics:calls", {**scope.exact(**drill), "tool": tool}) for tool in tools],
            look=look,
        )
        for look, (label, counts, drill) in enumerate(
            (
                ("replays", replays, {"outcome": "replayed"}),
                ("loop detections", loops, {"code": LOOP_DETECTED.name}),
                ("step limits", limits, {"code": STEP_LIMIT.name}),
            )
        )
    ]
    return _chart("Replays, loop detections and step limits by tool", tools, series)


def _confirmation_outcomes(scope: Scope, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    by_status = outcomes["by_status"]
    statuses = [str(status) for status in OUTCOMES if by_status.get(status)]
    return _chart(
        "Held calls by outcome",
        statuses,
        [
            _series(
                "held calls",
                [by_status[status] for status in statuses],
                [_count(by_status[status]) for status in statuses],
                [
                    _url("analytics:calls", scope.exact(outcome="held", status=status))
                    for status in statuses
                ],
            )
        ],
    )


def _decision_times(scope: Scope, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    overall = outcomes["time_to_decision_seconds"]
    reviewers: dict[str, dict[str, Any]] = outcomes["by_reviewer"]
    labels, waits, urls = [], [], []
    if overall["p50"] is not None:
        labels.append("all held calls")
        waits.append(overall)
        urls.append(_url("analytics:calls", scope.exact(outcome="held")))
    for name, wait in reviewers.items():
        labels.append(name)
        waits.append(wait)
        urls.append(_url("analytics:calls", scope.exact(outcome="held", decided_by=name)))
    longest = max((wait["p90"] or 0.0 for wait in waits), default=0.0)
    unit, seconds = ("h", 3600) if longest >= 7200 else ("min", 60) if longest >= 120 else ("s", 1)
    chart = _chart(
        "Time to decision",
        labels,
        [
            _series(
                f"{label} ({unit})",
                [round((wait[key] or 0.0) / seconds, 2) for wait in waits],
                [_duration(wait[key]) for wait in waits],
                urls,
            )
            for label, key in (("median", "p50"), ("90th percentile", "p90"))
        ],
        # Decisions within the second are still decisions.
        drawn=bool(waits),
    )
    chart["unit"] = unit
    return chart


def _tool_choices(scope: Scope) -> list[str]:
    tools = sorted(spec.name for spec in tool_registry)
    if scope.tool and scope.tool not in tools:
        tools.append(scope.tool)
    return tools


def _columns(query: QueryDict, sort: str) -> list[dict[str, Any]]:
    """The table's headers: a sortable one links to the table sorted by it."""
    columns = []
    for key, label, numeric in (
        ("tool", "Tool", False),
        ("code", "Code", False),
        ("calls", "Calls", True),
        ("", "Share", True),
        ("recovery", "Recovery rate", True),
    ):
        direction = "ascending" if key in ("tool", "code") else "descending"
        columns.append(
            {
                "label": label,
                "numeric": numeric,
                "url": "?" + _scope_query(query, sort=key) if key else None,
                "sorted": direction if key == sort else None,
                "arrow": "↑" if direction == "ascending" else "↓",
            }
        )
    return columns


def _scope_query(query: QueryDict, **changes: str) -> str:
    """The page's own query string with some parameters changed (sorting, a page)."""
    params = {key: query.get(key, "") for key in ("range", "since", "until", "agent", "tool")}
    params.update(changes)
    return urlencode({key: value for key, value in params.items() if value})


@require_GET
@managers_only
def dashboard(request: HttpRequest) -> HttpResponse:
    scope, form = scope_from(request.GET)
    figures = call_figures(**scope.filters(), bucket=scope.bucket)
    context: dict[str, Any] = {
        "scope": scope,
        "form": form,
        "ranges": RANGES,
        "agents": Agent.objects.order_by("name"),
        "tools": _tool_choices(scope),
        "any_calls": figures.total.calls > 0 or AuditRecord.objects.exists(),
        "has_calls": figures.total.calls > 0,
        "since_date": timezone.localtime(scope.since).date().isoformat(),
        "until_date": timezone.localtime(scope.until - timedelta(microseconds=1))
        .date()
        .isoformat(),
        "export_query": _scope_query(request.GET),
        "tz_name": timezone.get_current_timezone_name(),
    }
    if figures.total.calls:
        previous = scope.previous()
        # Only its totals are shown.
        before = call_figures(**previous.filters(), bucket=None)
        outcomes = confirmation_outcomes(**scope.filters())
        charts = chart_data(scope, figures, outcomes)
        sort = request.GET.get("sort", "calls")
        sort = sort if sort in TABLE_SORTS else "calls"
        context.update(
            headlines=headlines(
                scope,
                figures,
                before,
                sum(outcomes["by_status"].values()),
                held_count(**previous.filters()),
            ),
            charts=charts,
            # The rows are the tables beside the charts; the browser needs only the series.
            charts_drawn={
                name: {key: value for key, value in chart.items() if key != "rows"}
                for name, chart in charts.items()
            },
            rows=table_rows(scope, figures, sort),
            sort=sort,
            columns=_columns(request.GET, sort),
            total_calls=figures.total.calls,
        )
    return render(request, "analytics/dashboard.html", context)


# The CSV of the table --------------------------------------------------------------------------

CSV_COLUMNS = (
    "tool",
    "code",
    "calls",
    "share",
    "rejected",
    "correctable",
    "recovered",
    "recovery_rate",
)


def _cell(value: object) -> object:
    # A tool name is whatever a model sent: a spreadsheet must not run it as a formula.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


@require_GET
@managers_only
def export_csv(request: HttpRequest) -> HttpResponse:
    scope, _ = scope_from(request.GET)
    figures = call_figures(**scope.filters(), bucket=scope.bucket)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"toolgate-calls-{_iso(scope.since)}-{_iso(scope.until)}.csv".replace(":", "")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for row in table_rows(scope, figures, "calls"):
        writer.writerow(
            [
                _cell(row.tool),
                _cell(row.code),
                row.calls,
                f"{row.share:.4f}",
                "yes" if row.kind == "rejected" else "no",
                row.correctable,
                row.recovered,
                "" if row.recovery_rate is None else f"{row.recovery_rate:.4f}",
            ]
        )
    return response


# The calls behind a figure ---------------------------------------------------------------------


OUTCOME_WORDS = {
    "rejected": "rejected",
    "correctable": "rejected, fixable by the model",
    "replayed": "replayed",
    "held": "held for a human",
}
DRILLDOWN_FILTERS = ("code", "outcome", "status", "decided_by")


class CallsForm(ScopeForm):
    code = forms.CharField(required=False, max_length=64, strip=True)
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), *OUTCOME_WORDS.items()])
    status = forms.ChoiceField(required=False, choices=[("", "any"), *ConfirmationStatus.choices])
    decided_by = forms.CharField(required=False, max_length=150, strip=True)


@dataclass(frozen=True)
class CallRow:
    record: AuditRecord
    agent_name: str
    raw_shown: str
    truncated: bool
    stage: str
    kind: str
    confirmation: Confirmation | None
    confirmation_url: str | None
    # Who settled the held call: a reviewer's name, or "expiry".
    decided_by: str


def _stage(code: str) -> str:
    known = _code(code)
    if known is None:
        return ""
    return f"{known.stage} · {STAGES.get(known.stage, '')}"


def confirmation_url(user: AbstractBaseUser | AnonymousUser, confirmation_id: str) -> str | None:
    """Where a held call's confirmation is read: a reviewer's own page, or the admin's (read-only
    for managers)."""
    if not confirmation_id:
        return None
    if _in_group(user, REVIEWERS_GROUP):
        try:
            return reverse("approvals:detail", args=[confirmation_id])
        except NoReverseMatch:
            pass
    return reverse("admin:dispatch_confirmation_change", args=[confirmation_id])


def call_rows(
    records: Iterable[AuditRecord], user: AbstractBaseUser | AnonymousUser
) -> list[CallRow]:
    records = list(records)
    names = dict(
        Agent.objects.filter(pk__in={r.agent_id for r in records}).values_list("pk", "name")
    )
    held = Confirmation.objects.in_bulk({r.confirmation_id for r in records if r.confirmation_id})
    deciders = dict(
        ConfirmationEvent.objects.filter(
            confirmation_id__in=held, kind__in=DECISION_KINDS
        ).values_list("confirmation_id", "actor_label")
    )
    rows = []
    for record in records:
        raw = record.raw_arguments
        rows.append(
            CallRow(
                record=record,
                agent_name=names.get(record.agent_id, str(record.agent_id)),
                raw_shown=raw if len(raw) <= RAW_SHOWN else raw[:RAW_SHOWN] + "…",
                truncated=len(raw) > RAW_SHOWN,
                stage=_stage(record.code),
                kind=code_kind(record.code),
                confirmation=held.get(record.confirmation_id),
                confirmation_url=confirmation_url(user, record.confirmation_id),
                decided_by=deciders.get(record.confirmation_id, ""),
            )
        )
    return rows


def calls_for(scope: Scope, data: Mapping[str, Any]) -> QuerySet[AuditRecord]:
    outcome = data.get("outcome") or ""
    if outcome == "held":
        return held_calls_behind(
            **scope.filters(),
            status=data.get("status") or None,
            decided_by=data.get("decided_by") or None,
        )
    return calls_behind(
        **scope.filters(),
        code=data.get("code") or None,
        rejected=outcome == "rejected",
        correctable=outcome == "correctable",
        replayed=outcome == "replayed",
    )


def _describe(scope: Scope, data: Mapping[str, Any]) -> list[str]:
    """The filters, in words, for the page's heading."""
    words = [f"{_when(scope.since)} to {_when(scope.until)}"]
    if scope.agent is not None:
        words.append(f"agent {scope.agent.name}")
    if scope.tool:
        words.append(f"tool {scope.tool}")
    if data.get("code"):
        words.append(f"code {data['code']}")
    if data.get("outcome"):
        words.append(OUTCOME_WORDS[data["outcome"]])
    if data.get("status"):
        words.append(f"now {data['status']}")
    if data.get("decided_by"):
        words.append(f"decided by {data['decided_by']}")
    return words


@require_GET
@managers_only
def calls(request: HttpRequest) -> HttpResponse:
    scope, _ = scope_from(request.GET)
    form = CallsForm(request.GET)
    form.is_valid()
    # A filter that is not valid is left out (and the form says why); the others still apply.
    data = {key: form.cleaned_data.get(key) or "" for key in DRILLDOWN_FILTERS}
    records = calls_for(scope, data).order_by("-at", "-id")
    page: Page[AuditRecord] = Paginator(records, CALLS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "scope": scope,
        "form": form,
        "description": _describe(scope, data),
        "page": page,
        "rows": call_rows(page.object_list, request.user),
        "page_query": query.urlencode(),
        "dashboard_query": _scope_query(request.GET),
    }
    return render(request, "analytics/calls.html", context)


@require_GET
@managers_and_reviewers
def call_detail(request: HttpRequest, call_id: str) -> HttpResponse:
    record = get_object_or_404(AuditRecord, call_id=call_id)
    row = call_rows([record], request.user)[0]
    known = _code(record.code)
    return render(
        request,
        "analytics/call.html",
        {
            "row": row,
            "record": record,
            "meaning": known.meaning if known else "",
            "validated": json.dumps(record.arguments, indent=2, ensure_ascii=False),
        },
    )


# A session's timeline --------------------------------------------------------------------------


@require_GET
@managers_and_reviewers
def session_timeline(request: HttpRequest, agent_id: int, session_id: str) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=agent_id)
    records = AuditRecord.objects.filter(agent=agent, session_id=session_id).order_by(
        "step", "at", "id"
    )
    rows = call_rows(records, request.user)
    if not rows:
        raise Http404("No calls in that session.")
    return render(
        request,
        "analytics/session.html",
        {
            "agent": agent,
            "session_id": session_id,
            "customer_id": rows[0].record.customer_id,
            "rows": rows,
            "first": rows[0].record.at,
            "last": rows[-1].record.at,
            "rejected": sum(1 for row in rows if row.kind == "rejected"),
            "is_manager": _in_group(request.user, MANAGERS_GROUP),
        },
    )
