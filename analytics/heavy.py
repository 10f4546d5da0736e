"""Managers' requests beside the agents': each takes one of a few slots and runs within a budget
of time, so that heavy reports never hold the web processes that the agents' calls need.

- Slots. At most TOOLGATE_MANAGER_SLOTS manager requests (the pages under /analytics/ and the
  API under /api/v1/metrics) run at once across the site. A request that finds every slot taken
  is answered at once, 503 with Retry-After: busy, send it again. On PostgreSQL a slot is a
  transaction-level advisory lock, taken by the request's transaction and let go with it however
  the request ends (a worker killed mid-way drops its connection, and the lock with it); on
  SQLite, which one process serves, a semaphore. Across the site rather than per process:
  deploy/gunicorn.conf.py runs sync workers, each serving one request at a time, so a bound per
  process would bound nothing, and four what-ifs would hold every worker (docs/deploy.md).
- Time. The request runs in a transaction whose statements may each take at most
  TOOLGATE_MANAGER_TIMEOUT_SECONDS (PostgreSQL's statement_timeout, SET LOCAL; on SQLite a
  progress handler interrupts a statement past it), and the what-if's replay stops at the same
  deadline. What cannot be answered in time says so: the API in its JSON envelope (503,
  range_too_heavy, not retryable: ask for a shorter range), a page with the message (the
  what-if keeps its form), never a 500.

A manager's request only reads: what it did is rolled back when it ends, which also undoes its
statement timeout, so nothing it set outlives it on a connection that an agent's call uses next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from dispatch.apis import JsonApi
from dispatch.errors import database_away, error_body, is_api_request

logger = logging.getLogger(__name__)

# The managers' pages and API.
MANAGER_PATHS = ("/analytics/", "/api/v1/metrics")
# The advisory locks' first key, which no other lock of the site uses (the money reservations
# lock one bigint key each, a space apart from pairs of int4 keys).
_SLOT_LOCKS = 0x746F6F6C
# How soon a busy request may be sent again: about what a report takes.
RETRY_AFTER_SECONDS = 2


class RangeTooHeavy(Exception):
    """The range holds more calls than can be judged within the time a manager's request has."""


def statement_cancelled(error: BaseException) -> bool:
    """Whether the database stopped a statement that ran out of time: PostgreSQL's statement
    timeout (query_canceled), or SQLite's progress handler interrupting it."""
    cause = error.__cause__ or error
    return getattr(cause, "sqlstate", None) == "57014" or (
        connection.vendor == "sqlite" and "interrupted" in str(cause)
    )


