"""Celery tasks: each calls the service, nothing more."""

from __future__ import annotations

from celery import shared_task

from analytics.fills import rollups_fill


@shared_task
def rollups_fill_task() -> dict[str, int | None]:
    filled = rollups_fill()
    return {"calls": filled.calls, "events": filled.events}
