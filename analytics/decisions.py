"""How long held calls waited for a decision, and who made it: the events that say so, and the
histogram the decision rollups keep of the times.

Two sets of events, on purpose: a held call's wait ends with any of DECIDING_EVENTS, an expiry
included (time to decision counts it); the reviewer who decided is named by one of
REVIEWER_DECISIONS, and an expiry, which is nobody's decision, is counted under BY_EXPIRY.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any, NamedTuple

from django.db.models import DurationField, ExpressionWrapper, F, FilteredRelation, Q, QuerySet

from analytics.ranges import utc_day
from approvals.models import EventKind
from dispatch.models import Confirmation

REVIEWER_DECISIONS = (EventKind.APPROVED, EventKind.REJECTED, EventKind.INVALIDATED)
DECIDING_EVENTS = (*REVIEWER_DECISIONS, EventKind.EXPIRED)
# Who decided an expired held call, in the decision rollups.
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


# decisions per UTC day of the hold, agent, tool, who decided and bucket.
DecisionCounts = dict[tuple[date, int, str, str, int], int]


class Decision(NamedTuple):
    agent_id: int
    tool: str
    decided_by: str
    created_at: datetime
    decided_at: datetime


def decided_by(kind: str, actor_label: str) -> str:
    """Who a deciding event says decided: its reviewer, or BY_EXPIRY."""
    return BY_EXPIRY if kind == EventKind.EXPIRED else actor_label


def decisions_counted(decisions: Iterable[Decision]) -> DecisionCounts:
    """The histogram's rows that the decisions add to."""
    counts: DecisionCounts = defaultdict(int)
    for decision in decisions:
        wait = (decision.decided_at - decision.created_at).total_seconds()
        day = utc_day(decision.created_at)
        counts[
            day, decision.agent_id, decision.tool, decision.decided_by, decision_bucket(wait)
        ] += 1
    return dict(counts)


def decision_seconds(bucket: int) -> float:
    """The time a bucket stands for: its middle on the log scale."""
    if bucket == 0:
        return 0.5
    return float(2 ** ((bucket - 0.5) / BUCKETS_PER_DOUBLING))


def percentiles(histogram: Mapping[int, int]) -> dict[str, float | None]:
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


def decided(held: QuerySet[Confirmation], *fields: str) -> QuerySet[Confirmation, Any]:
    """Of each decided held call, the `fields` asked for, the reviewer who decided it (None for
    an expiry) and how long it waited."""
    return (
        held.filter(decided_at__isnull=False)
        .annotate(
            decision=FilteredRelation("events", condition=Q(events__kind__in=REVIEWER_DECISIONS)),
            decider=F("decision__actor_label"),
            wait=ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField()),
        )
        .order_by()
        .values_list(*fields, "decider", "wait")
    )
