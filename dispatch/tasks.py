"""Celery tasks: each calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task

from dispatch.audit import audit_seal
from dispatch.retention import records_prune


@shared_task
def audit_seal_task() -> int:
    return audit_seal().number


@shared_task
def records_prune_task() -> dict[str, int]:
    pruned = records_prune()
    return {"keys": pruned.keys, "sessions": pruned.sessions}
