"""Recompute the call rollups from the audit records, or check that the live ones agree."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from dispatch.metrics import (
    audit_in_session_order,
    rollups_from_audit,
    rollups_live,
    rollups_replace,
)
from dispatch.models import AuditRecord


class Command(BaseCommand):
    help = (
        "Recompute the rollups the dashboard and the metrics API read from the audit records. "
        "Calls wait while the rollups are replaced; --check only compares."
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
            counts, _ = rollups_from_audit(self._progress(audit_in_session_order(), total))
            live = rollups_live()
            differing = sorted(
                key for key in set(counts) | set(live) if counts.get(key) != live.get(key)
            )
            for key in differing[:20]:
                self.stdout.write(f"  {key}: live {live.get(key)}, rebuilt {counts.get(key)}")
            if differing:
                raise CommandError(f"{len(differing)} rollup rows differ from a rebuild.")
            self.stdout.write(self.style.SUCCESS(f"The {len(live)} live rollup rows agree."))
            return
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Calls append their records and bump the rollups meanwhile: they wait here, so
                # that none is counted twice or lost between the read and the swap.
                with connection.cursor() as cursor:
                    cursor.execute(
                        "LOCK TABLE dispatch_auditrecord, dispatch_callrollup, "
                        "dispatch_pendingrecovery IN SHARE ROW EXCLUSIVE MODE"
                    )
            counts, waiting = rollups_from_audit(self._progress(audit_in_session_order(), total))
            rollups_replace(counts, waiting)
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt {len(counts)} rollup rows; {len(waiting)} rejections await a fix."
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
