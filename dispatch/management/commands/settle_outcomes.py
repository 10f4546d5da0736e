"""Settle direct calls whose outcome is unknown by asking their tool's outcome read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from dispatch.outcomes import outcomes_settle


class Command(BaseCommand):
    help = (
        "Ask the system of record what became of each direct call whose outcome is unknown (or "
        "whose effect has been in progress too long), and settle it: completed, or open with its "
        "money released. Keys it cannot read now stay unknown."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=settings.TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS,
            metavar="SECONDS",
            help="only keys untouched this long, or in progress this long past their lease "
            "(default TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS, 120)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settled = outcomes_settle(older_than=timedelta(seconds=options["older_than"]))
        for outcome in settled:
            self.stdout.write(f"{outcome.tool} {outcome.key}: {outcome.status}")
        self.stdout.write(f"{len(settled)} settled")
