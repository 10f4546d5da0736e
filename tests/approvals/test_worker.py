"""A real Celery worker process (`celery -A toolgate worker`) on Redis, against this test's
PostgreSQL database: it executes an approved refund once, and still exactly once when it is killed
with SIGKILL mid-way and started again; it retries a webhook with backoff.

The workers and the test's own Redis are tests/workers.py's. The tests of faults (the broker down,
a worker killed whose lease lapses) are marked `faults` as well: `make test` runs them with the
other fault tests (tests/faults), in a process of their own, and not with the rest of these.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import redis
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings

from approvals.models import ConfirmationEvent, WebhookDelivery, WebhookDeliveryStatus
from approvals.services import confirmation_approve
from approvals.webhooks import webhook_enqueue
from dispatch.models import Agent, Confirmation, ConfirmationStatus
from dispatch.services import agent_token_set
from dispatch.webhooks import agent_webhook_set
from orders.models import Order, Refund
from tests.approvals.conftest import HeldRefund, WebhookReceiver
from tests.conftest import Figures
from tests.workers import RedisServer, StartWorker, database_url, wait_until

# The sweep every second, sending again what no worker took within two; a lease of three seconds.
OUTBOX = {
    "TOOLGATE_EXECUTION_SWEEP_SECONDS": "1",
    "TOOLGATE_EXECUTION_RESEND_SECONDS": "2",
    "TOOLGATE_EXECUTION_LEASE_SECONDS": "3",
}
FINAL = {ConfirmationStatus.EXECUTED, ConfirmationStatus.FAILED, ConfirmationStatus.UNKNOWN}

# A process of their own (`make test` runs them apart): the Celery app's connections and its
# configuration are the process's, and the suite's other tests run its tasks in-process.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def status_of(confirmation: Confirmation) -> str:
    return str(Confirmation.objects.values_list("status", flat=True).get(pk=confirmation.pk))


def agent_reads(agent: Agent, confirmation: Confirmation) -> dict[str, Any]:
    """GET /api/v1/confirmations/{id}, as the agent host asks it."""
    token = f"tg_worker_test_{uuid.uuid4().hex}"
    agent_token_set(agent=agent, token=token)
    response = Client().get(
        f"/api/v1/confirmations/{confirmation.pk}", headers={"Authorization": f"Token {token}"}
    )
    assert response.status_code == 200, response.content
    state: dict[str, Any] = response.json()
    return state


def waiting_on_a_lock() -> bool:
    """Whether a connection to this database (the worker's) waits for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def test_the_worker_executes_an_approved_refund_and_the_agent_reads_the_result(
    start_worker: StartWorker,
    held_refund: HeldRefund,
    reviewers: list[User],
    holding_agent: Agent,
    order: Order,
) -> None:
    start_worker()
    held = held_refund(6_000)

    confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
    wait_until(lambda: status_of(held) in FINAL, "the worker to execute the refund")

    state = agent_reads(holding_agent, held)
    assert state["status"] == ConfirmationStatus.EXECUTED
    assert state["result"]["ok"] is True
    assert state["result"]["code"] == "OK"
    assert state["result"]["model_text"]
    assert list(Refund.objects.filter(order=order).values_list("amount_cents", flat=True)) == [
        6_000
    ]


