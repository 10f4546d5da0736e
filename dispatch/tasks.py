"""Celery tasks: each calls a service, nothing more."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from dispatch.audit import audit_seal
from dispatch.outcomes import outcomes_settle
from dispatch.retention import records_prune


@shared_task
def audit_seal_task() -> int:
    return audit_seal().number


@shared_task
def records_prune_task() -> dict[str, int]:
    pruned = records_prune()
    return {"keys": pruned.keys, "sessions": pruned.sessions}


@shared_task
def outcomes_settle_task() -> dict[str, int]:
    older_than = timedelta(seconds=settings.TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS)
    counts: dict[str, int] = {}
    for settled in outcomes_settle(older_than=older_than):
        counts[settled.status] = counts.get(settled.status, 0) + 1
    return counts
