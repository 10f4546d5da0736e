"""Delete the idempotency records and sessions past their keep time, as beat's retention does."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from dispatch.retention import records_prune


class Command(BaseCommand):
    help = (
        "Delete idempotency records unmoved for TOOLGATE_IDEMPOTENCY_KEEP_SECONDS and sessions "
        "whose last call is older than TOOLGATE_SESSION_KEEP_SECONDS, with their keys; never a "
        "key whose confirmation is not final or whose outcome is unknown. In batches of "
        "TOOLGATE_RETENTION_BATCH rows, each its own transaction. Beat runs the same every "
        "TOOLGATE_RETENTION_SECONDS (docs/retention.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )
        parser.add_argument(
            "--batch", type=int, default=None, help="rows a slice covers (default: the setting)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        verb = "would delete" if dry_run else "deleted"

        def progress(table: str, slices: int, deleted: int) -> None:
            self.stdout.write(f"  {table}: {slices} slice(s) walked, {deleted:,} {verb}")

        self.stdout.write(
            f"Keeping idempotency records {settings.TOOLGATE_IDEMPOTENCY_KEEP_SECONDS} s and "
            f"sessions {settings.TOOLGATE_SESSION_KEEP_SECONDS} s"
            + (" (dry run: nothing is deleted)" if dry_run else "")
        )
        pruned = records_prune(batch=options["batch"], dry_run=dry_run, progress=progress)
        self.stdout.write(
            f"{'Would delete' if dry_run else 'Deleted'} {pruned.tasks:,} answered MCP task(s) "
            "past their ttl."
        )
        self.stdout.write(
            f"{'Would delete' if dry_run else 'Deleted'} {pruned.keys:,} idempotency record(s) "
            f"and {pruned.sessions:,} session(s)"
            + ("" if dry_run else f" ({pruned.session_keys:,} of the records with their sessions)")
            + "."
        )
