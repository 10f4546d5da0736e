"""Money reserved without a human (StatePort.reserve_allowance) on the database.

On PostgreSQL a reservation is part of its call's transaction: the call takes the customer's
advisory lock (with the currency) and reads the customer's sum in one round trip, and the lock
lasts until the call commits, so a call that races another for the same customer waits for the
other's end and then sees its money; calls of other customers never wait for it. The movement row
itself is written with the call's last statement (dispatch/store/backends.py), so a reservation
costs no round trip of its own, and a call that moves nothing in the end writes none.

Where a policy caps the agent's day, every refund of the agent would wait for the others' effects
under that lock: such a reservation is made on a connection of its own instead, in a short
transaction that holds the customer's lock and then the agent's day's and commits before the call
goes on to its effect, so the agent's calls wait on each other only for that step.

On SQLite a call that writes holds the database's write lock from its first statement, which
serialises reservations already: they are read and written in the call's transaction.

Lock order (dispatch/held_money.py): a call takes its key's record (its opening), then the money
locks, then what its effect writes; a decision never takes a money lock.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from dispatch.pipeline.allowance import (
    HELD,
    POLICY,
    SHOWN,
    AllowanceHistory,
    AllowanceRequest,
    HoldReason,
    Movement,
)

# The customer's money lock, until the call's transaction ends.
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(customer_lock)s, 0))"

# A reservation of its own (a policy caps the agent's day) begins with the customer's lock, then
# the agent's day's, which it then reads. Its commit need not wait for the disk: the call's own
# commit, which follows it on the same server, flushes it, and a crash before that loses the
# call's effect too.
_SIDE_LOCKS = """
    SELECT set_config('synchronous_commit', 'off', true),
        pg_advisory_xact_lock(hashtextextended(%(customer_lock)s, 0)),
        pg_advisory_xact_lock(hashtextextended(%(agent_lock)s, 0))
"""

_LIVE = "released_at IS NULL AND customer_id = %(customer_id)s AND currency = %(currency)s"

_COLUMNS = "key, agent_id, session_id, tool, subject, amount_cents, at, approval, confirmation_id"

# The customer's sum (dispatch/pipeline/allowance.py): money moved within the window, and money on
# its way whenever it was held: a pending confirmation until its expiry (by the call's clock, not
# by a status the beat may not have written yet), an approved one until its execution ends. The
# call's own reservations are left out: its amount counts once.
_COUNTED = f"""
    SELECT {_COLUMNS} FROM dispatch_movement
    WHERE {_LIVE} AND approval IN ('policy', 'reviewer') AND at >= %(since)s
        AND key <> %(key)s AND key <> %(held_key)s
    UNION ALL
    SELECT {_COLUMNS} FROM dispatch_movement
    WHERE {_LIVE} AND (approval = 'approved' OR (approval = 'held' AND expires_at > %(at)s))
        AND key <> %(key)s AND key <> %(held_key)s
"""

# The customer's sum and its movements, in one statement: on every row how much the sum is, in
# how many movements, and of it what is on its way and what a reviewer moved; then one of the
# latest movements, which a hold names (newest first), or of those this call would repeat (oldest
# first, as they were reserved): same tool, subject and amount under another key, moved since the
# policy's look-back (the movement rows outlive the keys' retention) or on its way; neither: the
# sums alone, the movement's columns null. The repeats read the customer's index by time.
_WINDOW = f"""
    WITH counted AS ({_COUNTED}),
    sums AS (
        SELECT COALESCE(SUM(amount_cents), 0) AS cents, COUNT(*) AS movements,
            COALESCE(SUM(CASE WHEN approval IN ('held', 'approved') THEN amount_cents END), 0)
                AS on_its_way,
            COALESCE(SUM(CASE WHEN approval = 'reviewer' THEN amount_cents END), 0) AS reviewed
        FROM counted
    ),
    shown AS (
        SELECT * FROM (
            SELECT {_COLUMNS}, false AS repeat FROM counted
            ORDER BY at DESC, key DESC LIMIT {SHOWN}
        ) AS latest
        UNION ALL
        SELECT {_COLUMNS}, true AS repeat FROM dispatch_movement
        WHERE {_LIVE} AND tool = %(tool)s AND subject = %(subject)s
            AND amount_cents = %(amount_cents)s AND key <> %(key)s AND key <> %(held_key)s
            AND ((approval IN ('policy', 'reviewer') AND at >= %(twins_since)s)
                OR approval = 'approved' OR (approval = 'held' AND expires_at > %(at)s))
    )
    SELECT sums.*, shown.* FROM sums LEFT JOIN shown ON true
    ORDER BY shown.repeat,
        CASE WHEN shown.repeat THEN shown.at END, CASE WHEN shown.repeat THEN shown.key END,
        shown.at DESC, shown.key DESC
