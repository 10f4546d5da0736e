"""The rollups, filled from what is recorded: the calls from the audit records, the decisions from
the confirmations' event log. Neither a call nor a decision writes a rollup row.

A fill (beat's rollups_fill_task, every TOOLGATE_ROLLUP_FILL_SECONDS) counts the rows written
since the last one in the order of their ids, which is the order their calls and decisions ended:
each call settles its session's waiting rejections as the call's own last statement once did
(analytics/counting.py). Each fill is one transaction of at most FILL_BATCH rows that writes what
it counted and moves its FillState to the last row it counted, so a fill that dies counted
nothing and the next one starts where the last finished.

The lag. A record's `at` is when its call arrived; the record is written at the call's end and
commits a moment later. A fill stops at the first row that arrived within the lag
(TOOLGATE_ROLLUP_LAG_SECONDS, 60 by default): every row before it comes from a call that arrived
longer ago than any call runs (gunicorn restarts a worker whose request passes its 30 s timeout,
which rolls the call back), so none of them is still committing when the fill reads, and none is
skipped. A row written with an earlier clock (the demo's history) is counted when the fills reach
its id.

The readers (analytics/selectors.py) add to the filled rows a live tail: the rows after the
fill state's last_id, counted the same way, so the figures are current to the last call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min, Model
from django.utils import timezone

from analytics import sql
from analytics.counting import (
    Counted,
    Counts,
    Record,
    Stored,
    Waiting,
    count_in_order,
    counts_by_session,
    days_of,
)
from analytics.decisions import (
    DECIDING_EVENTS,
    Decision,
    DecisionCounts,
    decided_by,
    decisions_counted,
)
from analytics.models import FillProgress, FillState, PendingRecovery
from analytics.rollups import (
    Rollups,
    audit_in_session_order,
    calls_replace,
    decisions_of_held,
    decisions_replace,
    named,
    rollups_live,
)
from approvals.models import ConfirmationEvent
from dispatch.models import AuditRecord
from dispatch.registry import tool_registry

CALLS = "calls"
DECISIONS = "decisions"
# Rows one fill counts in its transaction: a fill that has fallen behind catches up in several.
FILL_BATCH = 20_000
# Sessions whose waiting rejections are read in one query.
_SESSIONS_PER_QUERY = 500
# Reads of the rollups and their tail tried again while fills move the state under them.
_READ_ATTEMPTS = 3

T = TypeVar("T")


def fill_lag() -> timedelta:
    return timedelta(seconds=settings.TOOLGATE_ROLLUP_LAG_SECONDS)


@dataclass(frozen=True)
class Filled:
    """How many audit records and confirmation events a fill counted; None where another fill
    was counting them."""

    calls: int | None
    events: int | None


def rollups_fill(*, lag: timedelta | None = None) -> Filled:
    """Count what was recorded since the last fill, up to the first row within the lag (0: up
    to now, where nothing else writes, as in seed_demo)."""
    boundary = timezone.now() - (fill_lag() if lag is None else lag)
    return Filled(_caught_up(_fill_calls, boundary), _caught_up(_fill_decisions, boundary))


class _Step(NamedTuple):
    counted: int
    more: bool


def _caught_up(fill: Callable[[datetime], _Step | None], boundary: datetime) -> int | None:
    total = 0
    while (step := fill(boundary)) is not None:
        total += step.counted
        if not step.more:
            return total
    return None if total == 0 else total


def _fill_calls(boundary: datetime) -> _Step | None:
    with transaction.atomic():
        state = _state_locked(CALLS, wait=False)
        if state is None:
            return None
        if state.state == FillProgress.STARTED:
            return _Step(_calls_rebuilt(state, boundary), more=False)
        stop = _stop(AuditRecord, state.last_id, boundary)
        records = records_between(state.last_id, stop, limit=FILL_BATCH)
        counted = count_in_order(
            records, waiting_of(records), tool_registry.catalogue.model_fixable()
        )
        _calls_write(counted)
        _advance(state, records, stop, boundary)
        return _Step(len(records), more=len(records) == FILL_BATCH)


def _fill_decisions(boundary: datetime) -> _Step | None:
    with transaction.atomic():
        state = _state_locked(DECISIONS, wait=False)
        if state is None:
            return None
        if state.state == FillProgress.STARTED:
            return _Step(_decisions_rebuilt(state, boundary), more=False)
        stop = _stop(ConfirmationEvent, state.last_id, boundary)
        events = list(
            ConfirmationEvent.objects.filter(id__gt=state.last_id, id__lt=stop)
            .order_by("id")
            .values_list(*_EVENT_COLUMNS)[:FILL_BATCH]
        )
        _decisions_write(decisions_counted(_decisions(events)))
        _advance(state, [_Row(row[0], row[-1]) for row in events], stop, boundary)
        return _Step(len(events), more=len(events) == FILL_BATCH)


_EVENT_COLUMNS = (
    "id",
    "kind",
    "actor_label",
    "confirmation__agent_id",
    "confirmation__tool",
    "confirmation__created_at",
    "confirmation__decided_at",
    "at",
)


class _Row(NamedTuple):
    id: int
    at: datetime


def _decisions(events: Iterable[Sequence[Any]]) -> Iterator[Decision]:
    for _, kind, actor, agent_id, tool, created_at, decided_at, _ in events:
        if kind in DECIDING_EVENTS and decided_at is not None:
            yield Decision(agent_id, tool, decided_by(kind, actor), created_at, decided_at)


def _stop(model: type[Model], after: int, boundary: datetime) -> int:
    """The id a fill stops before: the first row after `after` that arrived within the lag, or
    the one after the newest."""
    rows = model._default_manager.all()
    recent = rows.filter(id__gt=after, at__gte=boundary).aggregate(first=Min("id"))["first"]
    if recent is not None:
        return int(recent)
    newest = rows.aggregate(last=Max("id"))["last"]
    return max(after, newest or 0) + 1


def _advance(
    state: FillState, rows: Sequence[Record | _Row], stop: int, boundary: datetime
) -> None:
    """The state moved past what the fill counted: up to `stop` when it counted all there was
    before it, else up to its last row."""
    caught_up = len(rows) < FILL_BATCH
    state.last_id = stop - 1 if caught_up else rows[-1].id
    state.end_time = boundary if caught_up else min(boundary, rows[-1].at)
    state.state = FillProgress.DONE
    state.last_modified = timezone.now()
    state.save()


def _state_locked(name: str, *, wait: bool) -> FillState | None:
    """The fill state, locked until the transaction ends; None when `wait` is False and another
    fill holds it."""
    locked = FillState.objects.select_for_update(skip_locked=not wait).filter(property=name)
    state = locked.first()
    if state is None and not FillState.objects.filter(property=name).exists():
        with connection.cursor() as cursor:
            cursor.execute(
                sql.FILL_STATE_ENSURE,
                {
                    "property": name,
                    "now": connection.ops.adapt_datetimefield_value(timezone.now()),
                    "done": FillProgress.DONE.value,
                },
            )
        state = locked.first()
    return state


# Reading the records ---------------------------------------------------------------------------


def records_between(after: int, before: int | None, *, limit: int | None = None) -> list[Record]:
    """The audit records whose id is above `after` and below `before` (None: however new), in
    the order of their ids."""
    rows = AuditRecord.objects.filter(id__gt=after)
    if before is not None:
        rows = rows.filter(id__lt=before)
    ordered = rows.order_by("id").values_list(*Record._fields)
    return [Record._make(row) for row in (ordered[:limit] if limit is not None else ordered)]


def waiting_of(records: Iterable[Record]) -> Stored:
    """The stored rejections still waiting for a fix in the sessions of `records`."""
    sessions = sorted({(record.agent_id, record.session_id) for record in records})
    found: dict[tuple[int, str], list[tuple[int | None, Waiting]]] = defaultdict(list)
    for offset in range(0, len(sessions), _SESSIONS_PER_QUERY):
        chunk = set(sessions[offset : offset + _SESSIONS_PER_QUERY])
        rows = PendingRecovery.objects.filter(
            agent_id__in={agent for agent, _ in chunk},
            session_id__in={session for _, session in chunk},
        ).order_by("id")
        for row in rows.values_list("id", *Waiting._fields):
            if (row[1], row[2]) in chunk:
                found[row[1], row[2]].append((row[0], Waiting._make(row[1:])))
    return found


# Writing what was counted ----------------------------------------------------------------------


def _calls_write(counted: Counted) -> None:
    adapt_hour = connection.ops.adapt_datetimefield_value
    _add(
        sql.HOUR_ADD,
        [
            {**_key(agent_id, tool, code), "hour": adapt_hour(hour), **named(values)}
            for (hour, agent_id, tool, code), values in sorted(counted.hours.items())
        ],
    )
    _add(
        sql.DAY_ADD,
        [
            {**_key(agent_id, tool, code), "day": _adapt_day(day), **named(values)}
            for (day, agent_id, tool, code), values in sorted(days_of(counted.hours).items())
        ],
    )
    for offset in range(0, len(counted.settled), _SESSIONS_PER_QUERY):
        settled = counted.settled[offset : offset + _SESSIONS_PER_QUERY]
        PendingRecovery.objects.filter(pk__in=settled).delete()
    PendingRecovery.objects.bulk_create(
        (PendingRecovery(**rejection._asdict()) for rejection in counted.waiting),
        batch_size=2000,
    )


def _decisions_write(decisions: DecisionCounts) -> None:
    _add(
        sql.DECISIONS_ADD,
        [
            {
                "day": _adapt_day(day),
                "agent_id": agent_id,
                "tool": tool,
                "decided_by": decider,
                "bucket": bucket,
                "decisions": count,
            }
            for (day, agent_id, tool, decider, bucket), count in sorted(decisions.items())
        ],
    )


def _add(statement: str, rows: list[dict[str, Any]]) -> None:
    # Rows in the order of their keys, in every fill alike. Nothing to add sends nothing (SQLite
    # reads the named parameters off the first row).
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(statement, rows)


def _key(agent_id: int, tool: str, code: str) -> dict[str, Any]:
    return {"agent_id": agent_id, "tool": tool, "code": code}


def _adapt_day(day: date) -> Any:
    return connection.ops.adapt_datefield_value(day)


# Rebuilding and checking -----------------------------------------------------------------------


def _calls_rebuilt(state: FillState, boundary: datetime) -> int:
    """Replace the call rollups with a count of every record before the lag; the records
    counted."""
    stop = _stop(AuditRecord, 0, boundary)
    records = audit_in_session_order(before=stop).iterator(chunk_size=5000)
    hours, waiting = counts_by_session(records, tool_registry.catalogue.model_fixable())
    calls_replace(hours, waiting)
    _advance(state, [], stop, boundary)
    return sum(values[0] for values in hours.values())


def _decisions_rebuilt(state: FillState, boundary: datetime) -> int:
    """Replace the decision rollups with a count of every decision before the lag; the
    decisions counted."""
    stop = _stop(ConfirmationEvent, 0, boundary)
    decisions = decisions_of_held(events_before=stop)
    decisions_replace(decisions)
    _advance(state, [], stop, boundary)
    return sum(decisions.values())


def rollups_rebuild(*, lag: timedelta | None = None) -> Rollups:
    """Replace every rollup with a count of what was recorded before the lag, fills waiting, and
    move the fill states there; the rebuilt rollups."""
    boundary = timezone.now() - (fill_lag() if lag is None else lag)
    with transaction.atomic():
        calls, decisions = _state_locked(CALLS, wait=True), _state_locked(DECISIONS, wait=True)
        assert calls is not None and decisions is not None  # waited for
        _calls_rebuilt(calls, boundary)
        _decisions_rebuilt(decisions, boundary)
        return rollups_live()


def rollups_check(
    progress: Callable[[Iterator[AuditRecord]], Iterable[AuditRecord]] = iter,
) -> tuple[Rollups, list[str]]:
    """The rollups rebuilt from what the fills have counted so far, fills waiting, and the rows
    where the live ones differ (an empty list: they agree)."""
    with transaction.atomic():
        calls, decisions = _state_locked(CALLS, wait=True), _state_locked(DECISIONS, wait=True)
        assert calls is not None and decisions is not None  # waited for
        records = audit_in_session_order(before=calls.last_id + 1).iterator(chunk_size=5000)
        hours, _ = counts_by_session(progress(records), tool_registry.catalogue.model_fixable())
        rebuilt = Rollups(hours, days_of(hours), decisions_of_held(decisions.last_id + 1))
        return rebuilt, rollups_live().differences(rebuilt)


# Reading: the filled rows and the tail after them ----------------------------------------------


class FillMark(NamedTuple):
    """Where the fills of a kind of row stand, as a reader sees it."""

    last_id: int
    last_modified: datetime | None
    end_time: datetime | None
    half_filled: bool


def fill_mark(name: str) -> FillMark:
    row = (
        FillState.objects.filter(property=name)
        .values_list("last_id", "last_modified", "end_time", "state")
        .first()
    )
    if row is None:
        return FillMark(0, None, None, False)
    last_id, modified, end_time, state = row
    return FillMark(last_id, modified, end_time, state == FillProgress.STARTED)


def read_consistently(name: str, read: Callable[[FillMark], T]) -> T:
    """What `read` makes of the rollups and of the rows after the mark: both from the same side
    of a fill. A fill that commits meanwhile moves the mark, and the reading is done again; after
    a few tries (fills in quick succession, catching up) it is done with fills waiting."""
    mark = fill_mark(name)
    for _ in range(_READ_ATTEMPTS):
        result = read(mark)
        again = fill_mark(name)
        if again == mark:
            return result
        mark = again
    with transaction.atomic():
        _state_locked(name, wait=True)
        return read(fill_mark(name))


def tail_counts(after: int) -> Counts:
    """The hourly counts of the records after `after`, which no fill has counted yet, settling
    the stored waiting rejections as a fill would."""
    records = records_between(after, None)
    return count_in_order(
        records, waiting_of(records), tool_registry.catalogue.model_fixable()
    ).hours


def tail_decisions(
    after: int, *, created: tuple[datetime, datetime], **where: Any
) -> Iterator[Decision]:
    """The decisions of the events after `after`, which no fill has counted yet, of held calls
    created in [created) and as `where` filters them (confirmation__agent_id, ...)."""
    events = ConfirmationEvent.objects.filter(
        id__gt=after,
        kind__in=DECIDING_EVENTS,
        confirmation__created_at__gte=created[0],
        confirmation__created_at__lt=created[1],
        **where,
    ).values_list(*_EVENT_COLUMNS)
    return _decisions(events.iterator())
