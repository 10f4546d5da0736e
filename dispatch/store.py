"""The core's state port on the ORM.

A call that claims an exclusive key (a tool that writes, past stage 3) runs in one transaction,
begun as the key is claimed and ended with the call (`call_scope`): its step, idempotency record,
confirmation, ledger row and audit record commit together or not at all, and an identical call
waits on the key's row lock. On PostgreSQL any other call (a read, or a call refused before
stage 4) runs its statements with no transaction around them: see `call_scope` for why nothing
is lost.
The statements on the hot path of every call are raw SQL (the same on PostgreSQL and SQLite, both
of which have ON CONFLICT and RETURNING), one round trip each, on one cursor for the whole call, and
no ORM query compiled per call:
counting a step (two on a session's first call), claiming a key (a new key of a write is claimed
and owned in the same statement; on PostgreSQL with the step, and with the record the tool reads
first, see dispatch/readahead.py), settling it, and appending the audit record. Benchmark (b) in
docs/benchmarks.md is why: under load a call's cost is mostly its round trips and ORM overhead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils.dateparse import parse_datetime

from dispatch.models import Confirmation
from dispatch import readahead
from dispatch.models import AuditRecord, IdempotencyRecord, Session
from dispatch.pipeline.state import (
    AuditEntry,
    Claim,
    ClaimRequest,
    KeyStatus,
    Opening,
    PendingConfirmation,
    SessionConflict,
    Settlement,
    Verdict,
    decide_claim,
)

_SESSION = Session._meta.db_table
_RECORD = IdempotencyRecord._meta.db_table

# One statement for every call of a session: the first binds it to its customer, the others count
# a step; no row comes back when the session is bound to another customer. A twin of a first call
# waits on the other's insert, then counts its own step.
_STEP_SQL = f"""
    INSERT INTO {_SESSION} AS session
        (agent_id, session_id, customer_id, steps, created_at, last_call_at)
    VALUES (%s, %s, %s, 1, %s, %s)
    ON CONFLICT (agent_id, session_id) DO UPDATE
        SET steps = session.steps + 1, last_call_at = excluded.last_call_at
        WHERE session.customer_id = excluded.customer_id
    RETURNING steps
"""

_CLAIM_COLUMNS = "status, attempts, result, confirmation_id, confirmation_expires_at, created_at"


def _claim_sql(rows: str) -> str:
    """The claim's insert, of the rows given (VALUES, or a SELECT in a WITH)."""
    return f"""
    INSERT INTO {_RECORD}
        (key, agent_id, session_id, tool, status, attempts, confirmation_id, created_at, updated_at)
    {rows}
    ON CONFLICT (key) DO UPDATE
        SET attempts = {_RECORD}.attempts + %s, updated_at = excluded.updated_at
    RETURNING {_CLAIM_COLUMNS}
"""


# A new key is inserted in the status the decision table gives it (a write's is in progress at
# once); an existing one is counted and returned for the decision.
_CLAIM_SQL = _claim_sql("VALUES (%s, %s, %s, %s, %s, %s, '', %s, %s)")

# On PostgreSQL a call opens in one statement: the step is counted and, if it is within the
# budget, the key is claimed as _CLAIM_SQL does. No row: the session is another customer's.
_CLAIM_IF_WITHIN_BUDGET_SQL = _claim_sql(
    "SELECT %s, %s, %s, %s, %s, %s, '', %s, %s FROM step WHERE step.steps <= %s"
)

# Outside a transaction block, a call's first statement commits on its own, without waiting for
# its WAL to reach the disk: the call's last statement (the audit record) commits synchronously,
# and that flush covers everything written before it, so whatever an agent was answered about is
# durable. set_config(..., true) lasts only for the statement's own transaction.
_ASYNC_COMMIT = "commit_mode AS (SELECT set_config('synchronous_commit', 'off', true))"


