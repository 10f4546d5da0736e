"""The one place where the store differs between PostgreSQL and SQLite.

PostgreSQL joins a call's opening (step, claim and lookup) into one statement and its end (key
settled, money reserved, audit record appended) into another, and lets a read run with no
transaction around it. SQLite runs the same statements one by one, and keeps every call in one
transaction: there each commit of its own would be a sync of the database file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from typing import Any, Protocol

import psycopg
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from dispatch.pipeline.tools import LookupSource
from dispatch.store import sql
from dispatch.store.allowance import RESERVE, reserve_sql

Row = dict[str, Any]
# A statement with its parameters.
Statement = tuple[str, Mapping[str, Any]]


def fetch_row(cursor: CursorWrapper) -> Row | None:
    """The statement's one row, by column name; None if it returned none."""
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip(_column_names(cursor.cursor), row, strict=True))


def _column_names(cursor: Any) -> list[str]:
    # psycopg's `description` makes an object a column each time it is read; the result's names
    # are a call apiece.
    result = getattr(cursor, "pgresult", None)
    if result is None:  # sqlite3's cursor
        return [column[0] for column in cursor.description]
    return [result.fname(number).decode() for number in range(result.nfields)]


class Backend(Protocol):
    def read_scope(self) -> AbstractContextManager[Any]:
        """What runs around a call that writes nothing (a write always has a transaction)."""
        ...

    def count_step(self, cursor: CursorWrapper, params: Mapping[str, Any]) -> Row | None:
        """Count the step of a call that claims nothing: `steps`, or None as below."""
        ...

    def open_call(
        self,
        cursor: CursorWrapper,
        params: Mapping[str, Any],
        lookup: tuple[LookupSource, Mapping[str, Any]] | None,
        then: Sequence[Statement] = (),
    ) -> tuple[Row | None, list[list[Any]]]:
        """Count the step and, within the budget, claim the key and read the lookup; then run
        the statements `then` in the same request, each after the one before it.

        The row has `steps`, the claim's `key_*` columns (None over the budget), and, if the
        lookup was read, `lookup_found` (None for no record) and the record's columns. None: the
        session is another customer's. Then the rows of each statement of `then` (none for a
        backend that cannot send them with the opening: the caller runs them itself).
        """
        ...

    def end_call(
        self,
        cursor: CursorWrapper,
        settle: Mapping[str, Any] | None,
        audit: Mapping[str, Any],
        reserve: Mapping[str, Any] | None = None,
        *,
        commit: bool = False,
    ) -> bool:
        """Settle the key and write the call's reservation of money (each if any) and append
        the audit record, in the call's last request. False: its place in the session's chain
        was taken, and no record was appended (sql.AUDIT); the key and the money were written
        all the same. `commit`: the statement is the last of the call's transaction, which the
        store may commit with it (a backend that does not leaves the commit to the scope)."""
        ...


class PostgreSQL:
    def read_scope(self) -> AbstractContextManager[Any]:
        # A read's statements each commit on their own, and nothing is lost between them: a
        # read's claim only counts repeats, and running a read twice is harmless. If the process
        # dies between them, the step and the repeat stay counted and the call has no audit
        # record; an agent that was answered always has its record.
        return nullcontext()

    def count_step(self, cursor: CursorWrapper, params: Mapping[str, Any]) -> Row | None:
        cursor.execute(
            sql.STEP_POSTGRESQL,
            {**only(params, *_STEP_PARAMS), "commit_async": _commits_on_its_own()},
        )
        return fetch_row(cursor)

    def open_call(
        self,
        cursor: CursorWrapper,
        params: Mapping[str, Any],
        lookup: tuple[LookupSource, Mapping[str, Any]] | None,
        then: Sequence[Statement] = (),
    ) -> tuple[Row | None, list[list[Any]]]:
        source_sql, lookup_params = sql.NO_LOOKUP, {}
        if lookup is not None:
            source, key = lookup
            source_sql = _lookup_sql(source.sql)
            lookup_params = {f"lookup_{name}": value for name, value in key.items()}
        opening = _open_sql(source_sql, "watched" in params)
        params = {**params, **lookup_params, "commit_async": _commits_on_its_own()}
        if then:
            # One round trip: each statement starts once the one before it ended (a lock the
            # opening's followers take is held when the next one reads).
            raw = cursor.cursor.connection
            with connection.wrap_database_errors, raw.pipeline():
                cursor.execute(opening, params)
                followers = [raw.execute(statement, values) for statement, values in then]
            results = [follower.fetchall() for follower in followers]
        else:
            cursor.execute(opening, params)
            results = []
        row = fetch_row(cursor)
        if row is not None and lookup is None:
            row.pop("lookup_found")
            row.pop("nothing")
        return row, results

    def end_call(
        self,
        cursor: CursorWrapper,
        settle: Mapping[str, Any] | None,
        audit: Mapping[str, Any],
        reserve: Mapping[str, Any] | None = None,
        *,
        commit: bool = False,
    ) -> bool:
        params = {**audit, **(settle or {})}
        if reserve is not None:
            params |= {f"{_RESERVED}{name}": value for name, value in reserve.items()}
        settles, reserves = settle is not None, reserve is not None
        if commit:
            return _end_and_commit(cursor, _end_sql(settles, reserves, sql.AUDIT_OR_FAIL), params)
        cursor.execute(_end_sql(settles, reserves, sql.AUDIT), params)
        return bool(cursor.rowcount == 1)


