"""The rollups rebuilt from what is recorded, a way of counting independent of the fills': the
audit records one session at a time, and the held calls' decisions from the held calls. What the
fills must have arrived at (`rebuild_rollups --check`), and what replaces them
(`rebuild_rollups`, or a fill that finds them half-filled: analytics/fills.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import QuerySet

from analytics.counting import COUNTED, Counts, DayCounts, Waiting, counts_by_session, days_of
from analytics.decisions import (
    BY_EXPIRY,
    DECIDING_EVENTS,
    Decision,
    DecisionCounts,
    decided,
    decisions_counted,
)
from analytics.models import CallRollup, CallRollupDay, DecisionRollup, PendingRecovery
from dispatch.models import AuditRecord, Confirmation
from dispatch.registry import tool_registry

# Rows written at a time.
BATCH = 2000


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

    def rows(self) -> int:
        return len(self.hours) + len(self.days) + len(self.decisions)


def rollups_rebuilt(
    records: Iterable[AuditRecord], *, events_before: int | None = None
) -> tuple[Rollups, list[Waiting]]:
    """The rollups, and the rejections still waiting for a fix, computed from audit records
    given in order of agent, session and step, and from the decisions of held calls (those whose
    deciding event's id is below `events_before`, or all)."""
    hours, waiting = counts_by_session(records, tool_registry.catalogue.model_fixable())
    return Rollups(hours, days_of(hours), decisions_of_held(events_before)), waiting


def decisions_of_held(events_before: int | None = None) -> DecisionCounts:
    held = Confirmation.objects.all()
    if events_before is not None:
        held = held.filter(events__kind__in=DECIDING_EVENTS, events__id__lt=events_before)
    return decisions_counted(
        Decision(agent_id, tool, decider or BY_EXPIRY, created, created + wait)
        for created, agent_id, tool, decider, wait in decided(
            held, "created_at", "agent_id", "tool"
        ).iterator()
    )


def audit_in_session_order(before: int | None = None) -> QuerySet[AuditRecord]:
    """The audit records (those whose id is below `before`, or all) in the order a rebuild
    counts them."""
    records = (
        AuditRecord.objects.all() if before is None else AuditRecord.objects.filter(id__lt=before)
    )
    return records.order_by("agent_id", "session_id", "step", "at", "id").only(
        "agent_id", "session_id", "step", "tool", "code", "ok", "replayed", "at"
    )


def calls_replace(hours: Counts, waiting: list[Waiting]) -> None:
    """Put rebuilt call rollups, and the rejections still waiting, in place of the live ones (in
    the caller's transaction)."""
    for model in (CallRollup, CallRollupDay, PendingRecovery):
        model.objects.all().delete()
    CallRollup.objects.bulk_create(
        (
            CallRollup(hour=hour, agent_id=agent_id, tool=tool, code=code, **named(values))
            for (hour, agent_id, tool, code), values in hours.items()
        ),
        batch_size=BATCH,
    )
    CallRollupDay.objects.bulk_create(
        (
            CallRollupDay(day=day, agent_id=agent_id, tool=tool, code=code, **named(values))
            for (day, agent_id, tool, code), values in days_of(hours).items()
        ),
        batch_size=BATCH,
    )
    PendingRecovery.objects.bulk_create(
        (PendingRecovery(**rejection._asdict()) for rejection in waiting), batch_size=BATCH
    )


def decisions_replace(decisions: DecisionCounts) -> None:
    """Put a rebuilt histogram of decisions in place of the live one (in the caller's
    transaction)."""
    DecisionRollup.objects.all().delete()
    DecisionRollup.objects.bulk_create(
        (
            DecisionRollup(
                day=day,
                agent_id=agent_id,
                tool=tool,
                decided_by=decided_by,
                bucket=bucket,
                decisions=count,
            )
            for (day, agent_id, tool, decided_by, bucket), count in decisions.items()
        ),
        batch_size=BATCH,
    )


def named(values: list[int]) -> dict[str, int]:
    return dict(zip(COUNTED, values, strict=True))


def rollups_live() -> Rollups:
    return Rollups(
        hours={
            (hour, agent_id, tool, code): list(values)
            for hour, agent_id, tool, code, *values in CallRollup.objects.values_list(
                "hour", "agent_id", "tool", "code", *COUNTED
            )
        },
        days={
            (day, agent_id, tool, code): list(values)
            for day, agent_id, tool, code, *values in CallRollupDay.objects.values_list(
                "day", "agent_id", "tool", "code", *COUNTED
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
