"""Delete the agent hosts' Idempotency-Keys past their retention."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from dispatch.host_keys import host_keys_prune
from dispatch.models import HostIdempotencyKey


class Command(BaseCommand):
    help = (
        "Delete agent hosts' Idempotency-Keys older than TOOLGATE_IDEMPOTENCY_KEY_HOURS. New keys "
        "prune as they go; run this from cron (daily is plenty) so that old keys go on quiet "
        "days too."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        deleted = host_keys_prune()
        kept = HostIdempotencyKey.objects.count()
        self.stdout.write(
            f"Deleted {deleted} idempotency key(s); {kept} kept "
            f"({settings.TOOLGATE_IDEMPOTENCY_KEY_HOURS} hours)."
        )