def _commits_on_its_own() -> bool:
    # Only such a statement may commit asynchronously (sql.OPEN_POSTGRESQL says why).
    return connection.get_autocommit() and not connection.in_atomic_block


# The reservation's placeholders in the call's last statement, apart from the audit record's.
_RESERVED = "reserved_"


_SAVEPOINT = "toolgate_call_end"


def _end_and_commit(cursor: CursorWrapper, statement: str, params: Mapping[str, Any]) -> bool:
    """The call's last statement and its commit, in one round trip. The statement runs under a
    savepoint and fails if its record's place was taken; the transaction then goes back to the
    savepoint, open, and the call links its record again (False) and commits as usual. The commit
    ends the savepoint with the transaction: no statement releases it first."""
    raw = cursor.cursor.connection
    with connection.wrap_database_errors:
        try:
            with raw.pipeline():
                raw.execute(f"SAVEPOINT {_SAVEPOINT}")
                raw.execute(statement, params)
                raw.commit()
        except psycopg.errors.UniqueViolation as error:
            if error.diag.constraint_name != sql.CHAIN_PLACE:
                raise
            raw.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            return False
    return True


def ends_transaction() -> bool:
    """Whether the transaction the caller is in is its connection's own, outermost one: the one
    its last statement may commit (not a savepoint in a test's or a request's transaction)."""
    return (
        connection.in_atomic_block
        and len(connection.atomic_blocks) == 1
        and connection.commit_on_exit
        and not connection.needs_rollback
    )


@cache
def _end_sql(settles: bool, reserves: bool, audit: str) -> str:
    # A call ends in one statement: its key settled and its money reserved (each if it has one)
    # with its audit record appended; both are written even where the record's place in the
    # chain was taken (sql.AUDIT) and the record is linked again. What managers count of the call
    # is counted later from that record (analytics/fills.py), not here.
    parts = [f"settled AS ({sql.SETTLE})"] if settles else []
    if reserves:
        parts.append(f"reserved AS ({reserve_sql(_RESERVED)})")
    return f"WITH {', '.join(parts)} {audit}" if parts else audit


@cache
def _open_sql(lookup_sql: str, watched: bool) -> str:
    return sql.OPEN_POSTGRESQL.format(step=step_sql(watched), lookup=lookup_sql, head=sql.HEAD)


def step_sql(watched: bool) -> str:
    """The step's statement: a read of a held call's status (its `watched` parameter) counts
    nothing while that call waits."""
    return sql.WATCHED_STEP if watched else sql.STEP


@cache
def _lookup_sql(source_sql: str) -> str:
    # A lookup's placeholders are named after its key; in the opening they get a prefix, so that
    # they cannot meet the opening's own.
    return re.sub(r"%\((\w+)\)s", r"%(lookup_\1)s", source_sql)


class SQLite:
    def read_scope(self) -> AbstractContextManager[Any]:
        return transaction.atomic()

    def count_step(self, cursor: CursorWrapper, params: Mapping[str, Any]) -> Row | None:
        watched = "watched" in params
        names = (*_STEP_PARAMS, "watched") if watched else _STEP_PARAMS
        cursor.execute(step_sql(watched), only(params, *names))
        step = fetch_row(cursor)
        if step is None:
            return None
        cursor.execute(sql.HEAD, only(params, "agent_id", "session_id"))
        head = fetch_row(cursor) or {"audit_seq": None, "audit_head": None}
        return {**step, **head}

    def open_call(
        self,
        cursor: CursorWrapper,
        params: Mapping[str, Any],
        lookup: tuple[LookupSource, Mapping[str, Any]] | None,
        then: Sequence[Statement] = (),
    ) -> tuple[Row | None, list[list[Any]]]:
        # Nothing is read ahead: the tool reads its record itself, and the caller runs `then`.
        step = self.count_step(cursor, params)
        if step is None:
            return None, []
        if step["steps"] > params["step_budget"] and step["counted"]:
            return step, []
        # The key's use counts as the step did (nothing for a free read of a held call's status).
        cursor.execute(sql.CLAIM, {**only(params, *CLAIM_PARAMS), "count": step["counted"]})
        claimed = fetch_row(cursor)
        return {**step, **(claimed or {})}, []

    def end_call(
        self,
        cursor: CursorWrapper,
        settle: Mapping[str, Any] | None,
        audit: Mapping[str, Any],
        reserve: Mapping[str, Any] | None = None,
        *,
        commit: bool = False,
    ) -> bool:
        # The scope commits: on SQLite a commit is no round trip.
        if settle is not None:
            cursor.execute(sql.SETTLE, settle)
        if reserve is not None:
            cursor.execute(RESERVE, reserve)
        cursor.execute(sql.AUDIT, audit)
        return bool(cursor.rowcount == 1)


_STEP_PARAMS = ("agent_id", "session_id", "customer_id", "now")
CLAIM_PARAMS = ("key", "agent_id", "session_id", "tool", "new_status", "count", "now")


def only(params: Mapping[str, Any], *names: str) -> dict[str, Any]:
    # SQLite wants exactly the parameters a statement names.
    return {name: params[name] for name in names}


def backend() -> Backend:
    return PostgreSQL() if connection.vendor == "postgresql" else SQLite()
