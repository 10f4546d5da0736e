"""The core's state port on the ORM.

Every method runs inside the transaction that dispatch.services opens around a call, so a call's
step, idempotency record, confirmation, ledger row and audit record commit together or not at all.
Two statements are raw SQL (the same on PostgreSQL and SQLite, both of which have ON CONFLICT and
RETURNING): counting a step and claiming a key each take one round trip, on the hot path of every
call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils.dateparse import parse_datetime

from approvals.models import Confirmation
from dispatch.models import AuditRecord, IdempotencyRecord, Session
from dispatch.pipeline.state import (
    AuditEntry,
    Claim,
    KeyStatus,
    PendingConfirmation,
    SessionConflict,
    decide_claim,
)

_SESSION = Session._meta.db_table
_RECORD = IdempotencyRecord._meta.db_table

_STEP_SQL = f"""
    UPDATE {_SESSION} SET steps = steps + 1, last_call_at = %s
    WHERE agent_id = %s AND session_id = %s AND customer_id = %s
    RETURNING steps
"""

_CLAIM_SQL = f"""
    INSERT INTO {_RECORD}
        (key, agent_id, session_id, tool, status, attempts, created_at, updated_at)
    VALUES (%s, %s, %s, %s, 'open', %s, %s, %s)
    ON CONFLICT (key) DO UPDATE
        SET attempts = {_RECORD}.attempts + %s, updated_at = excluded.updated_at
    RETURNING status, attempts, result, confirmation_id, confirmation_expires_at
"""


def _db_now(now: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(now)


def _as_datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value.replace(tzinfo=value.tzinfo or UTC) if value else None
    parsed = parse_datetime(str(value))
    return parsed.replace(tzinfo=parsed.tzinfo or UTC) if parsed else None


def _as_json(value: Any) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return value
    loaded = json.loads(value)
    return loaded if isinstance(loaded, Mapping) else None


class OrmState:
    def next_step(self, *, agent_id: str, session_id: str, customer_id: str) -> int:
        now = datetime.now(UTC)
        params = [_db_now(now), int(agent_id), session_id, customer_id]
        with connection.cursor() as cursor:
            cursor.execute(_STEP_SQL, params)
            row = cursor.fetchone()
            if row is not None:
                return int(row[0])
            try:
                with transaction.atomic():
                    Session.objects.create(
                        agent_id=int(agent_id),
                        session_id=session_id,
                        customer_id=customer_id,
                        steps=1,
                        last_call_at=now,
                    )
                return 1
            except IntegrityError:
                # Created meanwhile: by a twin call for the same customer, or for another one.
                cursor.execute(_STEP_SQL, params)
                row = cursor.fetchone()
        if row is None:
            raise SessionConflict(session_id)
        return int(row[0])

    def claim(
        self,
        *,
        key: str,
        agent_id: str,
        session_id: str,
        tool: str,
        exclusive: bool,
        repeat_limit: int,
        now: datetime,
        count: bool = True,
    ) -> Claim:
        increment = 1 if count else 0
        stamp = _db_now(now)
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    _CLAIM_SQL,
                    [key, int(agent_id), session_id, tool, increment, stamp, stamp, increment],
                )
                status_text, attempts, result, confirmation_id, expires_at = cursor.fetchone()
                status = KeyStatus(status_text)
                expiry = _as_datetime(expires_at)
                verdict, new_status = decide_claim(
                    status=status,
                    attempts=attempts,
                    repeat_limit=repeat_limit,
                    exclusive=exclusive,
                    confirmation_live=expiry is not None and expiry > now,
                )
                if new_status is not status:
                    # Compare-and-set: only one of two racing twins moves the key on.
                    cursor.execute(
                        f"UPDATE {_RECORD} SET status = %s WHERE key = %s AND status = %s",
                        [new_status.value, key, status.value],
                    )
                    if cursor.rowcount != 1:
                        increment = 0
                        continue
                confirmation = (
                    _pending(confirmation_id)
                    if confirmation_id and verdict.value == "held"
                    else None
                )
                return Claim(
                    verdict=verdict,
                    attempts=attempts,
                    previous=status,
                    result=_as_json(result),
                    confirmation=confirmation,
                )

    def settle(
        self, *, key: str, status: KeyStatus, result: Mapping[str, Any] | None = None
    ) -> None:
        IdempotencyRecord.objects.filter(key=key).update(
            status=status.value, result=result, updated_at=datetime.now(UTC)
        )

    def hold(self, confirmation: PendingConfirmation) -> None:
        with transaction.atomic():
            Confirmation.objects.create(
                id=confirmation.confirmation_id,
                key=confirmation.key,
                tool=confirmation.tool,
                arguments=dict(confirmation.arguments),
                arguments_hash=confirmation.arguments_hash,
                agent_id=int(confirmation.agent_id),
                session_id=confirmation.session_id,
                customer_id=confirmation.customer_id,
                policy_version=confirmation.policy_version,
                reviewers_required=confirmation.reviewers_required,
                amount_cents=confirmation.amount_cents,
                created_at=confirmation.created_at,
                expires_at=confirmation.expires_at,
            )
            IdempotencyRecord.objects.filter(key=confirmation.key).update(
                status=KeyStatus.HELD.value,
                confirmation_id=confirmation.confirmation_id,
                confirmation_expires_at=confirmation.expires_at,
                updated_at=confirmation.created_at,
            )

    def record(self, entry: AuditEntry) -> None:
        AuditRecord.objects.create(
            call_id=entry.call_id,
            at=entry.at,
            agent_id=int(entry.agent_id),
            session_id=entry.session_id,
            customer_id=entry.customer_id,
            step=entry.step,
            tool=entry.tool[:128],
            raw_arguments=entry.raw_arguments,
            arguments=dict(entry.arguments) if entry.arguments is not None else None,
            key=entry.key or "",
            ok=entry.ok,
            code=entry.code,
            message=entry.message,
            replayed=entry.replayed,
            confirmation_id=entry.confirmation_id or "",
            policy_version=entry.policy_version,
            duration_ms=entry.duration_ms,
        )


def _pending(confirmation_id: str) -> PendingConfirmation | None:
    held = Confirmation.objects.filter(pk=confirmation_id).first()
    if held is None:
        return None
    return PendingConfirmation(
        confirmation_id=held.id,
        key=held.key,
        tool=held.tool,
        arguments=held.arguments,
        arguments_hash=held.arguments_hash,
        agent_id=str(held.agent_id),
        session_id=held.session_id,
        customer_id=held.customer_id,
        policy_version=held.policy_version,
        reviewers_required=held.reviewers_required,
        amount_cents=held.amount_cents,
        created_at=held.created_at,
        expires_at=held.expires_at,
    )