@cache
def _open_sql(*, asynchronous: bool, lookup_sql: str | None = None) -> str:
    """The call's opening in one statement, committed asynchronously or not.

    With a lookup's SELECT (dispatch/readahead.py), the same statement reads that record too, but
    only within the budget: a call over it reads nothing, as it claims nothing.
    """
    commit_mode = f"{_ASYNC_COMMIT}, " if asynchronous else ""
    source = "commit_mode, step" if asynchronous else "step"
    looked, looked_columns = "", ""
    if lookup_sql is not None:
        looked = (
            ", looked AS (SELECT true AS found, lookup.* FROM "
            f"({lookup_sql}) AS lookup WHERE (SELECT steps FROM step) <= %s)"
        )
        looked_columns, source = ", looked.*", f"{source} LEFT JOIN looked ON true"
    return f"""
    WITH {commit_mode}step AS ({_STEP_SQL}), claimed AS ({_CLAIM_IF_WITHIN_BUDGET_SQL}){looked}
    SELECT step.steps, claimed.*{looked_columns} FROM {source} LEFT JOIN claimed ON true
"""


# The opening's row: the step, then the claim's columns, then the lookup's found flag and row.
_CLAIM_END = 1 + len(_CLAIM_COLUMNS.split(","))
_STEP_ASYNC_SQL = f"WITH {_ASYNC_COMMIT}, step AS ({_STEP_SQL}) SELECT steps FROM commit_mode, step"

_SETTLE_SQL = f"UPDATE {_RECORD} SET status = %s, result = %s, updated_at = %s WHERE key = %s"
_RESULT_FIELD = IdempotencyRecord._meta.get_field("result")

# Every column but the id, taken from the model: a field added to it fails here, loudly.
_AUDIT_FIELDS = [field for field in AuditRecord._meta.concrete_fields if not field.primary_key]
_AUDIT_SQL = (
    f"INSERT INTO {AuditRecord._meta.db_table} "
    f"({', '.join(connection.ops.quote_name(str(field.column)) for field in _AUDIT_FIELDS)}) "
    f"VALUES ({', '.join(['%s'] * len(_AUDIT_FIELDS))})"
)
# Strings, numbers and booleans go to the database as they are; the other values (JSON, datetimes)
# are prepared by their field, as the ORM's insert would. Preparing every field cost a tenth of
# the store's time on a call.
_PLAIN_TYPES = {
    "BigIntegerField",
    "BooleanField",
    "CharField",
    "FloatField",
    "IntegerField",
    "PositiveIntegerField",
    "PositiveSmallIntegerField",
    "SmallIntegerField",
    "TextField",
}
_AUDIT_PREPARE = [
    (
        field.attname,
        None
        if field.is_relation or field.get_internal_type() in _PLAIN_TYPES
        else field.get_db_prep_save,
    )
    for field in _AUDIT_FIELDS
]
# On PostgreSQL a call ends in one statement: the key is settled in a data-modifying WITH.
_SETTLED_AUDIT_SQL = f"WITH settled AS ({_SETTLE_SQL}) {_AUDIT_SQL}"


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


def _one_statement() -> bool:
    # Data-modifying WITH is PostgreSQL's; SQLite runs the same work as separate statements.
    return bool(connection.vendor == "postgresql")


def _on_its_own() -> bool:
    """Whether a statement sent now commits on its own (PostgreSQL, outside a transaction).

    Inside one, an asynchronous commit would apply to the whole transaction: never there.
    """
    return _one_statement() and connection.get_autocommit() and not connection.in_atomic_block


class _Call:
    """The open call of this thread (or task): where its transaction and cursor are kept."""

    __slots__ = ("cursor", "stack")

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.cursor: CursorWrapper | None = None


_CALL: ContextVar[_Call | None] = ContextVar("toolgate_call", default=None)


def _cursor() -> AbstractContextManager[CursorWrapper]:
    """A cursor for one statement: the call's own, opened by its first and closed at its end.

    Opening a Django cursor costs about a third of a short statement's client CPU; a call's
    statements share one. Outside a call, a cursor of its own, closed after the statement.
    """
    call = _CALL.get()
    if call is None:
        return connection.cursor()
    if call.cursor is None:
        call.cursor = call.stack.enter_context(connection.cursor())
    return nullcontext(call.cursor)


