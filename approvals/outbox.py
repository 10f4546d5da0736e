"""Rows that are their own outbox (webhook deliveries, notifications): sent again when their task
was lost, each claimed so that two sweeps at once send it once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

logger = logging.getLogger(__name__)


def outbox_resend(
    lost: QuerySet[Any], *, now: datetime, send: Callable[[int], object], batch: int
) -> int:
    """Send again, oldest due first, at most `batch` of the `lost` rows (pending, due long ago);
    how many were sent. A row is claimed by moving its due time to `now`; with the broker still
    away the round stops, and the next one tries again."""
    due = lost.order_by("next_attempt_at", "id").values_list("pk", "next_attempt_at")[:batch]
    sent = 0
    for row_id, due_at in list(due):
        if not lost.filter(pk=row_id, next_attempt_at=due_at).update(next_attempt_at=now):
            continue
        try:
            send(row_id)
        except Exception as exc:
            logger.warning("Could not send %s %s again: %s", lost.model.__name__, row_id, exc)
            break
        sent += 1
    return sent
