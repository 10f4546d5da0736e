"""How held calls were reached and decided: time to decision by the door the decision came
through (the pages and the API, or Slack), the escalations and reminders sent, and the expiries.

Read from the event log of the held calls of the range (approvals.models.ConfirmationEvent): an
approval made from Slack says so in its event's data; a decision without a channel came through
the pages or the API.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from analytics import formatting
from analytics.selectors import held_in
from approvals.models import ConfirmationEvent, EventKind
from dispatch.models import ConfirmationStatus

CHANNEL_LABELS = {"": "Pages and API", "slack": "Slack"}
DECISIONS = (EventKind.APPROVED, EventKind.REJECTED, EventKind.INVALIDATED)


def channel_figures(
    *, since: datetime, until: datetime, agent_id: int | None = None, tool: str | None = None
) -> dict[str, Any]:
    """Decisions by channel (how many, median and 90th percentile seconds from the hold), and
    how many held calls of the range were escalated, reminded and expired."""
    held = held_in(since, until, agent_id, tool)
    waits: dict[str, list[float]] = defaultdict(list)
    decided = ConfirmationEvent.objects.filter(confirmation__in=held, kind__in=DECISIONS)
    for data, at, created_at in decided.values_list("data", "at", "confirmation__created_at"):
        channel = str(data.get("channel", "")) if isinstance(data, dict) else ""
        waits[channel].append((at - created_at).total_seconds())
    notices = ConfirmationEvent.objects.filter(
        confirmation__in=held, kind__in=(EventKind.ESCALATED, EventKind.REMINDED)
    )
    counted = {kind: 0 for kind in (EventKind.ESCALATED, EventKind.REMINDED)}
    for kind in notices.values_list("kind", flat=True):
        counted[EventKind(kind)] += 1
    return {
        "by_channel": [
            {
                "channel": CHANNEL_LABELS.get(channel, channel),
                "decided": len(seconds),
                "median_seconds": round(statistics.median(seconds), 1),
                "p90_seconds": round(_p90(seconds), 1),
                "median": formatting.duration(statistics.median(seconds)),
                "p90": formatting.duration(_p90(seconds)),
            }
            for channel, seconds in sorted(waits.items())
        ],
        "escalated": counted[EventKind.ESCALATED],
        "reminded": counted[EventKind.REMINDED],
        "expired": held.filter(status=ConfirmationStatus.EXPIRED).count(),
    }


def _p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]
