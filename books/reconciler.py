"""The reconciler: the books checked while the system runs (books/checks.py says what).

Beat runs it over what changed every TOOLGATE_BOOKS_CHECK_SECONDS, so that its cost follows the
traffic: each check reads only the rows above its tables' marks (BooksWatermark), by primary
key. A tampering UPDATE leaves no new row to follow, so a full sweep reads everything every
TOOLGATE_BOOKS_SWEEP_SECONDS; `manage.py check_books` runs either from a shell.

A breach is kept (Breach: one row per invariant and subject, found again while it stands) and,
when first found, reported (report_breach): an error in the log, a security event, and the
administrators' page lists it with where to look.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from books.checks import Found, checks, followed
from books.models import BooksWatermark, Breach
from dispatch.models import SecurityChannel, SecurityEvent

logger = logging.getLogger("toolgate.books")

Progress = Callable[[str, int, float], None]


class BooksNeedPostgreSQL(Exception):
    """The checks are PostgreSQL statements; the production database is PostgreSQL."""


@dataclass
class Checked:
    """What one run read and found."""

    full: bool
    found: list[Found] = field(default_factory=list)
    # Breaches found for the first time by this run.
    new: int = 0
    seconds: float = 0.0


def _nothing(_invariant: str, _found: int, _seconds: float) -> None:
    return None


def books_check(
    *, full: bool = False, now: datetime | None = None, progress: Progress = _nothing
) -> Checked:
    """Run every check, over everything (`full`) or over what changed since the runs before;
    keep and report what they find. progress(invariant, breaches, seconds) after each check."""
    if connection.vendor != "postgresql":
        raise BooksNeedPostgreSQL("the books are checked on PostgreSQL")
    now = now or timezone.now()
    started = timezone.now()
    tables = followed()
    marks = _marks()
    highs = _highs(tables)
    params = {f"{table}_after": marks.get(table, [0, 0])[0] for table in tables}
    checked = Checked(full=full)
    for check in checks():
        began = timezone.now()
        statement = check.statement.format(
            **{
                name: check.swept.get(name, "") if full else clause
                for name, clause in check.changed.items()
            }
        )
        with connection.cursor() as cursor:
            cursor.execute(statement, params | check.params())
            rows = cursor.fetchall()
        found = [check.found(row) for row in rows]
        checked.found.extend(found)
        progress(check.invariant, len(found), (timezone.now() - began).total_seconds())
    checked.new = _keep(checked.found, now=now, by_sweep=full)
    with transaction.atomic():
        watermark = BooksWatermark.objects.select_for_update().get(pk=1)
        watermark.marks = {table: [marks.get(table, [0, 0])[1], highs[table]] for table in tables}
        watermark.checked_at = now
        if full:
            watermark.swept_at = now
        watermark.save()
    checked.seconds = (timezone.now() - started).total_seconds()
    return checked


def report_breach(breach: Breach) -> None:
    """Say a breach was found: an error in the log and a security event (docs/
    errors-and-security-events.md). The one place a notification channel hooks in."""
    logger.error(
        "books: %s breached for %s: %s (look at %s)",
        breach.invariant,
        breach.subject,
        breach.detail,
        breach.look_at,
    )
    SecurityEvent.objects.create(
        at=breach.last_found_at,
        method="CHECK",
        path=breach.look_at[:200],
        status=500,
        reason=f"books_{breach.invariant}"[:64],
        detail=f"{breach.subject}: {breach.detail}"[:200],
        channel=SecurityChannel.BOOKS,
    )


def _marks() -> dict[str, list[int]]:
    watermark, _ = BooksWatermark.objects.get_or_create(pk=1)
    return {table: [int(value) for value in pair] for table, pair in watermark.marks.items()}


def _highs(tables: tuple[str, ...]) -> dict[str, int]:
    """Each followed table's highest id now, in one statement."""
    quote = connection.ops.quote_name
    columns = ", ".join(f"(SELECT COALESCE(MAX(id), 0) FROM {quote(table)})" for table in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns}")
        row = cursor.fetchone()
    return dict(zip(tables, (int(value) for value in row), strict=True))


def _keep(found: list[Found], *, now: datetime, by_sweep: bool) -> int:
    """Keep what was found; report the breaches found for the first time. Returns how many."""
    new = 0
    for item in found:
        with transaction.atomic():
            breach, created = Breach.objects.select_for_update().get_or_create(
                invariant=item.invariant,
                subject=item.subject[:200],
                defaults={
                    "detail": item.detail,
                    "look_at": item.look_at[:300],
                    "first_found_at": now,
                    "last_found_at": now,
                    "by_sweep": by_sweep,
                },
            )
            if created:
                new += 1
                report_breach(breach)
            else:
                breach.detail, breach.last_found_at = item.detail, now
                breach.save(update_fields=["detail", "last_found_at"])
    return new