@pytest.mark.parametrize(
    ("killed", "rows_after_kill"),
    [("while the refund waits for the order", 0), ("after the refund, before its record", 1)],
)
def test_a_worker_killed_mid_execution_and_started_again_refunds_exactly_once(
    start_worker: StartWorker,
    held_refund: HeldRefund,
    reviewers: list[User],
    holding_agent: Agent,
    order: Order,
    killed: str,
    rows_after_kill: int,
) -> None:
    first = start_worker(**OUTBOX)
    held = held_refund(6_000)
    url = database_url()

    # Row locks that this test takes hold the worker up where it is to be killed: at the refund
    # (the system of record is slow), or between the refund and the confirmation's record of it
    # (the money moved; the confirmation does not say so yet).
    with psycopg.connect(url) as order_lock, psycopg.connect(url) as record_lock:
        order_lock.execute(
            "SELECT 1 FROM orders_order WHERE order_id = %s FOR UPDATE", [order.order_id]
        )
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        wait_until(waiting_on_a_lock, "the worker's refund to wait for the order")
        if rows_after_kill:
            # No one holds it: the claim committed on its own.
            record_lock.execute("SET lock_timeout = '10s'")
            record_lock.execute(
                "SELECT 1 FROM dispatch_confirmation WHERE id = %s FOR UPDATE", [held.pk]
            )
            order_lock.rollback()
            wait_until(lambda: Refund.objects.filter(order=order).exists(), "the refund")
            wait_until(waiting_on_a_lock, "the worker to wait to record the execution")
        first.kill()
        order_lock.rollback()
        record_lock.rollback()
    after_kill = (Refund.objects.filter(order=order).count(), status_of(held))
    # Once the dead worker's lease has lapsed, the task delivered again or the beat's resend
    # takes the execution over.
    start_worker(beat=True, **OUTBOX)
    wait_until(lambda: status_of(held) in FINAL, "the task to be delivered again and finish")

    assert after_kill == (rows_after_kill, ConfirmationStatus.EXECUTING)
    state = agent_reads(holding_agent, held)
    assert state["status"] == ConfirmationStatus.EXECUTED
    assert state["result"]["ok"] is True
    assert Refund.objects.filter(order=order).count() == 1
    order.refresh_from_db()
    assert order.refunded_cents == 6_000
    kinds = list(
        ConfirmationEvent.objects.filter(confirmation_id=held.pk).values_list("kind", flat=True)
    )
    assert kinds == ["voted", "approved", "executing", "executing", "executed"]


def test_the_worker_retries_a_failed_webhook_with_backoff_until_it_is_delivered(
    start_worker: StartWorker,
    held_refund: HeldRefund,
    holding_agent: Agent,
    webhook_receiver: WebhookReceiver,
    settings: Settings,
    documented_verify: Callable[..., bool],
) -> None:
    settings.DEBUG = True
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = True
    secret = agent_webhook_set(agent=holding_agent, url=webhook_receiver.url)
    assert secret is not None
    held = held_refund(6_000)
    webhook_receiver.answers.extend([500, 503])
    start_worker()

    with transaction.atomic():
        webhook_enqueue(confirmation=held, event="expired")
    delivered = wait_until(
        lambda: WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.DELIVERED).first(),
        "the webhook to be delivered",
    )

    assert delivered.attempts == 3
    requests = webhook_receiver.received
    assert len(requests) == 3
    assert all(
        documented_verify(
            secret,
            request.headers["Toolgate-Signature"],
            request.headers["Toolgate-Delivery"],
            request.body,
        )
        for request in requests
    )
    assert {json.loads(request.body)["event"] for request in requests} == {"expired"}
    assert {request.headers["Toolgate-Delivery"] for request in requests} == {str(delivered.pk)}


# The approved row is the outbox: an approval is never lost -------------------------------------


def events_of(confirmation: Confirmation) -> list[tuple[str, str]]:
    return list(
        ConfirmationEvent.objects.filter(confirmation_id=confirmation.pk)
        .order_by("at", "id")
        .values_list("kind", "message")
    )


