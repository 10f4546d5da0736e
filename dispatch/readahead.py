"""Records read with a call's opening statement, then served to the call's first read of them.

A tool declares the record its call reads first (`ToolSpec.lookup`; for the order tools, the
order). A domain app registers how to read a record of that source: a SELECT of at most one row
whose parameters are the lookup's key, and how such a row becomes the value its port returns
(orders.gateway registers the orders). On PostgreSQL the store then reads the record in the call's
opening statement, which saves the read its own round trip, and keeps it for the call; the
domain's read takes it from there, once. Any later read of the same record in that call goes to
the database, as a read that follows the call's own write must. Outside a call, or on SQLite
(where the opening is several statements anyway), nothing is kept and every read is the domain's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from dispatch.pipeline.state import Lookup


@dataclass(frozen=True, slots=True)
class Source:
    # At most one row; one %s per element of a lookup's key, in the key's order.
    sql: str
    # The row as the domain's read would return it.
    to_value: Callable[[Sequence[Any]], Any]


_SOURCES: dict[str, Source] = {}


def source_register(name: str, *, sql: str, to_value: Callable[[Sequence[Any]], Any]) -> None:
    if name in _SOURCES and _SOURCES[name].sql != sql:
        raise ValueError(f"read-ahead source {name!r} is already registered")
    _SOURCES[name] = Source(sql, to_value)


def source_get(name: str) -> Source | None:
    return _SOURCES.get(name)


# What the open call of this thread (or task) read ahead: a value, or None for no such record.
_KEPT: ContextVar[dict[Lookup, Any] | None] = ContextVar("toolgate_read_ahead", default=None)


@contextmanager
def call_reads() -> Iterator[None]:
    """The span of one call: what is kept in it is dropped at its end, used or not."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def keep(lookup: Lookup, value: Any) -> None:
    kept = _KEPT.get()
    if kept is None:
        raise RuntimeError("a record is read ahead only inside a call (call_reads)")
    kept[lookup] = value


def take(lookup: Lookup) -> tuple[bool, Any]:
    """(True, the value) if the call read this record ahead and nothing took it yet."""
    kept = _KEPT.get()
    if not kept or lookup not in kept:
        return False, None
    return True, kept.pop(lookup)
