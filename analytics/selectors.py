"""The figures managers read: one module for the dashboard, the metrics API and the simulator.

Calls are counted in hourly and daily rollups (dispatch.models.CallRollup, CallRollupDay) as they
are written, and decisions on held calls in a daily histogram (DecisionRollup) as they are made:
a figure over a long range reads its whole UTC days from the daily rows and only the hours at its
ends from finer ones, so what it reads grows with the range, not with the calls. Definitions
(../shared/PRODUCT.md, "Audit and metrics"):

- rejected: not ok and not held for confirmation;
- recovery: of the rejections whose code the model can fix, the share followed within the next 3
  calls of the same session by a call to the same tool that passes validation (ok, or held).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from itertools import islice
from time import monotonic
from typing import Any, TypeVar

from django.db import DatabaseError, connection, transaction
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FilteredRelation,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from analytics.models import CallRollup, CallRollupDay, DecisionRollup, PendingRecovery
from dispatch.models import AuditRecord, Confirmation
from dispatch.pipeline import codes
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    TWO_REVIEWERS,
    Confirmed,
    PastCall,
    WhatIf,
    replay_from,
    what_if_of,
)
from dispatch.registry import tool_registry

NOT_REJECTED = frozenset({OK.name, CONFIRMATION_REQUIRED.name})
# A rejection counts as recovered when one of this many calls after it, in the same session, is a
# call to the same tool that passes validation.
RECOVERY_WINDOW = 3


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
    bucket: timedelta | None = timedelta(hours=1),
) -> CallFigures:
    """The call figures of the hours from `since` (rounded down) up to `until` (rounded up).

    Time buckets are hours under a day, calendar days in the reader's time zone from a day up;
    `bucket` None asks for the totals only. The database sums the rollups: what comes back is a
    row per tool and code, and per time bucket and code, however many calls the range holds.
    Whole UTC days are summed from the daily rows, unless the chart needs the hours in them
    (buckets under a day, or days of a time zone whose midnights are not UTC's)."""
    start, end = _hour(since), _hour_after(until)
    if bucket is None or (bucket >= DAY and _days_are_utc(start, end)):
        first_day, last_day = _whole_days(start, end)
    else:
        first_day = last_day = _utc_day(start)  # the chart needs every hour
    truncate = TruncHour if bucket is not None and bucket < DAY else TruncDay
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
        figures.add(_midnight(day_sums["day"]), day_sums)
    return figures


DAY = timedelta(days=1)
_Row = TypeVar("_Row", CallRollup, CallRollupDay, DecisionRollup, Confirmation)


def _filtered(rows: QuerySet[_Row], agent_id: int | None, tool: str | None) -> QuerySet[_Row]:
    if agent_id is not None:
        rows = rows.filter(agent_id=agent_id)
    if tool is not None:
        rows = rows.filter(tool=tool)
    return rows


def _whole_days(start: datetime, end: datetime) -> tuple[date, date]:
    """The UTC days wholly inside [start, end): from the first up to the last, excluded."""
    first = start.astimezone(UTC).date()
    if _midnight(first) < start:
        first += DAY
    return first, max(first, end.astimezone(UTC).date())


def _outside_days(field: str, start: datetime, end: datetime, first_day: date, last_day: date) -> Q:
    """[start, end) but for the days from first_day up to last_day: two ranges an index reads."""
    days_start, days_end = _midnight(first_day), _midnight(last_day)
    return Q(**{f"{field}__gte": start, f"{field}__lt": min(days_start, end)}) | Q(
        **{f"{field}__gte": max(days_end, start), f"{field}__lt": end}
    )


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def _days_are_utc(start: datetime, end: datetime) -> bool:
    """Whether the reader's calendar days in [start, end) begin at UTC midnights."""
    moment = start
    while moment <= end:
        if timezone.localtime(moment).utcoffset():
            return False
        moment += DAY
    return True


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
    (decision_bucket says how close they are)."""
    held = _filtered(
        Confirmation.objects.filter(created_at__gte=since, created_at__lt=until), agent_id, tool
    )
    by_status = {
        row["status"]: row["count"]
        for row in held.values("status").annotate(count=Count("pk")).order_by()
    }
    first_day, last_day = _whole_days(since, until)
    histograms: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    days = DecisionRollup.objects.filter(day__gte=first_day, day__lt=last_day)
    for decided_by, bucket, decisions in (
        _filtered(days, agent_id, tool)
        .values_list("decided_by", "bucket")
        .annotate(Sum("decisions"))
        .order_by()
    ):
        histograms[decided_by][bucket] += decisions
    ends = held.filter(_outside_days("created_at", since, until, first_day, last_day))
    for decider, wait in _decided(ends).iterator():
        histograms[decider or BY_EXPIRY][decision_bucket(wait.total_seconds())] += 1
    overall: dict[int, int] = defaultdict(int)
    for histogram in histograms.values():
        for bucket, decisions in histogram.items():
            overall[bucket] += decisions
    return {
        "by_status": dict(sorted(by_status.items())),
        "time_to_decision_seconds": _percentiles(overall),
        "by_reviewer": {
            reviewer: {"decided": sum(histogram.values()), **_percentiles(histogram)}
            for reviewer, histogram in sorted(histograms.items())
            if reviewer != BY_EXPIRY
        },
    }


# The events that say who decided a held call; an expiry is nobody's decision.
DECISION_EVENTS = ("approved", "rejected", "invalidated")
BY_EXPIRY = ""

# Decision times are counted in buckets that double every BUCKETS_PER_DOUBLING: bucket 0 is under
# a second, bucket k from 2^((k-1)/8) up to 2^(k/8) seconds, the last one open-ended (194 days).
BUCKETS_PER_DOUBLING = 8
LAST_BUCKET = 24 * BUCKETS_PER_DOUBLING + 1


def decision_bucket(seconds: float) -> int:
    """The histogram bucket of a decision time. The middle of a bucket (decision_seconds) is
    within 4.5 % of every time in it (2^(1/16)), or within half a second under a second."""
    if seconds < 1:
        return 0
    return min(1 + math.floor(BUCKETS_PER_DOUBLING * math.log2(seconds)), LAST_BUCKET)


def decision_seconds(bucket: int) -> float:
    """The time a bucket stands for: its middle on the log scale."""
    if bucket == 0:
        return 0.5
    return float(2 ** ((bucket - 0.5) / BUCKETS_PER_DOUBLING))


def decision_count(*, confirmation: Confirmation, decided_by: str) -> None:
    """Count a decision in its day's histogram, in the decision's own transaction."""
    assert confirmation.decided_at is not None
    with connection.cursor() as cursor:
        cursor.execute(
            _DECISION_COUNT,
            {
                "day": connection.ops.adapt_datefield_value(_utc_day(confirmation.created_at)),
                "agent_id": confirmation.agent_id,
                "tool": confirmation.tool,
                "decided_by": decided_by,
                "bucket": decision_bucket(
                    _seconds(confirmation.created_at, confirmation.decided_at)
                ),
            },
        )


_DECISION_COUNT = """
    INSERT INTO dispatch_decisionrollup AS rollup
        (day, agent_id, tool, decided_by, bucket, decisions)
    VALUES (%(day)s, %(agent_id)s, %(tool)s, %(decided_by)s, %(bucket)s, 1)
    ON CONFLICT (day, agent_id, tool, decided_by, bucket) DO UPDATE
        SET decisions = rollup.decisions + 1
"""


def _decided(held: QuerySet[Confirmation], *fields: str) -> QuerySet[Confirmation, Any]:
    """Of each decided held call, the `fields` asked for, who decided it (None for an expiry)
    and how long it took."""
    return (
        held.filter(decided_at__isnull=False)
        .annotate(
            decision=FilteredRelation("events", condition=Q(events__kind__in=DECISION_EVENTS)),
            decider=F("decision__actor_label"),
            wait=ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField()),
        )
        .order_by()
        .values_list(*fields, "decider", "wait")
    )


def _utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def _seconds(created: datetime, decided: datetime | None) -> float:
    assert decided is not None  # filtered on
    return (decided - created).total_seconds()


def _percentiles(histogram: Mapping[int, int]) -> dict[str, float | None]:
    """The median and the 90th percentile as statistics.quantiles(method="inclusive") computes
    them, of the buckets' middles."""
    count = sum(histogram.values())
    if not count:
        return {"p50": None, "p90": None}
    ordered = sorted(histogram.items())

    def at(rank: int) -> float:
        for bucket, decisions in ordered:
            if rank < decisions:
                return decision_seconds(bucket)
            rank -= decisions
        raise AssertionError("a rank beyond the count")  # pragma: no cover

    def quantile(share: float) -> float:
        position = (count - 1) * share
        low = math.floor(position)
        below, above = at(low), at(min(low + 1, count - 1))
        return below + (above - below) * (position - low)

    return {"p50": quantile(0.5), "p90": quantile(0.9)}


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


# The recovery rate from the audit records themselves ---------------------------------------------
#
# What the rollups count as calls are written, computed from the records of a range: what
# simulate_agents reports of its own run, and what the rollups are tested against.

# Sessions whose calls are read in one query.
_SESSIONS_PER_QUERY = 500

_PASSES = codes.CONFIRMATION_REQUIRED.name
_Key = TypeVar("_Key", str, tuple[str, str])


@dataclass(frozen=True, slots=True)
class Recovery:
    """Fixable rejections, and how many of them the model recovered from."""

    rejected: int = 0
    recovered: int = 0

    @property
    def rate(self) -> float | None:
        """The share recovered, from 0 to 1; None when nothing fixable was rejected."""
        return self.recovered / self.rejected if self.rejected else None

    def __add__(self, other: Recovery) -> Recovery:
        return Recovery(self.rejected + other.rejected, self.recovered + other.recovered)


@dataclass(frozen=True)
class RecoveryRate:
    overall: Recovery = Recovery()
    by_code: dict[str, Recovery] = field(default_factory=dict)
    by_tool: dict[str, Recovery] = field(default_factory=dict)
    by_tool_and_code: dict[tuple[str, str], Recovery] = field(default_factory=dict)


# (id, agent id, session id, when, tool, ok, code) of one audit record.
_Call = tuple[int, int, str, datetime, str, bool, str]
_COLUMNS = ("id", "agent_id", "session_id", "at", "tool", "ok", "code")


def recovery_rate(
    *, start: datetime, end: datetime, agent_id: int | None = None, tool: str | None = None
) -> RecoveryRate:
    """Of the rejected calls in [start, end) whose code the model can fix, the share followed
    within the next RECOVERY_WINDOW calls of the same session by a call to the same tool that
    passes validation (ok, or held for confirmation); by code, by tool, and both.

    The calls that follow a rejection are read whenever they came, so a rejection just before
    `end` may still count as recovered by a call after it. The filters choose the rejections;
    the calls after one are any of its session's, whatever their tool.
    """
    fixable = tool_registry.catalogue.model_fixable() - {_PASSES}
    rejections = AuditRecord.objects.filter(
        at__gte=start, at__lt=end, ok=False, code__in=fixable
    ).order_by("at", "id")
    if agent_id is not None:
        rejections = rejections.filter(agent_id=agent_id)
    if tool is not None:
        rejections = rejections.filter(tool=tool)

    by_session: dict[tuple[int, str], list[_Call]] = defaultdict(list)
    for call in rejections.values_list(*_COLUMNS).iterator():
        by_session[(call[1], call[2])].append(call)

    tally: dict[tuple[str, str], Recovery] = defaultdict(Recovery)
    for session, calls in _sessions_calls(by_session):
        rejected_ids = {call[0] for call in by_session[session]}
        for index, call in enumerate(calls):
            if call[0] not in rejected_ids:
                continue
            window = islice(calls, index + 1, index + 1 + RECOVERY_WINDOW)
            recovered = any(later[4] == call[4] and _passes(later) for later in window)
            tally[(call[4], call[6])] += Recovery(1, int(recovered))

    return _summed(tally)


def _passes(call: _Call) -> bool:
    return call[5] or call[6] == _PASSES


def _sessions_calls(
    rejections: dict[tuple[int, str], list[_Call]],
) -> Iterator[tuple[tuple[int, str], list[_Call]]]:
    """Each session with a rejection, and its calls from its first rejection on, in order."""
    sessions = list(rejections)
    for offset in range(0, len(sessions), _SESSIONS_PER_QUERY):
        chunk = sessions[offset : offset + _SESSIONS_PER_QUERY]
        wanted = set(chunk)
        calls = (
            AuditRecord.objects.filter(
                agent_id__in={agent for agent, _ in chunk},
                session_id__in={session for _, session in chunk},
                at__gte=min(rejections[session][0][3] for session in chunk),
            )
            .order_by("agent_id", "session_id", "at", "id")
            .values_list(*_COLUMNS)
        )
        found: dict[tuple[int, str], list[_Call]] = defaultdict(list)
        for call in calls.iterator():
            session = (call[1], call[2])
            if session in wanted:
                found[session].append(call)
        yield from found.items()


def _summed(tally: dict[tuple[str, str], Recovery]) -> RecoveryRate:
    by_code: dict[str, Recovery] = defaultdict(Recovery)
    by_tool: dict[str, Recovery] = defaultdict(Recovery)
    for (tool, code), recovery in tally.items():
        by_code[code] += recovery
        by_tool[tool] += recovery
    return RecoveryRate(
        overall=sum(tally.values(), Recovery()),
        by_code=_sorted(by_code.items()),
        by_tool=_sorted(by_tool.items()),
        by_tool_and_code=_sorted(tally.items()),
    )


def _sorted(items: Iterable[tuple[_Key, Recovery]]) -> dict[_Key, Recovery]:
    return dict(sorted(items, key=lambda item: item[0]))


# What a policy change would have done ------------------------------------------------------------


# The codes of the calls a what-if judges again, and the outcome each records.
RECORDED_OUTCOMES = {
    OK.name: AUTO_EXECUTED,
    CONFIRMATION_REQUIRED.name: ONE_REVIEWER,
    codes.POLICY_LIMIT.name: REFUSED,
}
# Rows a what-if reads from the database at a time: its memory holds no more than these and the
# money that counts at the moment it reached.
WHAT_IF_CHUNK = 2_000


class RangeTooHeavy(Exception):
    """The range holds more calls than can be judged within the time a manager's request has."""


def policy_what_if(
    *,
    agent_id: int,
    since: datetime,
    until: datetime,
    draft: Policy,
    deadline: float | None = None,
) -> WhatIf:
    """The agent's recorded money-moving calls in the range, judged again under `draft`, beside
    what really happened to them. Every agent's calls from before the range (as far back as the
    draft's sums reach) to its end are read once, in time order, in chunks; the others count in
    the sums by what happened to them (dispatch/pipeline/what_if.py). Reads only.

    `deadline` (time.monotonic()) bounds the whole replay: past it, RangeTooHeavy; so does a
    statement the database cancelled (a manager's request runs under a statement timeout)."""
    statement, params = _money_calls_sql(replay_from(draft, since), until)
    try:
        # A server-side cursor streams only inside a transaction (outside one, PostgreSQL would
        # keep the whole result to hold it open).
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Every row is read: plan for all of them, not for the first few as a cursor
                # does (an index scan in time order took a quarter longer than a sort).
                with connection.cursor() as setting:
                    setting.execute("SELECT set_config('cursor_tuple_fraction', '1', true)")
            with connection.chunked_cursor() as cursor:
                cursor.execute(statement, params)
                calls = _past_calls(
                    cursor, agent_id=agent_id, since=since, until=until, deadline=deadline
                )
                return what_if_of(draft, calls)
    except DatabaseError as error:
        if statement_cancelled(error):
            raise RangeTooHeavy(str(error).strip()) from error
        raise


def statement_cancelled(error: BaseException) -> bool:
    """Whether the database stopped a statement that ran out of time: PostgreSQL's statement
    timeout (query_canceled), or SQLite's progress handler interrupting it."""
    cause = error.__cause__ or error
    return getattr(cause, "sqlstate", None) == "57014" or (
        connection.vendor == "sqlite" and "interrupted" in str(cause)
    )


def _money_calls_sql(start: datetime, until: datetime) -> tuple[str, list[Any]]:
    """Every agent's money-moving calls in [start, until), in the order they arrived, with what
    became of the held ones, in one statement; only the columns a replay needs (the arguments'
    subject, currency and amount, by what each tool declares)."""
    audit = connection.ops.quote_name(AuditRecord._meta.db_table)
    held = connection.ops.quote_name(Confirmation._meta.db_table)
    moving = [spec for spec in tool_registry if spec.amount_field is not None]
    params: list[Any] = []
    arguments = []
    for kind in ("subject_field", "currency_field", "amount_field"):
        cases = []
        for spec in moving:
            field = getattr(spec, kind)
            if field is not None:
                cases.append(f"WHEN %s THEN {_argument_sql()}")
                params += [spec.name, _argument_path(field)]
        arguments.append(f"CASE a.tool {' '.join(cases)} END" if cases else "NULL")
    params.append(CONFIRMATION_REQUIRED.name)
    params += [start, until, *RECORDED_OUTCOMES, *(spec.name for spec in moving)]
    moments = ", ".join(_moment_sql(column) for column in _MOMENTS)
    statement = f"""
        SELECT a.call_id, a.agent_id, a.session_id, a.customer_id, a.tool, a.code,
            {", ".join(arguments)}, c.status, c.reviewers_required, {moments}
        FROM {audit} a
        LEFT JOIN {held} c ON c.id = a.confirmation_id AND a.code = %s
        WHERE a.at >= %s AND a.at < %s AND NOT a.replayed AND a.arguments IS NOT NULL
            AND a.code IN ({", ".join(["%s"] * len(RECORDED_OUTCOMES))})
            AND a.tool IN ({", ".join(["%s"] * len(moving)) or "NULL"})
        ORDER BY a.at, a.id
    """
    return statement, params


# The moments a replay reads: the call's, and its confirmation's expiry, decision and end.
_MOMENTS = ("a.at", "c.expires_at", "c.decided_at", "c.finished_at")


def _moment_sql(column: str) -> str:
    # On PostgreSQL as seconds since the epoch: a float is read in C, where a timestamp is read
    # by Django's time zone loader in Python, which took a third of a 30-day what-if.
    if connection.vendor == "postgresql":
        return f"date_part('epoch', {column})"
    return column


def _argument_sql() -> str:
    # One argument of the validated call, as text (a number as its digits).
    if connection.vendor == "postgresql":
        return "a.arguments ->> %s"
    return "json_extract(a.arguments, %s)"


def _argument_path(field: str) -> str:
    return field if connection.vendor == "postgresql" else f'$."{field}"'


def _past_calls(
    cursor: Any, *, agent_id: int, since: datetime, until: datetime, deadline: float | None
) -> Iterator[PastCall]:
    chosen = str(agent_id)
    moment = _from_epoch if connection.vendor == "postgresql" else _aware
    while rows := cursor.fetchmany(WHAT_IF_CHUNK):
        if deadline is not None and monotonic() > deadline:
            raise RangeTooHeavy(f"the replay had not reached {until.isoformat()} in time")
        for (
            call_id,
            agent,
            session_id,
            customer_id,
            tool,
            code,
            subject,
            currency,
            amount,
            status,
            reviewers,
            at,
            expires_at,
            decided_at,
            finished_at,
        ) in rows:
            if amount is None:
                continue
            at = moment(at)
            outcome = RECORDED_OUTCOMES[code]
            confirmation = None
            if status is not None:
                confirmation = Confirmed(
                    status,
                    moment(expires_at),
                    None if decided_at is None else moment(decided_at),
                    None if finished_at is None else moment(finished_at),
                    reviewers,
                )
                if outcome == ONE_REVIEWER and reviewers == 2:
                    outcome = TWO_REVIEWERS
            agent = str(agent)
            yield PastCall(
                at,
                agent,
                session_id,
                customer_id,
                tool,
                str(subject or ""),
                str(currency or ""),
                int(amount),
                outcome,
                call_id,
                agent == chosen and at >= since,
                confirmation,
            )


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _aware(value: Any) -> datetime:
    # SQLite returns naive datetimes in UTC, or text.
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# Rebuilding ------------------------------------------------------------------------------------

# calls, replayed, correctable, recovered: per hour or day, agent, tool and code.
Counts = dict[tuple[datetime, int, str, str], list[int]]
DayCounts = dict[tuple[date, int, str, str], list[int]]
# decisions per day, agent, tool, who decided and bucket.
DecisionCounts = dict[tuple[date, int, str, str, int], int]


@dataclass(frozen=True)
class Rollups:
    hours: Counts
    days: DayCounts
    decisions: DecisionCounts

    def differences(self, other: Rollups) -> list[str]:
        """The rows that differ, each as its key and both values, this one's first."""
        found = []
        for name in ("hours", "days", "decisions"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    found.append(f"{name} {key}: {mine.get(key)}, {theirs.get(key)}")
        return found


def rollups_rebuilt(records: Iterable[AuditRecord]) -> tuple[Rollups, list[PendingRecovery]]:
    """The rollups, and the rejections still waiting for a fix, computed from audit records
    given in order of agent, session and step, and from the held calls' decisions: what the
    live counting must have arrived at."""
    hours, waiting = _hours_from_audit(records)
    return Rollups(hours, _days_of(hours), _decisions_of_held()), waiting


def _hours_from_audit(records: Iterable[AuditRecord]) -> tuple[Counts, list[PendingRecovery]]:
    model_fixable = tool_registry.catalogue.model_fixable()
    counts: Counts = defaultdict(lambda: [0, 0, 0, 0])  # calls, replayed, correctable, recovered
    waiting: list[PendingRecovery] = []
    for _, calls in _sessions(records):
        pending: list[AuditRecord] = []
        for record in calls:
            hour = _hour(record.at)
            step = record.step or 0
            row = counts[hour, record.agent_id, record.tool, record.code]
            row[0] += 1
            row[1] += int(record.replayed)
            passes = record.ok or record.code == CONFIRMATION_REQUIRED.name
            still = []
            for rejection in pending:
                if (rejection.step or 0) < step - RECOVERY_WINDOW:
                    continue  # its next calls passed it by
                if passes and rejection.tool == record.tool:
                    key = (_hour(rejection.at), rejection.agent_id, rejection.tool, rejection.code)
                    counts[key][3] += 1
                    continue
                still.append(rejection)
            pending = still
            if not passes and record.code in model_fixable and record.step is not None:
                row[2] += 1
                pending.append(record)
        waiting.extend(
            PendingRecovery(
                agent_id=r.agent_id,
                session_id=r.session_id,
                step=r.step or 0,
                tool=r.tool,
                code=r.code,
                hour=_hour(r.at),
            )
            for r in pending
        )
    return dict(counts), waiting


def _days_of(hours: Counts) -> DayCounts:
    days: DayCounts = defaultdict(lambda: [0, 0, 0, 0])
    for (hour, agent_id, tool, code), values in hours.items():
        row = days[_utc_day(hour), agent_id, tool, code]
        for index, value in enumerate(values):
            row[index] += value
    return dict(days)


def _decisions_of_held() -> DecisionCounts:
    counts: DecisionCounts = defaultdict(int)
    decided = _decided(Confirmation.objects.all(), "created_at", "agent_id", "tool")
    for created, agent_id, tool, decider, wait in decided.iterator():
        bucket = decision_bucket(wait.total_seconds())
        counts[_utc_day(created), agent_id, tool, decider or BY_EXPIRY, bucket] += 1
    return dict(counts)


SessionKey = tuple[int, str]


def _sessions(records: Iterable[AuditRecord]) -> Iterator[tuple[SessionKey, list[AuditRecord]]]:
    current: SessionKey | None = None
    calls: list[AuditRecord] = []
    for record in records:
        session = (record.agent_id, record.session_id)
        if session != current:
            if current is not None:
                yield current, calls
            current, calls = session, []
        calls.append(record)
    if current is not None:
        yield current, calls


def audit_in_session_order() -> QuerySet[AuditRecord]:
    return AuditRecord.objects.order_by("agent_id", "session_id", "step", "at", "id").only(
        "agent_id", "session_id", "step", "tool", "code", "ok", "replayed", "at"
    )


@transaction.atomic
def rollups_replace(rollups: Rollups, waiting: list[PendingRecovery]) -> None:
    """Put the rebuilt rollups in place of the live ones, in one transaction."""
    for model in (CallRollup, CallRollupDay, DecisionRollup, PendingRecovery):
        model.objects.all().delete()
    CallRollup.objects.bulk_create(
        (
            CallRollup(hour=hour, agent_id=agent_id, tool=tool, code=code, **_named(values))
            for (hour, agent_id, tool, code), values in rollups.hours.items()
        ),
        batch_size=2000,
    )
    CallRollupDay.objects.bulk_create(
        (
            CallRollupDay(day=day, agent_id=agent_id, tool=tool, code=code, **_named(values))
            for (day, agent_id, tool, code), values in rollups.days.items()
        ),
        batch_size=2000,
    )
    DecisionRollup.objects.bulk_create(
        (
            DecisionRollup(
                day=day,
                agent_id=agent_id,
                tool=tool,
                decided_by=decided_by,
                bucket=bucket,
                decisions=decisions,
            )
            for (day, agent_id, tool, decided_by, bucket), decisions in rollups.decisions.items()
        ),
        batch_size=2000,
    )
    PendingRecovery.objects.bulk_create(waiting, batch_size=2000)


_COUNTED = ("calls", "replayed", "correctable", "recovered")


def _named(values: list[int]) -> dict[str, int]:
    return dict(zip(_COUNTED, values, strict=True))


def rollups_live() -> Rollups:
    return Rollups(
        hours={
            (hour, agent_id, tool, code): list(values)
            for hour, agent_id, tool, code, *values in CallRollup.objects.values_list(
                "hour", "agent_id", "tool", "code", *_COUNTED
            )
        },
        days={
            (day, agent_id, tool, code): list(values)
            for day, agent_id, tool, code, *values in CallRollupDay.objects.values_list(
                "day", "agent_id", "tool", "code", *_COUNTED
            )
        },
        decisions={
            (day, agent_id, tool, decided_by, bucket): decisions
            for day, agent_id, tool, decided_by, bucket, decisions in (
                DecisionRollup.objects.values_list(
                    "day", "agent_id", "tool", "decided_by", "bucket", "decisions"
                )
            )
        },
    )


# Drilldowns ------------------------------------------------------------------------------------


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
    records = AuditRecord.objects.filter(at__gte=_hour(since), at__lt=_hour_after(until))
    if agent_id is not None:
        records = records.filter(agent_id=agent_id)
    if tool is not None:
        records = records.filter(tool=tool)
    if code is not None:
        records = records.filter(code=code)
    if rejected:
        records = records.exclude(code__in=NOT_REJECTED)
    if correctable:
        # As the rollups count them: a fixable rejection of a call that took a step.
        from dispatch.registry import tool_registry

        fixable = tool_registry.catalogue.model_fixable()
        records = records.filter(code__in=fixable, step__isnull=False)
    if replayed:
        records = records.filter(replayed=True)
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
    held = _held_in(since, until, agent_id, tool)
    if status is not None:
        held = held.filter(status=status)
    if decided_by is not None:
        held = held.filter(
            decided_at__isnull=False,
            events__kind__in=DECISION_EVENTS,
            events__actor_label=decided_by,
        )
    # An identical call while it is pending is a replay naming the same confirmation. The call
    # that held it was recorded moments before the confirmation was made: bounding the records
    # by time lets the database skip the rest of the audit table.
    return AuditRecord.objects.filter(
        at__gte=since - timedelta(hours=1),
        at__lt=until + timedelta(hours=1),
        confirmation_id__in=held.values("id"),
        code=CONFIRMATION_REQUIRED.name,
        replayed=False,
    )


def _hour_after(moment: datetime) -> datetime:
    """The end of the hour `moment` falls in, unless it is an hour already: a rollup row whose
    hour starts before `until` counts all of that hour."""
    start = _hour(moment)
    return start if start == moment else start + timedelta(hours=1)


def held_count(
    *, since: datetime, until: datetime, agent_id: int | None = None, tool: str | None = None
) -> int:
    """How many calls were held in the range: confirmation_outcomes' by_status summed, for a
    comparison that needs nothing more."""
    return _held_in(since, until, agent_id, tool).count()


def _held_in(
    since: datetime, until: datetime, agent_id: int | None, tool: str | None
) -> QuerySet[Confirmation]:
    held = Confirmation.objects.filter(created_at__gte=since, created_at__lt=until)
    if agent_id is not None:
        held = held.filter(agent_id=agent_id)
    if tool is not None:
        held = held.filter(tool=tool)
    return held