@pytest.mark.faults
def test_an_approval_made_while_redis_is_down_executes_once_when_it_is_back(
    own_redis: RedisServer,
    start_worker: StartWorker,
    held_refund: HeldRefund,
    holding_agent: Agent,
    reviewers: list[User],
    order: Order,
    webhook_receiver: WebhookReceiver,
    settings: Settings,
) -> None:
    settings.TOOLGATE_EXECUTION_RESEND_SECONDS = 2
    settings.DEBUG = True
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = True
    agent_webhook_set(agent=holding_agent, url=webhook_receiver.url)
    held = held_refund(6_000)
    reviewer = Client()
    reviewer.force_login(reviewers[0])
    own_redis.stop()

    answer = reviewer.post(
        reverse("approvals:approve", args=[held.pk]),
        {"next": reverse("approvals:detail", args=[held.pk])},
        follow=True,
    )
    while_down = (status_of(held), Refund.objects.filter(order=order).count())
    own_redis.start()
    start_worker(beat=True, **OUTBOX)
    wait_until(lambda: status_of(held) in FINAL, "the approval to execute", timeout=60)

    assert answer.status_code == 200
    assert "waiting for a worker" in answer.content.decode()
    assert while_down == (ConfirmationStatus.APPROVED, 0)
    assert status_of(held) == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(order=order).count() == 1
    kinds = [kind for kind, _ in events_of(held)]
    assert kinds == ["voted", "approved", "executing", "executed"]
    # The agent's webhook hears of the approval, whose task was lost, and of the execution.
    received = webhook_receiver.wait_for(2, timeout=30)
    assert sorted(json.loads(request.body)["event"] for request in received) == [
        "approved",
        "executed",
    ]


@pytest.mark.faults
def test_an_approval_no_worker_took_is_sent_again_by_the_sweep(
    own_redis: RedisServer,
    start_worker: StartWorker,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
) -> None:
    start_worker(beat=True, **OUTBOX)
    held = held_refund(6_000)
    # Its task is lost on the way (a broker that lost its data, say).
    with redis.Redis.from_url(own_redis.url) as client:
        client.flushdb()
        own_redis.stop()
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        own_redis.start()

    wait_until(lambda: status_of(held) in FINAL, "the sweep to send it again", timeout=60)

    assert status_of(held) == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(order=order).count() == 1


@pytest.mark.faults
def test_a_worker_killed_while_executing_loses_its_lease_to_one_other_worker(
    start_worker: StartWorker,
    held_refund: HeldRefund,
    reviewers: list[User],
    order: Order,
    figures: Figures,
) -> None:
    # Redis would hand the unacknowledged task to another worker only after an hour: what
    # recovers the execution here is the lease.
    slow_redelivery = {**OUTBOX, "CELERY_VISIBILITY_TIMEOUT_SECONDS": "3600"}
    first = start_worker(**slow_redelivery)
    held = held_refund(6_000)
    url = database_url()
    with psycopg.connect(url) as order_lock:
        # The system of record is slow: the worker waits for the order when it is killed.
        order_lock.execute(
            "SELECT 1 FROM orders_order WHERE order_id = %s FOR UPDATE", [order.order_id]
        )
        confirmation_approve(confirmation_id=held.pk, reviewer=reviewers[0])
        wait_until(waiting_on_a_lock, "the worker's refund to wait for the order")
        # The whole worker (its main process, the solo pool's only one), not a pool child.
        first.kill()
        killed_at = time.monotonic()
        order_lock.rollback()
    after_kill = status_of(held)
    start_worker(beat=True, **slow_redelivery)
    start_worker(**slow_redelivery)

    wait_until(lambda: status_of(held) in FINAL, "another worker to take the lease over", 60)
    figures(
        lease_seconds=slow_redelivery["TOOLGATE_EXECUTION_LEASE_SECONDS"],
        visibility_timeout_seconds=slow_redelivery["CELERY_VISIBILITY_TIMEOUT_SECONDS"],
        executed_seconds_after_kill=round(time.monotonic() - killed_at, 1),
        refunds=Refund.objects.filter(order=order).count(),
    )

    assert after_kill == ConfirmationStatus.EXECUTING
    assert status_of(held) == ConfirmationStatus.EXECUTED
    assert Refund.objects.filter(order=order).count() == 1
    events = events_of(held)
    assert [kind for kind, _ in events] == [
        "voted",
        "approved",
        "executing",
        "executing",
        "executed",
    ]
    assert events[3][1].startswith("Taken over")
