"""Refused requests, recorded as security events, and their table kept bounded.

Both doors onto the pipeline record here, each event with its channel: dispatch.errors, which
answers every refusal of the agent API, and the MCP server (dispatch.mcp), which refuses over
HTTP and over stdio. They record those worth watching: a burst of 401s is credential stuffing, a
run of 409s a host switching customers under one session. Recording never changes the answer: if
the write fails, the failure is logged and the refusal goes out as it was.

The table is bounded two ways: rows older than TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS go, and
so do all but the newest TOOLGATE_SECURITY_EVENTS_MAX_ROWS. Every PRUNE_EVERY-th write prunes one
batch, so a flood of refusals cannot grow it past the cap by more than PRUNE_EVERY rows;
`manage.py prune_security_events` prunes all that is due (for cron, or after lowering a setting).
On PostgreSQL both go through the prune function, the one way the application's role deletes
events (dispatch/store/guards.py).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Max, Q
from django.http import HttpRequest
from django.utils import timezone
from rest_framework.request import Request

from dispatch.auth_failures import (
    NO_CREDENTIALS_REASON,
    THROTTLED_REASON,
    auth_failure_count,
    auth_failure_rate,
    auth_throttled_first,
)
from dispatch.client_address import client_address
from dispatch.models import Agent, CallChannel, SecurityChannel, SecurityEvent
from dispatch.store.guards import (
    PRUNE_FUNCTION,
    SECURITY_EVENTS_MIN_RETENTION_DAYS,
    SECURITY_EVENTS_MIN_ROWS,
    SECURITY_EVENTS_PRUNE_BATCH,
    SECURITY_EVENTS_PRUNE_MAX_BATCHES,
)

logger = logging.getLogger(__name__)

RECORDED_STATUSES = frozenset({400, 401, 403, 409, 413, 415, 422, 429})

PRUNE_EVERY = 100
# Larger than PRUNE_EVERY, so that pruning on write catches up after the cap is lowered; the
# prune function's own on PostgreSQL.
PRUNE_BATCH = SECURITY_EVENTS_PRUNE_BATCH

_PATH = SecurityEvent._meta.get_field("path").max_length or 200
_DETAIL = SecurityEvent._meta.get_field("detail").max_length or 200
_REASON = SecurityEvent._meta.get_field("reason").max_length or 64
_METHOD = SecurityEvent._meta.get_field("method").max_length or 16


def _clip(text: str, limit: int) -> str:
    # A refusal may quote what it refused (its path, say): a NUL, which PostgreSQL keeps in no
    # text, is kept escaped as JSON writes it; an unpaired surrogate, which no encoding writes, as
    # Python writes it.
    text = text.replace("\x00", "\\u0000")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a refused request came in: the door (the API or MCP), the method and the path, and
    the client's address where the door has one (MCP over stdio has none)."""

    channel: str
    method: str
    path: str
    client_address: str | None = None


def api_origin(request: HttpRequest | Request) -> Origin:
    http_request = request._request if isinstance(request, Request) else request
    return Origin(
        CallChannel.API,
        str(http_request.method),
        http_request.path,
        client_address(http_request) or None,
    )


def page_origin(request: HttpRequest) -> Origin:
    """A person's page that refused a request as a matter of security."""
    return Origin(
        SecurityChannel.WEB, str(request.method), request.path, client_address(request) or None
    )


def api_agent(request: HttpRequest | Request) -> Agent | None:
    # Only DRF's request knows the agent; every refusal recorded from it came after
    # authentication was tried, so asking does not authenticate again.
    if isinstance(request, Request) and isinstance(request.user, Agent):
        return request.user
    return None


def _failed_authentication_bounded(
    origin: Origin, status: int, reason: str, detail: str
) -> tuple[int, str, str] | None:
    """Failed authentications of one address make at most the rate's rows per window, then one
    that says the address is past it: the row to write (the refusal's own, or that one), or None
    for no row. A 401 to a bad token was counted where it was refused (dispatch.authentication);
    a 401 to no credential at all is counted here."""
    address = origin.client_address
    if status == 401 and reason == NO_CREDENTIALS_REASON and address:
        if not auth_failure_count(address):
            return status, reason, detail
    elif reason != THROTTLED_REASON or not address:
        return status, reason, detail
    if not auth_throttled_first(address):
        return None
    limit, window = auth_failure_rate()
    return (
        429,
        THROTTLED_REASON,
        f"Over {limit} failed authentications in {window} s from this address: until it is "
        "back within that rate its unknown tokens are answered 429 unread, and its failures "
        "are not recorded.",
    )