class OrmState:
    @contextmanager
    def call_scope(self) -> Iterator[None]:
        """The span of one call; every method of the port is called inside it.

        A call that claims an exclusive key needs a transaction: its claim, effect and audit
        record must commit together, and the key's row lock is what makes an identical call
        wait and then replay. It is begun just before the claim (`_begin_call_transaction`) and
        ends here, committed, or rolled back if the call raised. Any other call needs none: a
        read's claim only counts repeats (decide_claim lets every read proceed) and running a
        read twice is harmless, and a call refused before stage 4 claims nothing. On PostgreSQL
        their statements (the opening, the read, the audit record) run on their own, which saves
        BEGIN and COMMIT, two round trips. If the process dies between them, the step and the
        repeat stay counted and the call has no audit record; an agent that was answered always
        has its record. SQLite, where every commit of its own is a file sync, keeps one
        transaction for every call.
        """
        with ExitStack() as stack:
            stack.enter_context(readahead.call_reads())
            if not _one_statement():
                stack.enter_context(transaction.atomic())
            token = _CALL.set(_Call(stack))
            try:
                yield
            finally:
                _CALL.reset(token)

    def _begin_call_transaction(self) -> None:
        call = _CALL.get()
        if call is None:
            # A write's claim outside a call's scope would run with no transaction around it.
            raise RuntimeError("OrmState claims a write's key only inside call_scope()")
        if _one_statement():
            call.stack.enter_context(transaction.atomic())

    def open_call(
        self,
        *,
        agent_id: str,
        session_id: str,
        customer_id: str,
        step_budget: int,
        claim: ClaimRequest | None,
    ) -> Opening:
        if claim is not None and claim.exclusive:
            self._begin_call_transaction()
        if claim is not None and _one_statement():
            increment = 1
            first_verdict, first_status = _first_decision(claim, increment)
            stamp = _db_now(claim.now)
            lookup = claim.lookup
            source = None if lookup is None else readahead.source_get(lookup[0])
            with _cursor() as cursor:
                cursor.execute(
                    _open_sql(
                        asynchronous=_on_its_own(),
                        lookup_sql=None if source is None else source.sql,
                    ),
                    [
                        int(agent_id),
                        session_id,
                        customer_id,
                        stamp,
                        stamp,
                        claim.key,
                        int(agent_id),
                        session_id,
                        claim.tool,
                        first_status.value,
                        increment,
                        stamp,
                        stamp,
                        step_budget,
                        increment,
                        *(() if source is None or lookup is None else (*lookup[1], step_budget)),
                    ],
                )
                row = cursor.fetchone()
            if row is None:
                raise SessionConflict(session_id)
            steps = int(row[0])
            if steps > step_budget:
                return Opening(steps, None)
            if source is not None and lookup is not None:
                found = row[_CLAIM_END]
                readahead.keep(lookup, source.to_value(row[_CLAIM_END + 1 :]) if found else None)
            return Opening(
                steps,
                self._decide(
                    row[1:_CLAIM_END],
                    claim,
                    agent_id,
                    session_id,
                    increment,
                    first_verdict,
                    first_status,
                ),
            )
        steps = self.next_step(agent_id=agent_id, session_id=session_id, customer_id=customer_id)
        if claim is None or steps > step_budget:
            return Opening(steps, None)
        return Opening(
            steps,
            self.claim(
                key=claim.key,
                agent_id=agent_id,
                session_id=session_id,
                tool=claim.tool,
                exclusive=claim.exclusive,
                repeat_limit=claim.repeat_limit,
                now=claim.now,
            ),
        )

    def next_step(self, *, agent_id: str, session_id: str, customer_id: str) -> int:
        stamp = _db_now(datetime.now(UTC))
        with _cursor() as cursor:
            cursor.execute(
                _STEP_ASYNC_SQL if _on_its_own() else _STEP_SQL,
                [int(agent_id), session_id, customer_id, stamp, stamp],
            )
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
        request = ClaimRequest(key, tool, exclusive, repeat_limit, now)
        increment = 1 if count else 0
        first_verdict, first_status = _first_decision(request, increment)
        stamp = _db_now(now)
        with _cursor() as cursor:
            cursor.execute(
                _CLAIM_SQL,
                [
                    key,
                    int(agent_id),
                    session_id,
                    tool,
                    first_status.value,
                    increment,
                    stamp,
                    stamp,
                    increment,
                ],
            )
            row = cursor.fetchone()
        return self._decide(
            row, request, agent_id, session_id, increment, first_verdict, first_status
        )

    def _decide(
        self,
        row: Any,
        request: ClaimRequest,
        agent_id: str,
        session_id: str,
        increment: int,
        first_verdict: Verdict,
        first_status: KeyStatus,
    ) -> Claim:
        """Apply the decision table to a key's row as the claim statement returned it."""
        key, now = request.key, request.now
        while True:
            status_text, attempts, result, confirmation_id, expires_at, created_at = row
            status = KeyStatus(status_text)
            if (
                increment
                and attempts == increment
                and status is first_status
                and _as_datetime(created_at) == now
            ):
                # Inserted by this very statement (an existing key would count 2 or more):
                # already in the status its decision gives it, so no compare-and-set.
                return Claim(verdict=first_verdict, attempts=attempts, previous=KeyStatus.OPEN)
            expiry = _as_datetime(expires_at)
            verdict, new_status = decide_claim(
                status=status,
                attempts=attempts,
                repeat_limit=request.repeat_limit,
                exclusive=request.exclusive,
                confirmation_live=expiry is not None and expiry > now,
            )
            if new_status is not status:
                with _cursor() as cursor:
                    # Compare-and-set: only one of two racing twins moves the key on.
                    cursor.execute(
                        f"UPDATE {_RECORD} SET status = %s WHERE key = %s AND status = %s",
                        [new_status.value, key, status.value],
                    )
                    moved = cursor.rowcount == 1
                    if not moved:
                        # The twin moved it first: read the key again, without counting twice.
                        increment = 0
                        stamp = _db_now(now)
                        cursor.execute(
                            _CLAIM_SQL,
                            [
                                key,
                                int(agent_id),
                                session_id,
                                request.tool,
                                first_status.value,
                                0,
                                stamp,
                                stamp,
                                0,
                            ],
                        )
                        row = cursor.fetchone()
                        continue
            confirmation = (
                _pending(confirmation_id) if confirmation_id and verdict is Verdict.HELD else None
            )
            return Claim(
                verdict=verdict,
                attempts=attempts,
                previous=status,
                result=_as_json(result),
                confirmation=confirmation,
            )

    def settle(self, settlement: Settlement) -> None:
        with _cursor() as cursor:
            cursor.execute(_SETTLE_SQL, _settle_params(settlement))

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

    def record(self, entry: AuditEntry, settlement: Settlement | None = None) -> None:
        values = {
            "call_id": entry.call_id,
            "at": entry.at,
            "agent_id": int(entry.agent_id),
            "session_id": entry.session_id,
            "customer_id": entry.customer_id,
            "step": entry.step,
            "tool": _storable(entry.tool[:128]),
            "raw_arguments": _storable(entry.raw_arguments),
            "arguments": dict(entry.arguments) if entry.arguments is not None else None,
            "key": entry.key or "",
            "ok": entry.ok,
            "code": entry.code,
            "message": _storable(entry.message),
            "replayed": entry.replayed,
            "confirmation_id": entry.confirmation_id or "",
            "policy_version": entry.policy_version,
            "duration_ms": entry.duration_ms,
        }
        params: list[Any] = [
            values[name] if prepare is None else prepare(values[name], connection)
            for name, prepare in _AUDIT_PREPARE
        ]
        with _cursor() as cursor:
            if settlement is None:
                cursor.execute(_AUDIT_SQL, params)
            elif _one_statement():
                cursor.execute(_SETTLED_AUDIT_SQL, [*_settle_params(settlement), *params])
            else:
                cursor.execute(_SETTLE_SQL, _settle_params(settlement))
                cursor.execute(_AUDIT_SQL, params)


def _first_decision(request: ClaimRequest, increment: int) -> tuple[Verdict, KeyStatus]:
    """What the decision table makes of a key seen for the first time."""
    return decide_claim(
        status=KeyStatus.OPEN,
        attempts=increment,
        repeat_limit=request.repeat_limit,
        exclusive=request.exclusive,
        confirmation_live=False,
    )


def _settle_params(settlement: Settlement) -> list[Any]:
    return [
        settlement.status.value,
        _RESULT_FIELD.get_db_prep_save(settlement.result, connection),
        _db_now(datetime.now(UTC)),
        settlement.key,
    ]


def _storable(text: str) -> str:
    # PostgreSQL text cannot hold NUL, and a model can send one in a tool name, in raw arguments
    # or in a field name that a message repeats: the audit keeps it visible, escaped as in JSON.
    return text.replace("\x00", "\\u0000")


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
