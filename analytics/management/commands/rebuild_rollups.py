"""Recompute the rollups from the audit records and the held calls, or check that the live ones
agree."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from analytics.rollups import (
    Rollups,
    audit_in_session_order,
    rollups_live,
    rollups_rebuilt,
    rollups_replace,
)
from dispatch.models import AuditRecord


class Command(BaseCommand):
    help = (
        "Recompute the rollups the dashboard and the metrics API read (calls by hour and by day, "
        "decisions on held calls) from the audit records and the held calls. Calls and decisions "
        "wait while the rollups are replaced; --check only compares."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="compare the live rollups with a rebuild and change nothing "
            "(exit 1 if they differ)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        total = AuditRecord.objects.count()
        self.stdout.write(f"Reading {total} audit records.")
        if options["check"]:
            rebuilt, _ = rollups_rebuilt(self._progress(audit_in_session_order(), total))
            differing = rollups_live().differences(rebuilt)
            for difference in differing[:20]:
                self.stdout.write(f"  {difference} (live, rebuilt)")
            if differing:
                raise CommandError(f"{len(differing)} rollup rows differ from a rebuild.")
            self.stdout.write(self.style.SUCCESS(f"The {_rows(rebuilt)} live rollup rows agree."))
            return
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Calls append their records and bump the rollups meanwhile, reviewers decide held
                # calls: they wait here, so that none is counted twice or lost between the read
                # and the swap.
                with connection.cursor() as cursor:
                    cursor.execute(
                        "LOCK TABLE dispatch_auditrecord, dispatch_callrollup, "
                        "dispatch_callrollupday, dispatch_pendingrecovery, dispatch_confirmation, "
                        "dispatch_decisionrollup IN SHARE ROW EXCLUSIVE MODE"
                    )
            rebuilt, waiting = rollups_rebuilt(self._progress(audit_in_session_order(), total))
            rollups_replace(rebuilt, waiting)
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt {_rows(rebuilt)} rollup rows; {len(waiting)} rejections await a fix."
            )
        )

    def _progress(self, records: Any, total: int) -> Iterator[AuditRecord]:
        width, shown = 40, -1
        for done, record in enumerate(records.iterator(chunk_size=5000), start=1):
            filled = width * done // max(total, 1)
            if filled != shown:
                shown = filled
                bar = "#" * filled + "." * (width - filled)
                self.stdout.write(f"\r[{bar}] {done}/{total}", ending="")
                self.stdout.flush()
            yield record
        self.stdout.write("")
        sys.stdout.flush()


def _rows(rollups: Rollups) -> int:
    return len(rollups.hours) + len(rollups.days) + len(rollups.decisions)
