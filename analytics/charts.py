"""The dashboard's charts, from the figures: each a list of categories and, per series, the values
drawn, the same in words (tooltips and the table beside each chart) and the URL of the calls
behind each bar. static/analytics/analytics.js draws them; the page works without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from analytics.counting import NOT_REJECTED
from analytics.formatting import count, duration, percent, url
from analytics.forms import Scope
from analytics.ranges import DAY, midnight
from analytics.selectors import CallFigures, Tally
from dispatch.models import ConfirmationStatus
from dispatch.pipeline.codes import LOOP_DETECTED, STEP_LIMIT, UNKNOWN_TOOL
from dispatch.registry import tool_registry

# Codes the chart over time shows one by one; the rest of the rejections are stacked as one.
CODES_CHARTED = 7
# The outcomes of held calls, final ones first, in the order the chart shows them.
OUTCOMES = (
    ConfirmationStatus.EXECUTED,
    ConfirmationStatus.REJECTED,
    ConfirmationStatus.EXPIRED,
    ConfirmationStatus.INVALIDATED,
    ConfirmationStatus.WITHDRAWN,
    ConfirmationStatus.FAILED,
    ConfirmationStatus.UNKNOWN,
    ConfirmationStatus.PENDING,
    ConfirmationStatus.APPROVED,
    ConfirmationStatus.EXECUTING,
)


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
            bars = math.ceil(scope.span / self.size)
            starts = [scope.since + self.size * index for index in range(bars)]
        else:
            zone = timezone.get_current_timezone()
            self.first_day = timezone.localtime(scope.since).date()
            last_day = timezone.localtime(scope.until - timedelta(microseconds=1)).date()
            days = self.size.days
            starts = [
                max(scope.since, midnight(self.first_day + timedelta(days=offset), zone))
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


@dataclass(frozen=True)
class UnknownTools:
    """The tool names in the figures that no agent may call (no tool of that name is
    registered: names a model invented), which the charts and the table show as one entry."""

    names: tuple[str, ...]

    @property
    def label(self) -> str:
        n = len(self.names)
        return f"unknown tools ({n} name{'s' if n != 1 else ''})"

    @property
    def note(self) -> str:
        return ", ".join(self.names)

    def of(self, tool: str) -> str:
        return self.label if tool in self.names else tool

    def drill(self, scope: Scope, tool: str, **drill: str) -> dict[str, str]:
        """The calls behind an entry: a tool's, or for the group those refused as unknown."""
        if tool == self.label and self.names:
            return scope.exact(**{**drill, "code": UNKNOWN_TOOL.name})
        return {**scope.exact(**drill), "tool": tool}


def unknown_tools(figures: CallFigures) -> UnknownTools:
    return UnknownTools(tuple(sorted(t for t in figures.by_tool if tool_registry.get(t) is None)))


def tools_grouped(figures: CallFigures, unknown: UnknownTools) -> CallFigures:
    """The figures with every unknown tool counted under one name (unknown.label)."""
    if not unknown.names:
        return figures
    grouped = CallFigures(
        total=figures.total, by_code=figures.by_code, by_bucket_code=figures.by_bucket_code
    )
    for tool, tally in figures.by_tool.items():
        _merge(grouped.by_tool[unknown.of(tool)], tally)
    for (tool, code), tally in figures.by_tool_code.items():
        _merge(grouped.by_tool_code[unknown.of(tool), code], tally)
    return grouped


def _merge(into: Tally, tally: Tally) -> None:
    into.calls += tally.calls
    into.rejected += tally.rejected
    into.replayed += tally.replayed
    into.correctable += tally.correctable
    into.recovered += tally.recovered


def _bucket_label(moment: datetime, size: timedelta) -> str:
    local = timezone.localtime(moment)
    return f"{local.day} {local:%b}" if size >= DAY else f"{local.day} {local:%b %H:%M}"


def _series(
    label: str, values: list[float], texts: list[str], urls: list[str], *, look: int | None = None
) -> dict[str, Any]:
    """`look` fixes the series' colour and pattern, so that it keeps them whatever else is shown."""
    return {"label": label, "values": values, "texts": texts, "urls": urls, "look": look}


def _chart(
    title: str,
    labels: list[str],
    series: list[dict[str, Any]],
    *,
    drawn: bool | None = None,
    notes: Mapping[str, str] | None = None,
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
            # What a category stands for, where its label does not say it all (the names of
            # the unknown tools).
            "note": (notes or {}).get(label, ""),
            "cells": [{"text": one["texts"][i], "url": one["urls"][i]} for one in series],
        }
        for i, label in enumerate(labels)
    ]
    return {"title": title, "labels": labels, "series": series, "rows": rows}