"""
_SUMS = 4

_AGENT_DAY = """
    SELECT COALESCE(SUM(amount_cents), 0) FROM dispatch_movement
    WHERE agent_id = %(agent_id)s AND currency = %(currency)s AND day = %(day)s
        AND approval = 'policy' AND released_at IS NULL
"""

# A key reserved before and released (its call moved nothing) is reserved again as new. Money
# moved without a human is reserved under the call's key; held money under its confirmation's
# execution key, until its expiry.
RESERVE = """
    INSERT INTO dispatch_movement AS movement (key, agent_id, session_id, customer_id, currency,
        tool, subject, amount_cents, approval, at, day, released_at, expires_at, confirmation_id)
    VALUES (%(reserved_key)s, %(agent_id)s, %(session_id)s, %(customer_id)s, %(currency)s,
        %(tool)s, %(subject)s, %(amount_cents)s, %(approval)s, %(at)s, %(day)s, NULL,
        %(expires_at)s, %(confirmation_id)s)
    ON CONFLICT (key) DO UPDATE SET agent_id = excluded.agent_id,
        session_id = excluded.session_id, amount_cents = excluded.amount_cents,
        approval = excluded.approval, at = excluded.at, day = excluded.day, released_at = NULL,
        expires_at = excluded.expires_at, confirmation_id = excluded.confirmation_id
"""

_RELEASE = """
    UPDATE dispatch_movement SET released_at = %(now)s
    WHERE key = %(key)s AND released_at IS NULL
