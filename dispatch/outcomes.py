"""Direct calls whose outcome is unknown, settled by their tool's outcome read.

A write whose answer was lost (after its retries) leaves its key unknown and its money counted;
one whose process died while an upstream was making its effect leaves its key in progress, its
lease running out. An identical call sends it again under the same key (reading first); until one
does, `outcomes_settle` asks the tool's read what happened: by its key (ToolSpec.outcome_of), or
by the call's arguments (ToolSpec.effect_of). Found, the key is completed with the effect as its
result and the money stays moved; not found, the key is open and its money released. A key whose
system of record cannot be read now stays as it is.

Settlers run at once (two workers on the beat's schedule, a person on the reconciliation page):
each takes a key under a lease of its own first (rows locked by another are skipped), reads with
no lock held, and settles only if its lease is still the key's: a key that an identical call
took meanwhile, or another settler settled, is left as that one left it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from dispatch.models import IdempotencyRecord
from dispatch.pipeline import codes
from dispatch.pipeline.results import make_result
from dispatch.pipeline.state import KeyStatus
from dispatch.pipeline.tools import ExecutionContext, OutcomeUnknownError, ToolSpec
from dispatch.registry import tool_registry
from dispatch.store.allowance import allowance_release

# How long a settler holds a key while it reads: longer than any outcome read takes.
SETTLE_LEASE_SECONDS = 60.0
_UNSETTLED = (KeyStatus.UNKNOWN, KeyStatus.IN_PROGRESS)


class Settled(NamedTuple):
    key: str
    tool: str
    # completed, open, or unknown (its system of record could not be read); or what another
    # left it as (in_progress: an identical call is finishing it).
    status: str


def settleable(spec: ToolSpec[Any] | None) -> bool:
    """Whether a tool's direct calls can be settled by a read."""
    return (
        spec is not None
        and spec.writes
        and (spec.outcome_of is not None or spec.effect_of is not None)
    )


def unsettled_queryset(
    *, older_than: timedelta, now: datetime | None = None, readable_only: bool = True
) -> QuerySet[IdempotencyRecord]:
    """Direct calls of tools that can be asked (or, not `readable_only`, of every remote tool)
    whose outcome is unknown, or whose effect has been in progress past its lease (its process
    died), untouched for `older_than`."""
    now = now or timezone.now()
    cutoff = now - older_than
    tools = [
        spec.name
        for spec in tool_registry
        if settleable(spec) or (spec.remote and not readable_only)
    ]
    return IdempotencyRecord.objects.filter(
        Q(status=KeyStatus.UNKNOWN, updated_at__lte=cutoff)
        | Q(status=KeyStatus.IN_PROGRESS, lease_until__lte=min(now, cutoff))
        | Q(status=KeyStatus.IN_PROGRESS, lease_until=None, updated_at__lte=cutoff),
        tool__in=tools,
        confirmation_id="",
    ).order_by("updated_at")


def outcomes_unsettled(*, older_than: timedelta, now: datetime | None = None) -> list[str]:
    return list(unsettled_queryset(older_than=older_than, now=now).values_list("key", flat=True))


def outcomes_settle(*, older_than: timedelta, now: datetime | None = None) -> list[Settled]:
    """Settle every unsettled key another settler does not hold; the ones settled here."""
    settled = []
    for key in outcomes_unsettled(older_than=older_than, now=now):
        outcome = outcome_settle(key=key)
        if outcome is not None:
            settled.append(outcome)
    return settled


def outcome_settle(*, key: str) -> Settled | None:
    """Ask the tool's read about one key, and settle the key as it answers; None if another
    settler holds it now."""
    tool = IdempotencyRecord.objects.filter(pk=key).values_list("tool", flat=True).first()
    spec = None if tool is None else tool_registry.get(tool)
    if spec is None or not settleable(spec):
        return None
    lease = _take(key)
    if lease is None:
        return None
    record, until = lease
    try:
        # Read before any lock is taken: the system of record may be across a network.
        outcome = _read(spec, record)
    except OutcomeUnknownError:
        # Left as it was, at once free for the same call or the next settler.
        IdempotencyRecord.objects.filter(pk=key, lease_until=until).update(
            lease_until=timezone.now()
        )
        return Settled(key, record.tool, KeyStatus.UNKNOWN.value)
    with transaction.atomic(), connection.cursor() as cursor:
        locked = IdempotencyRecord.objects.select_for_update().get(pk=key)
        if locked.status not in _UNSETTLED or locked.lease_until != until:
            # Settled meanwhile, or taken over by an identical call that is finishing it.
            return Settled(key, record.tool, locked.status)
        if outcome is not None:
            result = make_result(
                call_id=key[:32], tool=spec.name, code=codes.OK, message="Done.", data=outcome
            )
            locked.status, locked.result = KeyStatus.COMPLETED, result.as_dict()
        else:
            locked.status, locked.result = KeyStatus.OPEN, None
            allowance_release(key, cursor=cursor)
        locked.updated_at, locked.lease_until = timezone.now(), None
        locked.save(update_fields=["status", "result", "updated_at", "lease_until"])
    return Settled(key, record.tool, locked.status)


def _take(key: str) -> tuple[IdempotencyRecord, datetime] | None:
    """The key under this settler's lease: unsettled, a direct call's, and held by no one
    (neither a process still making its effect nor another settler)."""
    now = timezone.now()
    with transaction.atomic():
        record = (
            IdempotencyRecord.objects.select_for_update(skip_locked=True)
            .filter(Q(lease_until=None) | Q(lease_until__lte=now), pk=key, confirmation_id="")
            .filter(status__in=_UNSETTLED)
            .first()
        )
        if record is None:
            return None
        record.lease_until = now + timedelta(seconds=SETTLE_LEASE_SECONDS)
        record.save(update_fields=["lease_until"])
    return record, record.lease_until


def _read(spec: ToolSpec[Any], record: IdempotencyRecord) -> Mapping[str, Any] | None:
    call = record.remote_call
    if spec.outcome_of is None and not isinstance(call, Mapping):
        # Nothing to ask by: stays unknown for a person (the same call sent again settles it).
        raise OutcomeUnknownError(f"{spec.name}: no call recorded to read its effect by")
    call = call if isinstance(call, Mapping) else {}
    return outcome_read(
        spec,
        key=record.key,
        arguments=call.get("arguments") or {},
        customer_id=str(call.get("customer_id", "")),
        agent_id=str(call.get("agent_id", "")),
    )


def outcome_read(
    spec: ToolSpec[Any],
    *,
    key: str,
    arguments: Mapping[str, Any],
    customer_id: str,
    agent_id: str,
) -> Mapping[str, Any] | None:
    """What the system of record did under a call's key: its tool's read by key, or else by the
    call's arguments. Raises OutcomeUnknownError where it cannot be read now."""
    if spec.outcome_of is not None:
        return spec.outcome_of(key)
    if spec.effect_of is None:
        raise OutcomeUnknownError(f"{spec.name} cannot be asked for its outcome")
    try:
        parsed = spec.arguments.model_validate_json(json.dumps(dict(arguments)))
    except ValueError:
        raise OutcomeUnknownError(
            f"{spec.name}: its recorded arguments no longer validate"
        ) from None
    return spec.effect_of(parsed, ExecutionContext(customer_id, key, (), None, agent_id))
