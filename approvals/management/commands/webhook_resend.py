"""Send pending webhook deliveries again: after the broker was away, or to retry failed ones."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from approvals.webhooks import webhooks_resend


class Command(BaseCommand):
    help = (
        "Send every pending webhook delivery again (each is recorded with its attempts). "
        "--failed also gives the failed ones a new round of attempts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--failed", action="store_true", help="retry the deliveries that gave up, too"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sent = webhooks_resend(include_failed=options["failed"])
        self.stdout.write(f"Sent {sent} webhook deliveries again.")
