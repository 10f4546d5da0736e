"""Direct calls whose outcome is unknown, settled by their tool's outcome read.

A write whose answer was lost (after its retries) leaves its key unknown and its money counted;
one whose process died while an upstream was making its effect leaves its key in progress. An
identical call sends it again under the same key; until one does, `outcomes_settle` asks the
tool's outcome read (ToolSpec.outcome_of) what happened under the key: found, the key is
completed with the effect as its result and the money stays moved; not found, the key is open
and its money released. A key whose system of record cannot be read now stays as it is.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from dispatch.models import IdempotencyRecord
from dispatch.pipeline import codes
from dispatch.pipeline.results import make_result
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import OutcomeUnknownError
from dispatch.registry import tool_registry
from dispatch.store.allowance import allowance_release


class Settled(NamedTuple):
    key: str
    tool: str
    # completed, open, or unknown (its system of record could not be read).
    status: str


def outcomes_unsettled(*, older_than: timedelta, now: datetime | None = None) -> list[str]:
    """The keys of direct calls whose outcome is unknown, or whose effect has been in progress
    longer than `older_than` (its process died), for tools that can be asked."""
    cutoff = (now or timezone.now()) - older_than
    tools = [spec.name for spec in tool_registry if spec.writes and spec.outcome_of is not None]
    return list(
        IdempotencyRecord.objects.filter(
            tool__in=tools,
            status__in=[KeyStatus.UNKNOWN, KeyStatus.IN_PROGRESS],
            confirmation_id="",
            updated_at__lte=cutoff,
        )
        .order_by("updated_at")
        .values_list("key", flat=True)
    )


def outcomes_settle(*, older_than: timedelta, now: datetime | None = None) -> list[Settled]:
    return [outcome_settle(key=key) for key in outcomes_unsettled(older_than=older_than, now=now)]


def outcome_settle(*, key: str) -> Settled:
    """Ask the tool's outcome read about one key, and settle the key as it answers."""
    record = IdempotencyRecord.objects.get(pk=key)
    spec = tool_registry.get(record.tool)
    if spec is None or spec.outcome_of is None:
        return Settled(key, record.tool, KeyStatus.UNKNOWN.value)
    try:
        # Read before any lock is taken: the system of record may be across a network.
        outcome = spec.outcome_of(key)
    except OutcomeUnknownError:
        return Settled(key, record.tool, KeyStatus.UNKNOWN.value)
    with transaction.atomic(), connection.cursor() as cursor:
        locked = IdempotencyRecord.objects.select_for_update().get(pk=key)
        if locked.status not in (KeyStatus.UNKNOWN, KeyStatus.IN_PROGRESS):
            return Settled(key, record.tool, locked.status)  # settled meanwhile
        if outcome is not None:
            result = make_result(
                call_id=key[:32], tool=spec.name, code=codes.OK, message="Done.", data=outcome
            )
            locked.status, locked.result = KeyStatus.COMPLETED, result.as_dict()
        else:
            locked.status, locked.result = KeyStatus.OPEN, None
            allowance_release(key, cursor=cursor)
        locked.updated_at = timezone.now()
        locked.save(update_fields=["status", "result", "updated_at"])
    return Settled(key, record.tool, locked.status)