class RangeTooHeavyError(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "range_too_heavy"
    # The same range takes as long again: a shorter one is the fix, not a retry.
    retryable = False


class ManagerApi(JsonApi):
    """A managers' API view: a range that cannot be read in time is its own clear error."""

    def handle_exception(self, exc: Exception) -> Response:
        if too_heavy(exc):
            exc = RangeTooHeavyError(too_heavy_message())
        return super().handle_exception(exc)


def too_heavy(exc: BaseException) -> bool:
    """Whether the request ran out of its time: the replay's deadline, or a statement the
    database stopped at the statement timeout."""
    return isinstance(exc, RangeTooHeavy) or (
        isinstance(exc, DatabaseError) and statement_cancelled(exc)
    )


def too_heavy_message() -> str:
    return (
        f"This range holds more calls than can be read within "
        f"{_seconds(budget_seconds())}: ask for a shorter range."
    )


def budget_seconds() -> float:
    return float(settings.TOOLGATE_MANAGER_TIMEOUT_SECONDS)


def manager_deadline(request: Any) -> float | None:
    """The moment (time.monotonic()) by which a manager's request must have its answer."""
    deadline: float | None = getattr(request, "manager_deadline", None)
    return deadline


class ManagerRequestMiddleware:
    """Slots and time for the managers' requests (see the module's docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(MANAGER_PATHS):
            return self.get_response(request)
        try:
            if not _may_be_signed_in(request):
                # The view answers an anonymous request (the login page, a 401) without a slot:
                # only people who may read the reports wait for one or hold one.
                return self.get_response(request)
            with transaction.atomic(), manager_slot() as taken:
                if not taken:
                    return _busy(request)
                budget = budget_seconds()
                request.manager_deadline = monotonic() + budget  # type: ignore[attr-defined]
                savepoint = transaction.savepoint()
                request.manager_savepoint = savepoint  # type: ignore[attr-defined]
                with _statement_timeout(budget):
                    response = self.get_response(request)
                _undo(savepoint)
        except Exception as exc:
            # A connection the server ended (a restart, a failover) fails the slot's transaction
            # itself: the same retryable 503 as the agents' API, not a 500.
            if too_heavy(exc) or not database_away(exc):
                raise
            return _database_unavailable(request, exc)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        savepoint = getattr(request, "manager_savepoint", None)
        if savepoint is None:
            return None
        if not too_heavy(exception) and database_away(exception):
            # Nothing more can run on the connection: no savepoint to go back to.
            return _database_unavailable(request, exception)
        # A statement that failed leaves the transaction unusable: back to before the view, so
        # that the answer (which reads the navigation) can be made, and made whatever the bound.
        _undo(savepoint)
        _statement_timeout_lift()
        if too_heavy(exception):
            return _unavailable(request, "range_too_heavy", too_heavy_message(), retryable=False)
        return None


@contextmanager
def manager_slot() -> Iterator[bool]:
    """Take one of the site's slots for a manager's request if one is free, for the block (on
    PostgreSQL for the transaction around it, which must be open); yields whether it did."""
    slots = int(settings.TOOLGATE_MANAGER_SLOTS)
    if connection.vendor == "postgresql":
        yield any(_slot_locked(slot) for slot in range(slots))
        return
    semaphore = _semaphore(slots)
    taken = semaphore.acquire(blocking=False)
    try:
        yield taken
    finally:
        if taken:
            semaphore.release()


def _slot_locked(slot: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_SLOT_LOCKS, slot])
        row = cursor.fetchone()
    return bool(row and row[0])


_semaphores: dict[int, threading.BoundedSemaphore] = {}
_semaphores_lock = threading.Lock()


def _semaphore(slots: int) -> threading.BoundedSemaphore:
    with _semaphores_lock:
        if slots not in _semaphores:
            _semaphores[slots] = threading.BoundedSemaphore(slots)
        return _semaphores[slots]


@contextmanager
def _statement_timeout(seconds: float) -> Iterator[None]:
    """Each statement of the block may run at most `seconds`."""
    if connection.vendor == "postgresql":
        # SET LOCAL: within the savepoint, so that undoing the request undoes it too.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                [str(max(1, round(seconds * 1000)))],
            )
        yield
        return
    if connection.vendor != "sqlite":
        yield
        return
    # SQLite has no statement timeout: a progress handler interrupts a statement that has run
    # longer, counted from the start of the last one (a streamed read goes on being that one).
    started = [monotonic()]

    def note_start(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
        started[0] = monotonic()
        return execute(sql, params, many, context)

    connection.ensure_connection()
    connection.connection.set_progress_handler(lambda: monotonic() - started[0] > seconds, 10_000)
    try:
        with connection.execute_wrapper(note_start):
            yield
    finally:
        _statement_timeout_lift()


def _statement_timeout_lift() -> None:
    # On PostgreSQL going back to the savepoint undid it already.
    if connection.vendor == "sqlite" and connection.connection is not None:
        connection.connection.set_progress_handler(None, 0)


def _undo(savepoint: str) -> None:
    # A failed statement marks the transaction for rollback, and Django runs nothing more in it
    # until the mark is cleared: clear it, and go back to the savepoint, which makes it whole.
    transaction.set_rollback(False)
    transaction.savepoint_rollback(savepoint)


def _may_be_signed_in(request: HttpRequest) -> bool:
    """Whether the request may come from someone signed in: a session's user, or a token for the
    API (whose view authenticates it). Read before any slot is taken; a request with neither
    cookie nor token reads nothing to find out."""
    if is_api_request(request) and request.META.get("HTTP_AUTHORIZATION"):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated)


def _database_unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    logger.warning(
        "The database is unavailable for %s %s: %s", request.method, request.path_info, exc
    )
    # Closed, so that the next request opens a connection of its own.
    connection.close()
    message = "The database is unavailable; send the same request again in a moment"
    if is_api_request(request):
        response: HttpResponse = JsonResponse(
            error_body(
                status_code=503, code="database_unavailable", message=message, retryable=True
            ),
            status=503,
        )
    else:
        response = render(
            request,
            "analytics/database_unavailable.html",
            {"message": message, "retry_after": RETRY_AFTER_SECONDS},
            status=503,
        )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _busy(request: HttpRequest) -> HttpResponse:
    slots = int(settings.TOOLGATE_MANAGER_SLOTS)
    message = (
        f"Other managers' reports are running (at most {slots} at a time, so that they never "
        "hold up the agents' calls)"
    )
    if is_api_request(request):
        message += "; send the request again in a moment."
    response = _unavailable(request, "managers_busy", message, retryable=True)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _unavailable(request: HttpRequest, code: str, message: str, *, retryable: bool) -> HttpResponse:
    if is_api_request(request):
        return JsonResponse(
            error_body(status_code=503, code=code, message=message, retryable=retryable),
            status=503,
        )
    return render(
        request,
        "analytics/unavailable.html",
        {"busy": retryable, "message": message, "retry_after": RETRY_AFTER_SECONDS},
        status=503,
    )


def _seconds(seconds: float) -> str:
    return f"{seconds:g} second{'s' if seconds != 1 else ''}"