def chart_data(scope: Scope, figures: CallFigures, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    unknown = unknown_tools(figures)
    by_tool = tools_grouped(figures, unknown)
    return {
        "rejection_over_time": _rejection_over_time(scope, figures),
        "recovery_by_tool": _recovery_by_tool(scope, by_tool, unknown),
        "stuck_by_tool": _stuck_by_tool(scope, by_tool, unknown),
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
                    f"{percent(rate)} ({count(n)} of {count(all_calls)})"
                    for rate, n, all_calls in zip(rates, counts, per_bar, strict=True)
                ],
                [
                    url(
                        "analytics:calls",
                        Scope(bar.start, bar.end, "custom", scope.agent, scope.tool).exact(**drill),
                    )
                    for bar in buckets.bars
                ],
            )
        )
    return _chart("Rejection rate over time", [bar.label for bar in buckets.bars], series)


def _recovery_by_tool(scope: Scope, figures: CallFigures, unknown: UnknownTools) -> dict[str, Any]:
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
                    f"{percent(t.recovery_rate)} ({count(t.recovered)} of {count(t.correctable)})"
                    for t in tallies
                ],
                [
                    url("analytics:calls", unknown.drill(scope, tool, outcome="correctable"))
                    for tool in tools
                ],
            )
        ],
        # No recovery at all is a finding, not an empty chart.
        drawn=bool(tools),
        notes={unknown.label: unknown.note},
    )


def _stuck_by_tool(scope: Scope, figures: CallFigures, unknown: UnknownTools) -> dict[str, Any]:
    replays = {tool: tally.replayed for tool, tally in figures.by_tool.items() if tally.replayed}
    loops = figures.per_tool(LOOP_DETECTED.name)
    limits = figures.per_tool(STEP_LIMIT.name)
    tools = sorted(set(replays) | set(loops) | set(limits))
    # Each count out of the tool's calls in the range.
    of = {tool: figures.by_tool[tool].calls for tool in tools}
    series = [
        _series(
            label,
            [counts.get(tool, 0) for tool in tools],
            [f"{count(counts.get(tool, 0))} of {count(of[tool])} calls" for tool in tools],
            [url("analytics:calls", unknown.drill(scope, tool, **drill)) for tool in tools],
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
    return _chart(
        "Replays, loop detections and step limits by tool",
        tools,
        series,
        notes={unknown.label: unknown.note},
    )


def _confirmation_outcomes(scope: Scope, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    by_status = outcomes["by_status"]
    statuses = [str(status) for status in OUTCOMES if by_status.get(status)]
    held = sum(by_status[status] for status in statuses)
    return _chart(
        "Held calls by outcome",
        statuses,
        [
            _series(
                "held calls",
                [by_status[status] for status in statuses],
                [f"{count(by_status[status])} of {count(held)}" for status in statuses],
                [
                    url("analytics:calls", scope.exact(outcome="held", status=status))
                    for status in statuses
                ],
            )
        ],
    )


def _of_decisions(text: str, wait: Mapping[str, Any]) -> str:
    """A reviewer's time with the number of decisions it is of."""
    decided = wait.get("decided")
    if decided is None:
        return text
    return f"{text} (of {count(decided)} decision{'s' if decided != 1 else ''})"


def _decision_times(scope: Scope, outcomes: Mapping[str, Any]) -> dict[str, Any]:
    overall = outcomes["time_to_decision_seconds"]
    reviewers: dict[str, dict[str, Any]] = outcomes["by_reviewer"]
    labels, waits, urls = [], [], []
    if overall["p50"] is not None:
        labels.append("all held calls")
        waits.append(overall)
        urls.append(url("analytics:calls", scope.exact(outcome="held")))
    for name, wait in reviewers.items():
        labels.append(name)
        waits.append(wait)
        urls.append(url("analytics:calls", scope.exact(outcome="held", decided_by=name)))
    longest = max((wait["p90"] or 0.0 for wait in waits), default=0.0)
    unit, seconds = ("h", 3600) if longest >= 7200 else ("min", 60) if longest >= 120 else ("s", 1)
    chart = _chart(
        "Time to decision",
        labels,
        [
            _series(
                f"{label} ({unit})",
                [round((wait[key] or 0.0) / seconds, 2) for wait in waits],
                [_of_decisions(duration(wait[key]), wait) for wait in waits],
                urls,
            )
            for label, key in (("median", "p50"), ("90th percentile", "p90"))
        ],
        # Decisions within the second are still decisions.
        drawn=bool(waits),
    )
    chart["unit"] = unit
    return chart
