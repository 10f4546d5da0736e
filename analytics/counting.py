"""How calls count in the rollups: the definitions (docs/analytics.md, "What each figure means")
and the counting of audit records into hourly rows, in one place.

- rejected: not ok and not held for confirmation;
- correctable: a rejection whose code the model can fix, of a call that took a step;
- recovered: a correctable rejection followed within the next RECOVERY_WINDOW calls of its
  session by a call to the same tool that passes validation (ok, or held); it counts in the
  rejection's own hour, once the fix arrives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import NamedTuple, Protocol

from analytics.ranges import hour_floor, utc_day
from dispatch.pipeline.codes import CONFIRMATION_REQUIRED, OK

NOT_REJECTED = frozenset({OK.name, CONFIRMATION_REQUIRED.name})
# A rejection counts as recovered when one of this many calls after it, in the same session, is a
# call to the same tool that passes validation.
RECOVERY_WINDOW = 3

# calls, replayed, correctable, recovered: per hour or day, agent, tool and code.
Counts = dict[tuple[datetime, int, str, str], list[int]]
DayCounts = dict[tuple[date, int, str, str], list[int]]
COUNTED = ("calls", "replayed", "correctable", "recovered")


class Call(Protocol):
    """What counting reads of an audit record."""

    @property
    def agent_id(self) -> int: ...
    @property
    def session_id(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def tool(self) -> str: ...
    @property
    def code(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def replayed(self) -> bool: ...
    @property
    def at(self) -> datetime: ...


class Waiting(NamedTuple):
    """A correctable rejection waiting for its session's next calls."""

    agent_id: int
    session_id: str
    step: int
    tool: str
    code: str
    # Its hour, whose row counts its recovery.
    hour: datetime


def passes(call: Call) -> bool:
    return call.ok or call.code == CONFIRMATION_REQUIRED.name


def correctable(call: Call, model_fixable: frozenset[str]) -> bool:
    return not passes(call) and call.code in model_fixable and call.step is not None


class Record(NamedTuple):
    """An audit record as a fill reads it."""

    id: int
    agent_id: int
    session_id: str
    step: int | None
    tool: str
    code: str
    ok: bool
    replayed: bool
    at: datetime


Session = tuple[int, str]
# A session's rejections waiting for a fix, each with its stored row's id (None: not stored).
Stored = Mapping[Session, list[tuple[int | None, Waiting]]]


@dataclass(frozen=True)
class Counted:
    """What counting some records adds to the rollups."""

    hours: Counts
    # Stored waiting rejections that a call passed by or fixed.
    settled: list[int]
    # Rejections among the records still waiting for a fix.
    waiting: list[Waiting]


def count_in_order(
    records: Iterable[Record], stored: Stored, model_fixable: frozenset[str]
) -> Counted:
    """The hourly counts of audit records given in the order their calls ended (their ids), each
    call settling its session's waiting rejections as the call's own last statement once did:
    those its next RECOVERY_WINDOW calls passed by, and those of its tool that it fixes, counted
    as recovered in their own hour. `stored` holds the sessions' rejections still waiting from
    earlier records."""
    counts: Counts = defaultdict(lambda: [0, 0, 0, 0])
    waiting: dict[Session, list[tuple[int | None, Waiting]]] = defaultdict(list)
    for session, rows in stored.items():
        waiting[session] = list(rows)
    settled: list[int] = []
    for record in records:
        step = record.step or 0
        row = counts[hour_floor(record.at), record.agent_id, record.tool, record.code]
        row[0] += 1
        row[1] += int(record.replayed)
        session = (record.agent_id, record.session_id)
        still = []
        for stored_id, rejection in waiting[session]:
            passed_by = rejection.step < step - RECOVERY_WINDOW
            fixed = passes(record) and rejection.tool == record.tool and rejection.step < step
            if not (passed_by or fixed):
                still.append((stored_id, rejection))
                continue
            if not passed_by:
                key = (rejection.hour, rejection.agent_id, rejection.tool, rejection.code)
                counts[key][3] += 1
            if stored_id is not None:
                settled.append(stored_id)
        if correctable(record, model_fixable):
            row[2] += 1
            still.append((None, _waiting(record)))
        waiting[session] = still
    added = [rejection for rows in waiting.values() for key, rejection in rows if key is None]
    return Counted(dict(counts), settled, added)


def counts_by_session(
    records: Iterable[Call], model_fixable: frozenset[str]
) -> tuple[Counts, list[Waiting]]:
    """The hourly counts of audit records given in order of agent, session and step, and the
    rejections still waiting at the end: what a rebuild computes, one session at a time."""
    counts: Counts = defaultdict(lambda: [0, 0, 0, 0])
    waiting: list[Waiting] = []
    for calls in _sessions(records):
        pending: list[Call] = []
        for record in calls:
            step = record.step or 0
            row = counts[hour_floor(record.at), record.agent_id, record.tool, record.code]
            row[0] += 1
            row[1] += int(record.replayed)
            still = []
            for rejection in pending:
                if (rejection.step or 0) < step - RECOVERY_WINDOW:
                    continue  # its next calls passed it by
                if passes(record) and rejection.tool == record.tool:
                    key = (
                        hour_floor(rejection.at),
                        rejection.agent_id,
                        rejection.tool,
                        rejection.code,
                    )
                    counts[key][3] += 1
                    continue
                still.append(rejection)
            pending = still
            if correctable(record, model_fixable):
                row[2] += 1
                pending.append(record)
        waiting.extend(_waiting(rejection) for rejection in pending)
    return dict(counts), waiting


def _waiting(rejection: Call) -> Waiting:
    return Waiting(
        rejection.agent_id,
        rejection.session_id,
        rejection.step or 0,
        rejection.tool,
        rejection.code,
        hour_floor(rejection.at),
    )


def _sessions(records: Iterable[Call]) -> Iterator[list[Call]]:
    current: tuple[int, str] | None = None
    calls: list[Call] = []
    for record in records:
        session = (record.agent_id, record.session_id)
        if session != current:
            if current is not None:
                yield calls
            current, calls = session, []
        calls.append(record)
    if current is not None:
        yield calls


def days_of(hours: Counts) -> DayCounts:
    """The hourly counts summed by UTC day."""
    days: DayCounts = defaultdict(lambda: [0, 0, 0, 0])
    for (hour, agent_id, tool, code), values in hours.items():
        row = days[utc_day(hour), agent_id, tool, code]
        for index, value in enumerate(values):
            row[index] += value
    return dict(days)
