"""The figures managers read: one module for the dashboard, the metrics API and the simulator.

Calls are counted in hourly rollups (dispatch.models.CallRollup) as they are written, so a figure
over any range reads a few thousand rows whatever the number of calls. Definitions
(../shared/PRODUCT.md, "Audit and metrics"):

- rejected: not ok and not held for confirmation;
- recovery: of the rejections whose code the model can fix, the share followed within the next 3
  calls of the same session by a call to the same tool that passes validation (ok, or held).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour

from dispatch.models import AuditRecord, CallRollup, Confirmation, PendingRecovery
from dispatch.pipeline import codes
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.what_if import (
    AUTO_EXECUTED,
    ONE_REVIEWER,
    REFUSED,
    TWO_REVIEWERS,
    PastCall,
    WhatIf,
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
    bucket: timedelta = timedelta(hours=1),
) -> CallFigures:
    """The call figures of the hours from `since` up to `until` (rounded down to the hour).

    The database sums the rollups: what comes back is a row per tool and code, and per time
    bucket and code, however many calls the range holds."""
    figures = CallFigures()
    truncate = TruncDay if bucket >= timedelta(days=1) else TruncHour
    sums_per_bucket = (
        _rollups(since, until, agent_id, tool)
        .annotate(bucket=truncate("hour"))
        .values("bucket", "tool", "code")
        .annotate(**_SUMS)
        .order_by()
    )
    rows: Iterable[Mapping[str, Any]] = sums_per_bucket
    for sums in rows:
        tool_name, code = sums["tool"], sums["code"]
        figures.total.add(code, sums)
        figures.by_tool[tool_name].add(code, sums)
        figures.by_code[code].add(code, sums)
        figures.by_tool_code[tool_name, code].add(code, sums)
        figures.by_bucket_code[sums["bucket"], code] += sums["calls"]
    return figures


_SUMS = {
    "calls": Sum("calls"),
    "replayed": Sum("replayed"),
    "correctable": Sum("correctable"),
    "recovered": Sum("recovered"),
}


def confirmation_outcomes(
    *, since: datetime, until: datetime, agent_id: int | None = None, tool: str | None = None
) -> dict[str, Any]:
    """Held calls created in the range: how they ended, and how long a decision took."""
    held = Confirmation.objects.filter(created_at__gte=since, created_at__lt=until)
    if agent_id is not None:
        held = held.filter(agent_id=agent_id)
    if tool is not None:
        held = held.filter(tool=tool)
    by_status = {
        row["status"]: row["count"]
        for row in held.values("status").annotate(count=Count("pk")).order_by()
    }
    waits = [
        _seconds(created, decided)
        for created, decided in held.filter(decided_at__isnull=False).values_list(
            "created_at", "decided_at"
        )
    ]
    by_reviewer: dict[str, list[float]] = defaultdict(list)
    decisions = held.filter(
        decided_at__isnull=False, events__kind__in=["approved", "rejected", "invalidated"]
    ).values_list("events__actor_label", "created_at", "decided_at")
    for reviewer, created, decided in decisions:
        by_reviewer[reviewer].append(_seconds(created, decided))
    return {
        "by_status": dict(sorted(by_status.items())),
        "time_to_decision_seconds": _percentiles(waits),
        "by_reviewer": {
            reviewer: {"decided": len(times), **_percentiles(times)}
            for reviewer, times in sorted(by_reviewer.items())
        },
    }


def _seconds(created: datetime, decided: datetime | None) -> float:
    assert decided is not None  # filtered on
    return (decided - created).total_seconds()


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0]}
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return {"p50": statistics.median(values), "p90": cuts[8]}


def _rollups(
    since: datetime, until: datetime, agent_id: int | None, tool: str | None
) -> QuerySet[CallRollup]:
    rows = CallRollup.objects.filter(hour__gte=_hour(since), hour__lt=until)
    if agent_id is not None:
        rows = rows.filter(agent_id=agent_id)
    if tool is not None:
        rows = rows.filter(tool=tool)
    return rows


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


def policy_what_if(*, agent_id: int, since: datetime, until: datetime, draft: Policy) -> WhatIf:
    """The agent's recorded money-moving calls in the range, judged again under `draft`, beside
    what really happened to them. Reads only."""
    records = list(
        AuditRecord.objects.filter(
            agent_id=agent_id,
            at__gte=since,
            at__lt=until,
            replayed=False,
            code__in=RECORDED_OUTCOMES,
            arguments__isnull=False,
        )
        .order_by("at", "id")
        .only(
            "call_id",
            "at",
            "session_id",
            "customer_id",
            "tool",
            "arguments",
            "code",
            "confirmation_id",
        )
    )
    reviewers = dict(
        Confirmation.objects.filter(
            pk__in={r.confirmation_id for r in records if r.confirmation_id}
        ).values_list("pk", "reviewers_required")
    )
    calls: list[PastCall] = []
    for record in records:
        spec = tool_registry.get(record.tool)
        if spec is None or spec.amount_field is None or not isinstance(record.arguments, dict):
            continue
        arguments = record.arguments
        outcome = RECORDED_OUTCOMES[record.code]
        if outcome == ONE_REVIEWER and reviewers.get(record.confirmation_id) == 2:
            outcome = TWO_REVIEWERS
        calls.append(
            PastCall(
                at=record.at,
                agent_id=str(agent_id),
                session_id=record.session_id,
                customer_id=record.customer_id,
                tool=record.tool,
                subject=str(arguments.get(spec.subject_field or "", "")),
                currency=str(arguments.get(spec.currency_field or "", "")),
                amount_cents=int(arguments.get(spec.amount_field, 0)),
                outcome=outcome,
                call_id=record.call_id,
            )
        )
    return what_if_of(draft, calls)


# The codes of the calls a what-if judges again, and the outcome each records.
RECORDED_OUTCOMES = {
    OK.name: AUTO_EXECUTED,
    CONFIRMATION_REQUIRED.name: ONE_REVIEWER,
    codes.POLICY_LIMIT.name: REFUSED,
}


# Rebuilding ------------------------------------------------------------------------------------

Counts = dict[tuple[datetime, int, str, str], list[int]]


def rollups_from_audit(records: Iterable[AuditRecord]) -> tuple[Counts, list[PendingRecovery]]:
    """The rollups, and the rejections still waiting for a fix, computed from audit records
    given in order of agent, session and step: what the live counting must have arrived at."""
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
    return counts, waiting


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
def rollups_replace(counts: Counts, waiting: list[PendingRecovery]) -> None:
    """Put the rebuilt rollups in place of the live ones, in one transaction."""
    CallRollup.objects.all().delete()
    PendingRecovery.objects.all().delete()
    CallRollup.objects.bulk_create(
        (
            CallRollup(
                hour=hour,
                agent_id=agent_id,
                tool=tool,
                code=code,
                calls=calls,
                replayed=replayed,
                correctable=correctable,
                recovered=recovered,
            )
            for (hour, agent_id, tool, code), (calls, replayed, correctable, recovered) in (
                counts.items()
            )
        ),
        batch_size=2000,
    )
    PendingRecovery.objects.bulk_create(waiting, batch_size=2000)


def rollups_live() -> Counts:
    live: Counts = {}
    for row in CallRollup.objects.all():
        live[row.hour, row.agent_id, row.tool, row.code] = [
            row.calls,
            row.replayed,
            row.correctable,
            row.recovered,
        ]
    return live


# Drilldowns ------------------------------------------------------------------------------------

# The events that say who decided a held call (as confirmation_outcomes reads them).
DECISION_EVENTS = ("approved", "rejected", "invalidated")


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
    hours from `since` (rounded down) to `until`, as _rollups reads them."""
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
