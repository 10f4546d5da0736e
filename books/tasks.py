"""Celery tasks: each calls a service, nothing more."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import connection

from books.reconciler import books_check

logger = logging.getLogger("toolgate.books")


@shared_task
def books_check_task(full: bool = False) -> dict[str, int]:
    if connection.vendor != "postgresql":
        logger.info("books: not checked, the checks need PostgreSQL")
        return {"found": 0, "new": 0}
    checked = books_check(full=full)
    return {"found": len(checked.found), "new": checked.new}