"""

# The reservations' protocol: the only statements the application runs on dispatch_movement, and
# what each may do to a row. The customer's sum is what stops money moving past a limit, so
# what must never happen is money leaving it that did not leave it by the protocol.
#
#   INSERT           a reservation, as moved without a human ('policy') under the call's key, or
#                    as held ('held', until its confirmation's expiry) under the confirmation's
#                    execution key (RESERVE); 'reviewer' by dispatch.held_money_executed when
#                    the held row is missing.
#   UPDATE, release  released_at set on a live row, nothing else (_RELEASE; held_money_released):
#                    the call moved nothing, or the held call was rejected, expired, invalidated
#                    or failed. Money moved with a reviewer ('reviewer') is never released.
#   UPDATE, again    a released row reserved anew under its key (RESERVE's ON CONFLICT); a live
#                    row reserved again by the same call: same approval and amount, not earlier.
#   UPDATE, decided  held → approved, no expiry (held_money_approved); approved → reviewer, at the
#                    execution's end (held_money_executed).
#   UPDATE, expiry   held money's expiry moved sooner (it may be released anyway).
#   DELETE           never.
#
# A row's key, customer, currency, tool and subject never change; while it is live neither do its
# agent, session, amount or confirmation, its time never moves back, and its day is its time's
# UTC day. On PostgreSQL the trigger below refuses every other UPDATE and every DELETE, whoever
# asks (installed by dispatch/store/guards.py); `db_roles` grants the application role no DELETE.
MOVEMENT_PROTOCOL = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'a reservation of money is never deleted (%)', OLD.key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF (NEW.key, NEW.customer_id, NEW.currency, NEW.tool, NEW.subject)
            IS DISTINCT FROM (OLD.key, OLD.customer_id, OLD.currency, OLD.tool, OLD.subject) THEN
        RAISE EXCEPTION
            'a reservation''s key, customer, currency, tool and subject never change (%)', OLD.key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.day IS DISTINCT FROM (NEW.at AT TIME ZONE 'UTC')::date
            AND (NEW.day, NEW.at) IS DISTINCT FROM (OLD.day, OLD.at) THEN
        RAISE EXCEPTION 'a reservation''s day is its time''s UTC day (%)', OLD.key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF OLD.released_at IS NOT NULL THEN
        IF NEW.released_at IS NULL THEN
            RETURN NEW;  -- reserved anew under its key
        END IF;
        RAISE EXCEPTION 'a released reservation changes only by being reserved anew (%)', OLD.key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF (NEW.agent_id, NEW.session_id, NEW.amount_cents, NEW.confirmation_id)
            IS DISTINCT FROM (OLD.agent_id, OLD.session_id, OLD.amount_cents, OLD.confirmation_id)
            OR NEW.at < OLD.at THEN
        RAISE EXCEPTION 'a live reservation keeps its agent, session, amount and confirmation, '
            'and its time never moves back (%)', OLD.key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.released_at IS NOT NULL THEN
        IF OLD.approval <> 'reviewer' AND NEW.approval = OLD.approval AND NEW.at = OLD.at
                AND NEW.expires_at IS NOT DISTINCT FROM OLD.expires_at THEN
            RETURN NEW;  -- released
        END IF;
    ELSIF NEW.approval = OLD.approval THEN
        IF OLD.approval = 'held' AND NEW.expires_at <= OLD.expires_at THEN
            RETURN NEW;  -- reserved again, or its expiry sooner
        END IF;
        IF OLD.approval = 'policy' AND NEW.expires_at IS NULL AND OLD.expires_at IS NULL THEN
            RETURN NEW;  -- reserved again by the same call
        END IF;
    ELSIF NEW.expires_at IS NULL AND (OLD.approval, NEW.approval) IN (
            ('held', 'approved'), ('approved', 'reviewer')) THEN
        RETURN NEW;  -- decided
    END IF;
    RAISE EXCEPTION 'a reservation of money does not move from % to % (%)',
        OLD.approval || CASE WHEN OLD.released_at IS NULL THEN '' ELSE ', released' END,
        NEW.approval || CASE WHEN NEW.released_at IS NULL THEN '' ELSE ', released' END, OLD.key
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

Judge = Callable[[AllowanceHistory], HoldReason | None]

# What a call reserves: the movement row's parameters, written with the call's end (RESERVE).
Reservation = dict[str, Any]


def allowance_ahead(request: AllowanceRequest) -> list[tuple[str, dict[str, Any]]]:
    """The statements that lock and read the request's history in the call's transaction, for
    the store to send with the call's opening; none where they are not sent so (SQLite, or a
    reservation of its own under an agent's daily cap). allowance_reserve takes what they read
    (the lock's row left out)."""
    if connection.vendor != "postgresql" or request.agent_day_needed:
        return []
    params = _params(request)
    return [(_LOCK, params), *((statement, params) for statement in _reads(request))]


def allowance_reserve(
    request: AllowanceRequest,
    judge: Judge,
    *,
    cursor: CursorWrapper,
    read: list[list[Any]] | None = None,
) -> tuple[AllowanceHistory, HoldReason | None, Reservation | None]:
    """Lock, read and judge the request's history (or judge what allowance_ahead's statements
    `read`, in this transaction); what to reserve comes back for the call's end to write on
    `cursor`, the call's own (None: nothing to reserve, or reserved already on a connection of
    its own)."""
    if not connection.in_atomic_block:
        raise RuntimeError("money is reserved only inside its call's transaction")
    params = _params(request)
    if read is not None:
        results = read
    elif connection.vendor != "postgresql":
        results = [_fetch(cursor, statement, params) for statement in _reads(request)]
    elif request.agent_day_needed:
        try:
            return (*_reserve_on_its_own(request, judge, params), None)
        except _StaleConnection:
            # A connection the server closed while it waited in the pool (a restart, a
            # terminated backend) fails at its first statement, before anything of the
            # reservation was written: it was closed, and the reservation is made on a new one.
            return (*_reserve_on_its_own(request, judge, params), None)
    else:
        # One round trip: the lock, then the reads, each a statement of its own, so that each
        # read starts once the lock is held and sees every reservation committed before.
        raw = cursor.cursor.connection
        with raw.pipeline():
            sent = [
                raw.execute(statement, values) for statement, values in allowance_ahead(request)
            ]
        results = [read.fetchall() for read in sent[1:]]
    history = _history(results, request)
    hold = judge(history)
    reservation = _reservation(request, hold)
    return history, hold, None if reservation is None else _only(params | reservation, RESERVE)


class _StaleConnection(psycopg.OperationalError):
    """The reservations' connection was found closed by the server at its first statement."""


def _reserve_on_its_own(
    request: AllowanceRequest, judge: Judge, params: dict[str, Any]
) -> tuple[AllowanceHistory, HoldReason | None]:
    with _reservation_connection() as side:
        # Two round trips: the locks and the reads in one pipeline, then the reservation and the
        # commit in another.
        try:
            with side.pipeline():
                side.execute(_SIDE_LOCKS, params)
                cursors = [side.execute(statement, params) for statement in _reads(request)]
        except psycopg.OperationalError as error:
            if side.broken:
                raise _StaleConnection(str(error)) from error
            raise
        history = _history([c.fetchall() for c in cursors], request)
        hold = judge(history)
        reservation = _reservation(request, hold)
        with side.pipeline():
            if reservation is not None:
                side.execute(RESERVE, params | reservation)
            side.commit()
        return history, hold


def allowance_read(request: AllowanceRequest, *, cursor: CursorWrapper) -> AllowanceHistory:
    """The history a request would be judged by, read on `cursor` and reserving nothing: what an
    approval judges a held call's sum again by, under its decision lock."""
    return _history(
        [_fetch(cursor, statement, _params(request)) for statement in _reads(request)], request
    )


def allowance_release(key: str, *, cursor: CursorWrapper) -> None:
    """Release a reservation already written: on SQLite in the call's transaction; on PostgreSQL
    one made on a connection of its own, released on one too."""
    params = {"key": key, "now": _db_time(datetime.now(UTC))}
    if connection.vendor != "postgresql":
        cursor.execute(_RELEASE, params)
        return
    try:
        _release_on_its_own(params)
    except _StaleConnection:
        # Closed by the server while it waited in the pool (a restart, a terminated backend):
        # the release sets what is not set yet, so it is made again on a new connection.
        _release_on_its_own(params)


def _release_on_its_own(params: dict[str, Any]) -> None:
    with _reservation_connection() as side:
        try:
            with side.pipeline():
                side.execute(_RELEASE, params)
                side.commit()
        except psycopg.OperationalError as error:
            if side.broken:
                raise _StaleConnection(str(error)) from error
            raise


@cache
def reserve_sql(prefix: str) -> str:
    """RESERVE with its placeholders prefixed, to join another statement's without meeting
    them."""
    return re.sub(r"%\((\w+)\)s", rf"%({prefix}\1)s", RESERVE)


def _reservation(request: AllowanceRequest, hold: HoldReason | None) -> dict[str, Any] | None:
    """What the judgement reserves: the money as moved without a human, as held, or nothing (a
    hold with no confirmation to hold it under)."""
    if hold is None:
        return {
            "reserved_key": request.key,
            "approval": POLICY,
            "expires_at": None,
            "confirmation_id": "",
        }
    if not request.confirmation_id or request.held_until is None:
        return None
    return {
        "reserved_key": request.held_key,
        "approval": HELD,
        "expires_at": _db_time(request.held_until),
        "confirmation_id": request.confirmation_id,
    }


def _reads(request: AllowanceRequest) -> list[str]:
    return [_WINDOW, *([_AGENT_DAY] if request.agent_day_needed else [])]


def _params(request: AllowanceRequest) -> dict[str, Any]:
    return {
        "key": request.key,
        "agent_id": int(request.agent_id),
        "session_id": request.session_id,
        "customer_id": request.customer_id,
        "currency": request.currency,
        "tool": request.tool,
        "subject": request.subject,
        "amount_cents": request.amount_cents,
        "at": _db_time(request.at),
        "day": _day(request.at),
        "since": _db_time(request.since),
        "twins_since": _db_time(request.twins_since),
        "held_key": request.held_key,
        "customer_lock": f"toolgate.customer:{request.customer_id}:{request.currency}",
        "agent_lock": f"toolgate.agent:{request.agent_id}:{request.currency}:{_day(request.at)}",
    }


def _fetch(cursor: CursorWrapper, statement: str, params: dict[str, Any]) -> list[Any]:
    cursor.execute(statement, _only(params, statement))
    return list(cursor.fetchall())


def _only(params: dict[str, Any], statement: str) -> dict[str, Any]:
    # SQLite wants exactly the parameters a statement names.
    return {name: value for name, value in params.items() if f"%({name})s" in statement}


def _history(results: list[list[Any]], request: AllowanceRequest) -> AllowanceHistory:
    window = results[0]
    window_cents, window_count, held_cents, reviewed_cents = window[0][:_SUMS]
    # A row's movement and whether the call would repeat it; none on the sums' row alone.
    rows = [row[_SUMS:] for row in window if row[_SUMS] is not None]
    latest = [_movement(row[:-1]) for row in rows if not row[-1]]
    return AllowanceHistory(
        customer_window_cents=int(window_cents),
        customer_window_count=int(window_count),
        customer_window=tuple(reversed(latest)),
        agent_day_cents=int(results[1][0][0]) if request.agent_day_needed else 0,
        repeats=tuple(_movement(row[:-1]) for row in rows if row[-1]),
        customer_held_cents=int(held_cents),
        customer_reviewed_cents=int(reviewed_cents),
    )


@contextmanager
def _reservation_connection() -> Iterator[Any]:
    """A reservations' connection (the driver's own, outside autocommit), for one transaction."""
    side = _POOL.take()
    try:
        side.set_autocommit(False)
        yield side.connection
    except BaseException:
        # A broken connection is opened anew on its next use.
        side.close()
        raise
    finally:
        _POOL.give_back(side)


class _Pool:
    """A few connections for reservations, shared by the process's threads, one at a time.

    A reservation is a short transaction, so a handful serve many concurrent calls; a call
    waits for a free one rather than open a connection per thread.
    """

    def __init__(self) -> None:
        self._free: list[BaseDatabaseWrapper] = []
        self._opened: list[BaseDatabaseWrapper] = []
        self._available = threading.Condition()

    def take(self) -> BaseDatabaseWrapper:
        with self._available:
            while not self._free and len(self._opened) >= settings.TOOLGATE_RESERVATION_CONNECTIONS:
                self._available.wait()
            if self._free:
                return self._free.pop()
            side = connections[DEFAULT_DB_ALIAS].copy()
            # Used by one thread at a time, but not always the thread that opened it.
            side.inc_thread_sharing()
            self._opened.append(side)
            return side

    def give_back(self, side: BaseDatabaseWrapper) -> None:
        with self._available:
            self._free.append(side)
            self._available.notify()

    def close_all(self) -> None:
        with self._available:
            for side in self._opened:
                side.close()

    def forget(self) -> None:
        # In a forked child: the parent's connections are not the child's to use or close.
        self._free, self._opened = [], []
        self._available = threading.Condition()


_POOL = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.forget)


def allowance_connections_close_all() -> None:
    """Close the process's reservations' connections (before its database is dropped)."""
    _POOL.close_all()


def _movement(row: Any) -> Movement:
    key, agent_id, session_id, tool, subject, amount_cents, at, approval, confirmation_id = row
    return Movement(
        key,
        str(agent_id),
        session_id,
        tool,
        subject,
        amount_cents,
        _as_datetime(at),
        approval,
        confirmation_id,
    )


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


def _db_time(moment: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(moment)


def _as_datetime(value: Any) -> datetime:
    # PostgreSQL returns datetimes, SQLite text.
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
