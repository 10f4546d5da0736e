"""Celery tasks: each calls a service, nothing more."""

from __future__ import annotations

from celery import shared_task

from dispatch.audit import audit_seal


@shared_task
def audit_seal_task() -> int:
    return audit_seal().number
