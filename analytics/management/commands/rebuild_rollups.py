"""Recompute the rollups from the audit records and the held calls, or check that the filled ones
agree."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from analytics.fills import rollups_check, rollups_rebuild
from dispatch.models import AuditRecord


class Command(BaseCommand):
    help = (
        "Recompute the rollups the dashboard and the metrics API read (calls by hour and by day, "
        "decisions on held calls) from the audit records and the held calls, and move the fills "
        "there; fills wait meanwhile, calls and decisions do not. --check only compares the "
        "filled rollups with a count of what the fills have reached."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="compare the filled rollups with a rebuild and change nothing "
            "(exit 1 if they differ)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"]:
            total = AuditRecord.objects.count()
            self.stdout.write(f"Reading up to {total} audit records.")
            rebuilt, differing = rollups_check(lambda records: self._progress(records, total))
            for difference in differing[:20]:
                self.stdout.write(f"  {difference} (filled, rebuilt)")
            if differing:
                raise CommandError(f"{len(differing)} rollup rows differ from a rebuild.")
            self.stdout.write(self.style.SUCCESS(f"The {rebuilt.rows()} filled rollup rows agree."))
            return
        rebuilt = rollups_rebuild()
        self.stdout.write(self.style.SUCCESS(f"Rebuilt {rebuilt.rows()} rollup rows."))

    def _progress(self, records: Iterator[AuditRecord], total: int) -> Iterable[AuditRecord]:
        width, shown = 40, -1
        for done, record in enumerate(records, start=1):
            filled = width * done // max(total, 1)
            if filled != shown:
                shown = filled
                bar = "#" * filled + "." * (width - filled)
                self.stdout.write(f"\r[{bar}] {done}/{total}", ending="")
                self.stdout.flush()
            yield record
        self.stdout.write("")
        sys.stdout.flush()
