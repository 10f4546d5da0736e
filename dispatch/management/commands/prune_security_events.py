"""Delete the security events past their retention or beyond the rows kept."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from dispatch.models import SecurityEvent
from dispatch.security import security_events_prune


class Command(BaseCommand):
    help = (
        "Delete security events older than TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS and all but "
        "the newest TOOLGATE_SECURITY_EVENTS_MAX_ROWS. Writes prune as they go; run this from "
        "cron (daily is plenty) so that old events go on quiet days too."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        deleted = security_events_prune()
        kept = SecurityEvent.objects.count()
        self.stdout.write(
            f"Deleted {deleted} security event(s); {kept} kept "
            f"(at most {settings.TOOLGATE_SECURITY_EVENTS_MAX_ROWS}, "
            f"{settings.TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS} days)."
        )
