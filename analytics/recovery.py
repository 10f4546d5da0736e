"""The recovery rate computed from the audit records themselves, for any range and filters: what
simulate_agents reports of its own run, and what the rollups are tested against (the rollups
count the same thing as calls are filled in, analytics/counting.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import TypeVar

from analytics.counting import RECOVERY_WINDOW
from dispatch.models import AuditRecord
from dispatch.pipeline import codes
from dispatch.registry import tool_registry

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
