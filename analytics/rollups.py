"""The rollups' write side: rebuilt from the audit records and the held calls' decisions, compared
with the live rows, and each decision counted in its day's histogram."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from django.db import connection, transaction
from django.db.models import QuerySet

from analytics.counting import COUNTED, Counts, DayCounts, Waiting, counts_by_session, days_of
from analytics.decisions import BY_EXPIRY, decided, decision_bucket
from analytics.models import CallRollup, CallRollupDay, DecisionRollup, PendingRecovery
from analytics.ranges import utc_day
from dispatch.models import AuditRecord, Confirmation
from dispatch.registry import tool_registry

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

    def rows(self) -> int:
        return len(self.hours) + len(self.days) + len(self.decisions)


def rollups_rebuilt(records: Iterable[AuditRecord]) -> tuple[Rollups, list[Waiting]]:
    """The rollups, and the rejections still waiting for a fix, computed from audit records
    given in order of agent, session and step, and from the held calls' decisions: what the
    live counting must have arrived at."""
    hours, waiting = counts_by_session(records, tool_registry.catalogue.model_fixable())
    return Rollups(hours, days_of(hours), _decisions_of_held()), waiting


def _decisions_of_held() -> DecisionCounts:
    counts: DecisionCounts = defaultdict(int)
    for created, agent_id, tool, decider, wait in decided(
        Confirmation.objects.all(), "created_at", "agent_id", "tool"
    ).iterator():
        bucket = decision_bucket(wait.total_seconds())
        counts[utc_day(created), agent_id, tool, decider or BY_EXPIRY, bucket] += 1
    return dict(counts)


def audit_in_session_order() -> QuerySet[AuditRecord]:
    return AuditRecord.objects.order_by("agent_id", "session_id", "step", "at", "id").only(
        "agent_id", "session_id", "step", "tool", "code", "ok", "replayed", "at"
    )


@transaction.atomic
def rollups_replace(rollups: Rollups, waiting: list[Waiting]) -> None:
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
    PendingRecovery.objects.bulk_create(
        (PendingRecovery(**rejection._asdict()) for rejection in waiting), batch_size=2000
    )


def _named(values: list[int]) -> dict[str, int]:
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


def decision_count(*, confirmation: Confirmation, decided_by: str) -> None:
    """Count a decision in its day's histogram, in the decision's own transaction."""
    assert confirmation.decided_at is not None
    with connection.cursor() as cursor:
        cursor.execute(
            _DECISION_COUNT,
            {
                "day": connection.ops.adapt_datefield_value(utc_day(confirmation.created_at)),
                "agent_id": confirmation.agent_id,
                "tool": confirmation.tool,
                "decided_by": decided_by,
                "bucket": decision_bucket(
                    (confirmation.decided_at - confirmation.created_at).total_seconds()
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