def security_event_record(
    *, origin: Origin, agent: Agent | None, status: int, reason: str, detail: str
) -> SecurityEvent | None:
    """Record a refusal, whichever door refused it; None (and a log line) if it could not be
    written, or if it is one of an address's failed authentications past the rate."""
    row = _failed_authentication_bounded(origin, status, reason, detail)
    if row is None:
        return None
    status, reason, detail = row
    try:
        # A savepoint: a failed write must not break a transaction the request may be in.
        with transaction.atomic():
            event = SecurityEvent.objects.create(
                at=timezone.now(),
                agent=agent,
                channel=origin.channel,
                client_address=origin.client_address,
                method=_clip(origin.method, _METHOD),
                path=_clip(origin.path, _PATH),
                status=status,
                reason=_clip(reason, _REASON),
                detail=_clip(detail, _DETAIL),
            )
    except (OperationalError, InterfaceError) as exc:
        # The database is away: one line, not a traceback per refused request.
        logger.warning(
            "Could not record the security event %s %s for %s %s %s: %s",
            status,
            reason,
            origin.channel,
            origin.method,
            origin.path[:_PATH],
            str(exc).strip()[:200],
        )
        return None
    except Exception:
        logger.exception(
            "Could not record the security event %s %s for %s %s %s",
            status,
            reason,
            origin.channel,
            origin.method,
            origin.path[:_PATH],
        )
        return None
    if event.pk % PRUNE_EVERY == 0:
        try:
            security_events_prune(newest=event.pk, batches=1)
        except Exception:
            logger.exception("Could not prune security events")
    return event


def security_events_prune(*, newest: int | None = None, batches: int | None = None) -> int:
    """Delete the events past the retention or beyond the newest rows kept, oldest first, in
    batches of PRUNE_BATCH (all that are due when `batches` is None); returns how many.

    On PostgreSQL the application's role may not delete them itself: it asks the prune function,
    which runs as the tables' owner, keeps at least the floors whatever it is asked, and counts
    days by the database's clock (dispatch/store/guards.py)."""
    keep_days = settings.TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS
    keep_rows = settings.TOOLGATE_SECURITY_EVENTS_MAX_ROWS
    if keep_days < SECURITY_EVENTS_MIN_RETENTION_DAYS or keep_rows < SECURITY_EVENTS_MIN_ROWS:
        raise ImproperlyConfigured(
            "Security events are kept at least "
            f"{SECURITY_EVENTS_MIN_RETENTION_DAYS} day(s) (TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS "
            f"is {keep_days}) and at least the newest {SECURITY_EVENTS_MIN_ROWS} "
            f"(TOOLGATE_SECURITY_EVENTS_MAX_ROWS is {keep_rows})."
        )
    if connection.vendor == "postgresql":
        return _prune_as_owner(keep_days, keep_rows, batches)
    cutoff = timezone.now() - timedelta(days=keep_days)
    if newest is None:
        newest = SecurityEvent.objects.aggregate(newest=Max("pk"))["newest"]
        if newest is None:
            return 0
    # Ids only grow, so the rows past the cap are the ids below the newest's minus the cap.
    due = Q(at__lt=cutoff) | Q(pk__lte=newest - keep_rows)
    deleted = 0
    for _ in range(batches) if batches is not None else itertools.count():
        ids = list(
            SecurityEvent.objects.filter(due)
            .order_by("pk")
            .values_list("pk", flat=True)[:PRUNE_BATCH]
        )
        if ids:
            deleted += SecurityEvent.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < PRUNE_BATCH:
            break
    return deleted


def _prune_as_owner(keep_days: int, keep_rows: int, batches: int | None) -> int:
    deleted = 0
    left = batches
    while left is None or left > 0:
        asked = min(left, SECURITY_EVENTS_PRUNE_MAX_BATCHES) if left is not None else 10
        # One short transaction a call, so that a long prune never holds its rows for long.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT {PRUNE_FUNCTION}(%s, %s, %s)", [keep_days, keep_rows, asked])
            (done,) = cursor.fetchone()
        deleted += done
        if done < asked * PRUNE_BATCH:
            break
        if left is not None:
            left -= asked
    return deleted
