"""Celery tasks: each loads an id and calls a service, nothing more.

The services send them by name (approvals.executing.EXECUTE_TASK) and never import this
module: the tasks import the services, not the reverse (an import contract in pyproject.toml).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from approvals.notifications import notifications_resend_due
from approvals.services import (
    confirmation_execute,
    confirmations_expire_due,
    executions_resend_due,
)
from approvals.webhooks import webhooks_resend_due


# acks_late: a task whose worker dies mid-way is delivered again (after the broker's visibility
# timeout) and finishes the execution under the same key.
@shared_task(acks_late=True, reject_on_worker_lost=True)
def confirmation_execute_task(confirmation_id: str) -> None:
    confirmation_execute(confirmation_id=confirmation_id)


@shared_task
def confirmations_expire_task() -> int:
    return confirmations_expire_due()


@shared_task
def executions_resend_task() -> int:
    return executions_resend_due()


@worker_ready.connect
def outbox_resend_at_start(**_: Any) -> None:
    # A worker that starts (after the broker or the workers were down) sends what waits.
    executions_resend_due()
    webhooks_resend_due()
    notifications_resend_due()
