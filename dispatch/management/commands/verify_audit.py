"""Walk every audit chain and name the first record altered, removed or inserted in each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.audit import SealFile, audit_verify, seals_read


class Command(BaseCommand):
    help = (
        "Check the hash chains of the audit records and confirmation events, and their heads "
        "against the seals written out (--seals). Exits 1 on any finding."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seals",
            type=Path,
            help="the JSON lines a file: sink of TOOLGATE_AUDIT_SEAL_SINKS wrote",
        )
        parser.add_argument(
            "--every",
            type=int,
            default=100_000,
            help="report progress every this many records (default 100,000)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seals: SealFile | None = None
        path: Path | None = options["seals"]
        if path is not None:
            try:
                with path.open(encoding="utf-8") as lines:
                    seals = seals_read(lines)
            except OSError as error:
                raise CommandError(f"cannot read the seals: {error}") from error
            last = seals.last
            self.stdout.write(
                f"seals: {seals.count} in {path}"
                + (f", the last {last['seal']} at {last['at']}" if last else "")
                + f"; {len(seals.sealed):,} chains sealed"
            )
        result = audit_verify(
            seals=seals,
            progress=lambda text: self.stdout.write(f"  {text}"),
            every=options["every"],
        )
        self.stdout.write(f"{result.chains:,} chains, {result.records:,} records walked")
        problems = [*result.seal_findings, *map(str, result.findings)]
        if not problems:
            self.stdout.write(
                self.style.SUCCESS(
                    "OK: every chain holds" + (", and matches its seal" if seals else "")
                )
            )
            return
        for problem in problems:
            self.stdout.write(self.style.ERROR(problem))
        raise CommandError(
            f"{len(problems)} finding{'s' if len(problems) > 1 else ''}: the audit was altered",
            returncode=1,
        )
