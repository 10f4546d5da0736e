"""The retention of a call's working records: idempotency records and sessions (docs/retention.md).

Audit records are never pruned; a call's effect is in its tool's system of record. What goes:

- an idempotency record that has not moved for TOOLGATE_IDEMPOTENCY_KEEP_SECONDS, unless its
  effect may yet happen or may have happened: a key whose confirmation is not final (pending,
  approved, executing, or unknown until a reviewer reconciles it: CONFIRMATION_LIFECYCLE) or
  whose own status is unknown is kept whatever its age. Pruning an approved call's key would let
  an identical call open a second confirmation and pay twice;
- a session whose last call is older than TOOLGATE_SESSION_KEEP_SECONDS and none of whose keys
  is kept, with whatever keys it still has, in one transaction: a session id bound again to
  another customer never finds the first customer's answers.

- an MCP task answered at once (dispatch.models.AnsweredTask) once its ttl has ended.

Both tables are walked by primary key in slices of TOOLGATE_RETENTION_BATCH rows, one short
transaction each. A call that arrives for a session while its slice is deleted either comes
first, and its step makes the session young again (PostgreSQL checks the deletion's conditions
again on the row the call committed, so the session stays), or waits on the deleted row and,
once the deletion committed, opens a new session with its keys gone: never the old session
without its keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from dispatch.models import CONFIRMATION_FINAL, CONFIRMATION_LIFECYCLE, AnsweredTask
from dispatch.pipeline.state import KeyStatus

# A confirmation in any of these still decides whether its key's effect happens.
_LIVE = ", ".join(
    "'" + status + "'" for status in sorted(set(CONFIRMATION_LIFECYCLE) - CONFIRMATION_FINAL)
)

# A key that is kept whatever its age: its effect may yet happen, or may have happened.
_KEY_KEPT = f"""(
    record.status = '{KeyStatus.UNKNOWN.value}'
    OR EXISTS (
        SELECT 1 FROM dispatch_confirmation AS held
        WHERE held.key = record.key AND held.status IN ({_LIVE})))"""

# A key that must stay: young, or kept whatever its age.
_KEY_STAYS = f"(record.updated_at >= %(key_cutoff)s OR {_KEY_KEPT})"

# The conditions stand on the deleted row itself, not in a subquery: a deletion that waited for a
# row a call was changing checks them again on the row as the call committed it (PostgreSQL's
# READ COMMITTED), and a call's claim or step makes its key or session young.
_KEYS_DUE = f"""
    FROM dispatch_idempotencyrecord AS record
    WHERE record.key > %(after)s {{upto}}
        AND NOT {_KEY_STAYS}
"""

_SESSIONS_DUE = f"""
    FROM dispatch_session AS session
    WHERE session.id > %(after)s {{upto}}
        AND COALESCE(session.last_call_at, session.created_at) < %(session_cutoff)s
        AND NOT EXISTS (
            SELECT 1 FROM dispatch_idempotencyrecord AS record
            WHERE record.agent_id = session.agent_id AND record.session_id = session.session_id
                AND {_KEY_STAYS})
        AND NOT EXISTS (
            SELECT 1 FROM dispatch_confirmation AS held
            WHERE held.agent_id = session.agent_id AND held.session_id = session.session_id
                AND held.status IN ({_LIVE}))
"""

# The upper end of the slice after `after`: None when fewer than `batch` rows are left.
_KEY_SLICE = """
    SELECT key FROM dispatch_idempotencyrecord WHERE key > %(after)s
    ORDER BY key LIMIT 1 OFFSET %(offset)s
"""
_SESSION_SLICE = """
    SELECT id FROM dispatch_session WHERE id > %(after)s
    ORDER BY id LIMIT 1 OFFSET %(offset)s
"""


def _sliced(statement: str, column: str, last: bool) -> str:
    """The statement for a slice; the last slice has no upper end."""
    return statement.format(upto="" if last else f"AND {column} <= %(upto)s")


KEYS_PRUNE = f"DELETE {_KEYS_DUE}"
KEYS_COUNT = f"SELECT count(*) {_KEYS_DUE}"
SESSIONS_PRUNE = f"DELETE {_SESSIONS_DUE} RETURNING agent_id, session_id"
SESSIONS_COUNT = f"SELECT count(*) {_SESSIONS_DUE}"
# The keys of the sessions just deleted, (agent, session) pairs given as VALUES.
_SESSION_KEYS_PRUNE = """
    DELETE FROM dispatch_idempotencyrecord WHERE (agent_id, session_id) IN (VALUES {pairs})
