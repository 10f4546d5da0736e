"""The figures managers read: one module for the dashboard, the metrics API and the CSV.

Calls are counted in hourly and daily rollups (analytics.models.CallRollup, CallRollupDay), and
decisions on held calls in a daily histogram (DecisionRollup): a figure over a long range reads
its whole UTC days from the daily rows and only the hours at its ends from finer ones, so what it
reads grows with the range, not with the calls. To the rows the fills wrote it adds what was
recorded since the last fill, counted the same way (analytics/fills.py), so a figure is current
to the last call. What each figure means is analytics/counting.py's; the calls behind a figure
are read from the audit records themselves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, TypeVar

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from analytics.counting import NOT_REJECTED, Counts
from analytics.decisions import (
    BY_EXPIRY,
    REVIEWER_DECISIONS,
    decided,
    decision_bucket,
    decisions_counted,
    percentiles,
)
from analytics.fills import (
    CALLS,
    DECISIONS,
    FillMark,
    fill_mark,
    read_consistently,
    tail_counts,
    tail_decisions,
)
from analytics.models import CallRollup, CallRollupDay, DecisionRollup
from analytics.ranges import (
    DAY,
    HOUR,
    days_begin_at_utc_midnight,
    hour_after,
    hour_floor,
    midnight,
    utc_day,
    whole_utc_days,
)
from analytics.rollups import named
from dispatch.models import AuditRecord, Confirmation
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED
from dispatch.registry import tool_registry


@dataclass
class Tally:
    calls: int = 0
    rejected: int = 0
    replayed: int = 0
    correctable: int = 0
    recovered: int = 0

    @property
    def rejection_rate(self) -> float | None:
        return self.rejected / self.calls if self.calls else None

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.correctable if self.correctable else None

    def add(self, code: str, sums: Mapping[str, Any]) -> None:
        self.calls += sums["calls"]
        self.rejected += sums["calls"] if code not in NOT_REJECTED else 0
        self.replayed += sums["replayed"]
        self.correctable += sums["correctable"]
        self.recovered += sums["recovered"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "rejected": self.rejected,
            "rejection_rate": self.rejection_rate,
            "replayed": self.replayed,
            "correctable": self.correctable,
            "recovered": self.recovered,
            "recovery_rate": self.recovery_rate,
        }


@dataclass
class CallFigures:
    total: Tally = field(default_factory=Tally)
    by_tool: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_code: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_tool_code: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    # Calls per time bucket and code, for a chart of the rejection rate stacked by code.
    by_bucket_code: dict[tuple[datetime, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )

    def add(self, bucket: datetime, sums: Mapping[str, Any]) -> None:
        """Count a row of summed rollups: its tool's and code's, in its time bucket."""
        tool, code = sums["tool"], sums["code"]
        self.total.add(code, sums)
        self.by_tool[tool].add(code, sums)
        self.by_code[code].add(code, sums)
        self.by_tool_code[tool, code].add(code, sums)
        self.by_bucket_code[bucket, code] += sums["calls"]

    def per_tool(self, code: str) -> dict[str, int]:
        """How many calls of each tool ended with that code (loops, step limits)."""
        return {tool: tally.calls for (tool, c), tally in self.by_tool_code.items() if c == code}

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.as_dict(),
            "by_tool": {tool: tally.as_dict() for tool, tally in sorted(self.by_tool.items())},
            "by_code": {code: tally.as_dict() for code, tally in sorted(self.by_code.items())},
            "by_tool_and_code": [
                {"tool": tool, "code": code, **tally.as_dict()}
                for (tool, code), tally in sorted(self.by_tool_code.items())
            ],
            "replays_by_tool": {
                tool: tally.replayed for tool, tally in sorted(self.by_tool.items())
            },
            "loop_detections_by_tool": self.per_tool("LOOP_DETECTED"),
            "step_limits_by_tool": self.per_tool("STEP_LIMIT"),
            "over_time": [
                {"bucket": bucket.isoformat(), "code": code, "calls": calls}
                for (bucket, code), calls in sorted(self.by_bucket_code.items())
            ],
        }


def call_figures(
    *,
    since: datetime,
    until: datetime,
    agent_id: int | None = None,
    tool: str | None = None,
    bucket: timedelta | None = HOUR,
) -> CallFigures:
    """The call figures of the hours from `since` (rounded down) up to `until` (rounded up).

    Time buckets are hours under a day, calendar days in the reader's time zone from a day up;
    `bucket` None asks for the totals only. The database sums the rollups: what comes back is a
    row per tool and code, and per time bucket and code, however many calls the range holds.
    Whole UTC days are summed from the daily rows, unless the chart needs the hours in them
    (buckets under a day, or days of a time zone whose midnights are not UTC's). The calls
    recorded since the last fill are counted from their records."""
    return read_consistently(
        CALLS,
        lambda mark: _call_figures(mark, since, until, agent_id, tool, bucket),
    )


def _call_figures(
    mark: FillMark,
    since: datetime,
    until: datetime,
    agent_id: int | None,
    tool: str | None,
    bucket: timedelta | None,
) -> CallFigures:
    start, end = hour_floor(since), hour_after(until)
    if bucket is None or (bucket >= DAY and days_begin_at_utc_midnight(start, end)):
        first_day, last_day = whole_utc_days(start, end)
    else:
        first_day = last_day = utc_day(start)  # the chart needs every hour
    hourly = bucket is not None and bucket < DAY
    truncate = TruncHour if hourly else TruncDay
    hours = CallRollup.objects.filter(_outside_days("hour", start, end, first_day, last_day))
    figures = CallFigures()
    for sums in (
        _filtered(hours, agent_id, tool)
        .annotate(bucket=truncate("hour"))
        .values("bucket", "tool", "code")
        .annotate(**_SUMS)
        .order_by()
    ):
        figures.add(sums["bucket"], sums)
    days = CallRollupDay.objects.filter(day__gte=first_day, day__lt=last_day)
    for day_sums in _filtered(days, agent_id, tool).values("day", "tool", "code").annotate(**_SUMS):
        figures.add(midnight(day_sums["day"]), day_sums)
    if not mark.half_filled:  # the rows are what the release before counted, up to now
        _add_tail(figures, tail_counts(mark.last_id), (start, end), agent_id, tool, hourly)
    return figures


def _add_tail(
    figures: CallFigures,
    tail: Counts,
    hours: tuple[datetime, datetime],
    agent_id: int | None,
    tool: str | None,
    hourly: bool,
) -> None:
    """Count the tail's hours within [hours) in the figures, each in its time bucket."""
    zone = timezone.get_current_timezone()
    for (hour, agent, counted_tool, code), values in tail.items():
        if not hours[0] <= hour < hours[1]:
            continue
        if (agent_id is not None and agent != agent_id) or (
            tool is not None and counted_tool != tool
        ):
            continue
        key = hour if hourly else midnight(timezone.localtime(hour, zone).date(), zone)
        figures.add(key, {"tool": counted_tool, "code": code, **named(values)})


@dataclass(frozen=True)
class Freshness:
    """How far the fills have counted calls: the figures read the rest from the records."""

    # Calls that arrived before this are in the rollups (None: no fill has run).
    filled_until: datetime | None
    # When the last fill ran.
    filled_at: datetime | None
    # The rollups wait for a refill from the records (after an upgrade).
    half_filled: bool


def rollups_freshness() -> Freshness:
    mark = fill_mark(CALLS)
    return Freshness(mark.end_time, mark.last_modified, mark.half_filled)


_Row = TypeVar("_Row", CallRollup, CallRollupDay, DecisionRollup, Confirmation, AuditRecord)


def _filtered(rows: QuerySet[_Row], agent_id: int | None, tool: str | None) -> QuerySet[_Row]:
    if agent_id is not None:
        rows = rows.filter(agent_id=agent_id)
    if tool is not None:
        rows = rows.filter(tool=tool)
    return rows


def _outside_days(field: str, start: datetime, end: datetime, first_day: date, last_day: date) -> Q:
    """[start, end) but for the days from first_day up to last_day: two ranges an index reads."""
    days_start, days_end = midnight(first_day), midnight(last_day)
    return Q(**{f"{field}__gte": start, f"{field}__lt": min(days_start, end)}) | Q(
        **{f"{field}__gte": max(days_end, start), f"{field}__lt": end}
    )


_SUMS = {
    "calls": Sum("calls"),
    "replayed": Sum("replayed"),
    "correctable": Sum("correctable"),
    "recovered": Sum("recovered"),
}


def confirmation_outcomes(
    *, since: datetime, until: datetime, agent_id: int | None = None, tool: str | None = None
) -> dict[str, Any]:
    """Held calls created in the range: how they ended, and how long a decision took.

    The times are read from the daily histogram of decisions for the range's whole UTC days, and
    from the held calls themselves at its ends; percentiles are those of the buckets' middles
    (analytics/decisions.py says how close they are)."""
    held = held_in(since, until, agent_id, tool)
    by_status = {
        row["status"]: row["count"]
        for row in held.values("status").annotate(count=Count("pk")).order_by()
    }
    first_day, last_day = whole_utc_days(since, until)
    histograms = read_consistently(
        DECISIONS, lambda mark: _decision_days(mark, (first_day, last_day), agent_id, tool)
    )
    ends = held.filter(_outside_days("created_at", since, until, first_day, last_day))
    for decider, wait in decided(ends).iterator():
        histograms[decider or BY_EXPIRY][decision_bucket(wait.total_seconds())] += 1
    overall: dict[int, int] = defaultdict(int)
    for histogram in histograms.values():
        for bucket, decisions in histogram.items():
            overall[bucket] += decisions
    return {
        "by_status": dict(sorted(by_status.items())),
        "time_to_decision_seconds": percentiles(overall),
        "by_reviewer": {
            reviewer: {"decided": sum(histogram.values()), **percentiles(histogram)}
            for reviewer, histogram in sorted(histograms.items())
            if reviewer != BY_EXPIRY
        },
    }


Histograms = dict[str, dict[int, int]]


def _decision_days(
    mark: FillMark, days: tuple[date, date], agent_id: int | None, tool: str | None
) -> Histograms:
    """The decision times of the held calls of the whole UTC days [days), by who decided: from
    the histogram's rows, and from the events since the last fill."""
    histograms: Histograms = defaultdict(lambda: defaultdict(int))
    rows = DecisionRollup.objects.filter(day__gte=days[0], day__lt=days[1])
    for decided_by, bucket, decisions in (
        _filtered(rows, agent_id, tool)
        .values_list("decided_by", "bucket")
        .annotate(Sum("decisions"))
        .order_by()
    ):
        histograms[decided_by][bucket] += decisions
    if days[0] < days[1] and not mark.half_filled:
        where: dict[str, Any] = {}
        if agent_id is not None:
            where["confirmation__agent_id"] = agent_id
        if tool is not None:
            where["confirmation__tool"] = tool
        created = (midnight(days[0]), midnight(days[1]))
        since_fill = tail_decisions(mark.last_id, created=created, **where)
        for (_, _, _, decided_by, bucket), count in decisions_counted(since_fill).items():
            histograms[decided_by][bucket] += count
    return histograms


def held_count(
    *, since: datetime, until: datetime, agent_id: int | None = None, tool: str | None = None
) -> int:
    """How many calls were held in the range: confirmation_outcomes' by_status summed, for a
    comparison that needs nothing more."""
    return held_in(since, until, agent_id, tool).count()


def held_in(
    since: datetime, until: datetime, agent_id: int | None, tool: str | None
) -> QuerySet[Confirmation]:
    """The calls held in the range, of one agent and one tool or all."""
    held = Confirmation.objects.filter(created_at__gte=since, created_at__lt=until)
    return _filtered(held, agent_id, tool)


# The calls behind a figure -----------------------------------------------------------------------


def calls_behind(
    *,
    since: datetime,
    until: datetime,
    agent_id: int | None = None,
    tool: str | None = None,
    code: str | None = None,
    rejected: bool = False,
    correctable: bool = False,
    replayed: bool = False,
) -> QuerySet[AuditRecord]:
    """The audit records a figure of call_figures over the same range counts: the calls of the
    hours from `since` (rounded down) to `until`, as call_figures reads them."""
    records = AuditRecord.objects.filter(at__gte=hour_floor(since), at__lt=hour_after(until))
    records = _filtered(records, agent_id, tool)
    if code is not None:
        records = records.filter(code=code)
    if rejected:
        records = records.exclude(code__in=NOT_REJECTED)
    if correctable:
        # As the rollups count them: a fixable rejection of a call that took a step.
        fixable = tool_registry.catalogue.model_fixable()
        records = records.filter(code__in=fixable, step__isnull=False)
    if replayed:
        records = records.filter(replayed=True)
    return records


def calls_narrowed(
    records: QuerySet[AuditRecord],
    *,
    customer: str | None = None,
    session: str | None = None,
    channel: str | None = None,
    search: str | None = None,
) -> QuerySet[AuditRecord]:
    """The records of one customer, session or channel, or whose raw arguments contain the text
    (any case). On PostgreSQL the search reads the trigram index audit_raw_arguments_trgm, built
    on the same upper-cased text, so it stays fast on a long audit trail."""
    if customer:
        records = records.filter(customer_id=customer)
    if session:
        records = records.filter(session_id=session)
    if channel:
        records = records.filter(channel=channel)
    if search:
        records = records.filter(raw_arguments__icontains=search)
    return records


def held_calls_behind(
    *,
    since: datetime,
    until: datetime,
    agent_id: int | None = None,
    tool: str | None = None,
    status: str | None = None,
    decided_by: str | None = None,
) -> QuerySet[AuditRecord]:
    """The calls that created the confirmations confirmation_outcomes counts over the same range,
    optionally only those now in `status` or decided by the reviewer named `decided_by`."""
    held = held_in(since, until, agent_id, tool)
    if status is not None:
        held = held.filter(status=status)
    if decided_by is not None:
        held = held.filter(
            decided_at__isnull=False,
            events__kind__in=REVIEWER_DECISIONS,
            events__actor_label=decided_by,
        )
    # An identical call while it is pending is a replay naming the same confirmation. The call
    # that held it was recorded moments before the confirmation was made: bounding the records
    # by time lets the database skip the rest of the audit table.
    return AuditRecord.objects.filter(
        at__gte=since - HOUR,
        at__lt=until + HOUR,
        confirmation_id__in=held.values("id"),
        code=CONFIRMATION_REQUIRED.name,
        replayed=False,
    )
