"""Money reserved without a human (StatePort.reserve_allowance) on the database.

On PostgreSQL a reservation is made on a connection of its own, in a short transaction that holds
two advisory locks, first the customer's (with the currency) and then the agent's (with the
currency and the day), and commits before the call goes on to its effect. So a call that races
another for the same customer or agent waits only for that short step, never for the other's
effect, and sees every reservation committed before it; calls of unrelated customers and agents
never wait for each other. On SQLite a call that writes holds the database's write lock from its
first statement, so its reservation is made in its own transaction.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from dispatch.pipeline.allowance import AllowanceHistory, AllowanceRequest, HoldReason, Movement

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(name)s, 0))"

# Live movements of the customer and currency within the window, either approval.
_CUSTOMER_WINDOW = """
    SELECT key, agent_id, session_id, tool, subject, amount_cents, at, approval
    FROM dispatch_movement
    WHERE customer_id = %(customer_id)s AND currency = %(currency)s AND at >= %(since)s
        AND released_at IS NULL
    ORDER BY at, id
"""

_AGENT_DAY = """
    SELECT COALESCE(SUM(amount_cents), 0) FROM dispatch_movement
    WHERE agent_id = %(agent_id)s AND currency = %(currency)s AND day = %(day)s
        AND approval = 'policy' AND released_at IS NULL
"""

# A key reserved before and released (its call moved nothing) is reserved again as new.
_RESERVE = """
    INSERT INTO dispatch_movement AS movement (key, agent_id, session_id, customer_id, currency,
        tool, subject, amount_cents, approval, at, day, released_at)
    VALUES (%(key)s, %(agent_id)s, %(session_id)s, %(customer_id)s, %(currency)s, %(tool)s,
        %(subject)s, %(amount_cents)s, 'policy', %(at)s, %(day)s, NULL)
    ON CONFLICT (key) DO UPDATE SET agent_id = excluded.agent_id,
        session_id = excluded.session_id, amount_cents = excluded.amount_cents,
        at = excluded.at, day = excluded.day, released_at = NULL
"""

_RELEASE = """
    UPDATE dispatch_movement SET released_at = %(now)s
    WHERE key = %(key)s AND released_at IS NULL
"""

Judge = Callable[[AllowanceHistory], HoldReason | None]


def allowance_reserve(
    request: AllowanceRequest, judge: Judge, *, cursor: CursorWrapper
) -> tuple[AllowanceHistory, HoldReason | None]:
    """See StatePort.reserve_allowance; `cursor` is the call's own (used on SQLite)."""
    if connection.vendor != "postgresql":
        return _reserve(cursor, request, judge)
    with _reservation_transaction() as side:
        side.execute(_LOCK, {"name": f"toolgate.customer:{request.customer_id}:{request.currency}"})
        agent_day = f"{request.agent_id}:{request.currency}:{_day(request.at)}"
        side.execute(_LOCK, {"name": f"toolgate.agent:{agent_day}"})
        return _reserve(side, request, judge)


def allowance_release(key: str, *, cursor: CursorWrapper) -> None:
    params = {"key": key, "now": _db_time(datetime.now(UTC))}
    if connection.vendor != "postgresql":
        cursor.execute(_RELEASE, params)
        return
    with _reservation_transaction() as side:
        side.execute(_RELEASE, params)


def _reserve(
    cursor: CursorWrapper, request: AllowanceRequest, judge: Judge
) -> tuple[AllowanceHistory, HoldReason | None]:
    params: dict[str, Any] = {
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
    }
    cursor.execute(
        _CUSTOMER_WINDOW,
        {name: params[name] for name in ("customer_id", "currency", "since")},
    )
    window = [_movement(row) for row in cursor.fetchall()]
    cursor.execute(_AGENT_DAY, {name: params[name] for name in ("agent_id", "currency", "day")})
    (agent_day_cents,) = cursor.fetchone()
    same = (request.tool, request.subject, request.amount_cents)
    history = AllowanceHistory(
        customer_window=tuple(m for m in window if m.approval == "policy"),
        agent_day_cents=int(agent_day_cents),
        repeats=tuple(m for m in window if (m.tool, m.subject, m.amount_cents) == same),
    )
    hold = judge(history)
    if hold is None:
        cursor.execute(_RESERVE, {name: params[name] for name in params if name != "since"})
    return history, hold


@contextmanager
def _reservation_transaction() -> Iterator[CursorWrapper]:
    """A cursor on a reservations' connection, in a transaction committed at the end."""
    side = _POOL.take()
    try:
        side.set_autocommit(False)
        with side.cursor() as cursor:
            yield cursor
        side.commit()
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


def _movement(row: tuple[Any, ...]) -> Movement:
    key, agent_id, session_id, tool, subject, amount_cents, at, approval = row
    return Movement(
        key, str(agent_id), session_id, tool, subject, amount_cents, _as_datetime(at), approval
    )


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


def _db_time(moment: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(moment)


def _as_datetime(value: Any) -> datetime:
    # PostgreSQL returns datetimes, SQLite text.
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