"""
# Pairs per statement: two parameters each, well within SQLite's limit.
_PAIRS_PER_STATEMENT = 500


@dataclass
class Pruned:
    """What one run deleted (or, dry, would delete)."""

    keys: int = 0
    sessions: int = 0
    # The keys deleted with their sessions (already counted in keys).
    session_keys: int = 0
    # MCP tasks answered at once, past their ttl.
    tasks: int = 0
    dry_run: bool = False


Progress = Callable[[str, int, int], None]


def _nothing(_table: str, _slice: int, _deleted: int) -> None:
    return None


def records_prune(
    *,
    now: datetime | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    progress: Progress = _nothing,
) -> Pruned:
    """Delete the idempotency records, then the sessions, past their keep time.

    progress(table, slices done, rows deleted so far) is called after each slice of `batch`
    rows (TOOLGATE_RETENTION_BATCH by default). dry_run counts what would go and deletes
    nothing."""
    now = now or timezone.now()
    cutoffs = prune_cutoffs(now)
    batch = batch or settings.TOOLGATE_RETENTION_BATCH
    pruned = Pruned(dry_run=dry_run)
    for number, (after, upto) in enumerate(_slices(_KEY_SLICE, "", batch), start=1):
        params = _params(cutoffs, after, upto)
        with transaction.atomic(), connection.cursor() as cursor:
            statement = KEYS_COUNT if dry_run else KEYS_PRUNE
            cursor.execute(_sliced(statement, "record.key", upto is None), params)
            pruned.keys += _count(cursor) if dry_run else cursor.rowcount
        progress("idempotency records", number, pruned.keys)

    for number, (after, upto) in enumerate(_slices(_SESSION_SLICE, 0, batch), start=1):
        params = _params(cutoffs, after, upto)
        with transaction.atomic(), connection.cursor() as cursor:
            if dry_run:
                cursor.execute(_sliced(SESSIONS_COUNT, "session.id", upto is None), params)
                pruned.sessions += _count(cursor)
            else:
                gone = sessions_delete(cursor, params)
                deleted = session_keys_delete(cursor, gone)
                pruned.sessions += len(gone)
                pruned.session_keys += deleted
                pruned.keys += deleted
        progress("sessions", number, pruned.sessions)

    due = AnsweredTask.objects.filter(expires_at__lt=now)
    if dry_run:
        pruned.tasks = due.count()
        return pruned
    number = 0
    while ids := list(due.order_by("pk").values_list("pk", flat=True)[:batch]):
        number += 1
        pruned.tasks += AnsweredTask.objects.filter(pk__in=ids).delete()[0]
        progress("answered tasks", number, pruned.tasks)
    return pruned


def prune_cutoffs(now: datetime) -> dict[str, Any]:
    """The moments before which a key, and a session's last call, are past their keep time."""
    keys = timedelta(seconds=settings.TOOLGATE_IDEMPOTENCY_KEEP_SECONDS)
    sessions = timedelta(seconds=settings.TOOLGATE_SESSION_KEEP_SECONDS)
    return {"key_cutoff": _db_time(now - keys), "session_cutoff": _db_time(now - sessions)}


def sessions_delete(cursor: CursorWrapper, params: dict[str, Any]) -> list[tuple[int, str]]:
    """Delete the sessions of a slice that are due; returns their (agent, session id). Their keys
    must go in the same transaction (session_keys_delete)."""
    if not connection.in_atomic_block:
        raise RuntimeError("a session is deleted only in a transaction that deletes its keys")
    cursor.execute(_sliced(SESSIONS_PRUNE, "session.id", "upto" not in params), params)
    return [(int(agent), str(session)) for agent, session in cursor.fetchall()]


def session_keys_delete(cursor: CursorWrapper, sessions: list[tuple[int, str]]) -> int:
    """Delete every key of the sessions given; returns how many."""
    deleted = 0
    for start in range(0, len(sessions), _PAIRS_PER_STATEMENT):
        chunk = sessions[start : start + _PAIRS_PER_STATEMENT]
        pairs = ", ".join(["(%s, %s)"] * len(chunk))
        cursor.execute(
            _SESSION_KEYS_PRUNE.format(pairs=pairs),
            [value for pair in chunk for value in pair],
        )
        deleted += cursor.rowcount
    return deleted


def _params(cutoffs: dict[str, Any], after: Any, upto: Any) -> dict[str, Any]:
    # SQLite wants exactly the parameters a statement names: the last slice names no upper end.
    return {**cutoffs, "after": after} | ({} if upto is None else {"upto": upto})


def _slices(statement: str, first: Any, batch: int) -> Any:
    """(after, upto) of each slice of `batch` rows by primary key; the last has upto None."""
    after = first
    while True:
        with connection.cursor() as cursor:
            cursor.execute(statement, {"after": after, "offset": batch - 1})
            row = cursor.fetchone()
        upto = None if row is None else row[0]
        yield after, upto
        if upto is None:
            return
        after = upto


def _count(cursor: CursorWrapper) -> int:
    row = cursor.fetchone()
    return int(row[0]) if row else 0


def _db_time(moment: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(moment)
