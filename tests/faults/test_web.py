"""Faults under a burst of refunds through gunicorn (several sync workers, real HTTP): workers
SIGKILLed, the database's connections terminated. Every call is sent until its answer is final,
with its Idempotency-Key: whatever failed, no refund is paid twice, every call is answered or
refused as retryable (never an HTML page, never a 500), and one audit record stands per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from dispatch.models import Agent, AuditRecord, Confirmation, ConfirmationStatus
from orders.models import Order
from tests.conftest import Figures, MakeAgent
from tests.factories import OrderFactory
from tests.faults.conftest import Agents, StartWeb, audit_per_call, ledger_doubles

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.faults,
    pytest.mark.timeout(240),
]

WORKERS = 3
SENDERS = 8
DISTINCT = 60
# The killing burst is longer: four kills, at each fifth of it answered, each leave the others
# enough calls to meet a worker gunicorn started again.
KILLED_BURST = 180
# Refunds sent by several agents at once with one key and one body (a host resending).
IDENTICAL = 4
SENDERS_EACH = 5


def burst_orders(count: int, *, start: int) -> list[Order]:
    # A customer per order: the burst's refunds never wait on one customer's lock.
    return [
        OrderFactory.create(
            order_id=f"ORD-{start + i}", customer_id=f"CUS-{start + i}", total_cents=10_000
        )
        for i in range(count)
    ]


def refund(agents: Agents, key: str, order: Order, amount_cents: int) -> dict[str, Any]:
    return agents.call(
        key,
        session=f"s-{key}",
        customer=order.customer_id,
        tool="refund_order",
        arguments={
            "order_id": order.order_id,
            "amount_cents": amount_cents,
            "currency": "BRL",
            "reason": "damaged",
        },
    )


def at_progress(futures: list[Future[Any]], fault: Callable[[int], None], steps: int) -> int:
    """Inflicts `fault` each time another 1/`steps` of the burst has been answered, until it is
    over: paced by the burst itself, so that a fast machine sees as many faults as a slow one;
    returns how many times."""
    count, poll = 0, 0.02
    while True:
        done = sum(future.done() for future in futures)
        if done == len(futures):
            break
        if done * steps >= (count + 1) * len(futures):
            fault(count)
            count += 1
        time.sleep(poll)
    for future in futures:
        future.result()
    return count


def test_gunicorn_workers_killed_mid_burst_pay_no_refund_twice(
    start_web: StartWeb, make_agent: MakeAgent, redis_url: str, figures: Figures
) -> None:
    web = start_web(workers=WORKERS, redis_url=redis_url)
    agent, token = make_agent(auto_approve_below_cents=5_000)
    distinct = burst_orders(KILLED_BURST, start=7000)
    identical = burst_orders(IDENTICAL, start=7800)
    agents = Agents(web.url, token)
    started = time.monotonic()

    with ThreadPoolExecutor(SENDERS) as pool:
        futures = [
            pool.submit(refund, agents, f"kill-{i}", order, 1_000 + i)
            for i, order in enumerate(distinct)
        ]
        for i, order in enumerate(identical):
            futures += [
                pool.submit(refund, agents, f"kill-same-{i}", order, 2_500)
                for _ in range(SENDERS_EACH)
            ]
        killed: list[int] = []
        # A worker is killed at each fifth of the burst answered (four kills): a killed
        # worker's calls wait for gunicorn to start another, which slows the burst, not the
        # pace of the kills.
        kills = at_progress(futures, lambda n: killed.append(web.kill_a_worker(n)), steps=5)
    seconds = time.monotonic() - started
    web.wait_for_workers(WORKERS)

    tally = agents.tally
    expected = {order.order_id: 1 for order in [*distinct, *identical]}
    ledger = ledger_doubles([*distinct, *identical], expected)
    audit = audit_per_call(agent, tally.call_ids)
    figures(
        calls=tally.calls,
        logical_refunds=len(expected),
        requests=tally.requests,
        retries=tally.retries,
        retried_on=dict(tally.retried_on),
        kills=kills,
        seconds=round(seconds, 1),
        slowest_call_seconds=round(tally.slowest_seconds, 1),
        **ledger,
        **audit,
    )
    assert kills >= 3
    assert tally.wrong == []
    assert dict(tally.final) == {"OK": KILLED_BURST + IDENTICAL * SENDERS_EACH}
    assert ledger == {"doubles": 0, "missing": 0, "ledger_mismatches": {}}
    assert audit["audit_first_runs"] == len(expected)
    assert audit["answered_without_record"] == 0
    assert audit["keys_answered_twice"] == 0


def terminate_connections(application_name: str) -> int:
    """pg_terminate_backend on the web processes' connections to this test's database only."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s "
            "AND pid <> pg_backend_pid()",
            [application_name],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def test_database_connections_terminated_mid_burst_answer_503_and_recover(
    start_web: StartWeb, make_agent: MakeAgent, redis_url: str, figures: Figures
) -> None:
    web = start_web(workers=WORKERS, redis_url=redis_url)
    # Refunds from 50.00 are held for a reviewer: the burst writes confirmations too.
    agent, token = make_agent(auto_approve_below_cents=5_000)
    paid = burst_orders(DISTINCT, start=8000)
    held = burst_orders(20, start=8500)
    agents = Agents(web.url, token)
    terminated: list[int] = []
    started = time.monotonic()

    with ThreadPoolExecutor(SENDERS) as pool:
        futures = [
            pool.submit(refund, agents, f"db-{i}", order, 1_000 + i) for i, order in enumerate(paid)
        ]
        futures += [
            pool.submit(refund, agents, f"db-held-{i}", order, 6_000)
            for i, order in enumerate(held)
        ]
        # Paced by the burst, not the clock: a quiet machine answers it in well under a second.
        terminations = at_progress(
            futures,
            lambda _: terminated.append(terminate_connections(web.application_name)),
            steps=5,
        )
    last_termination = time.monotonic()
    terminate_connections(web.application_name)
    burst_seconds = last_termination - started

    # The server recovers without a restart: a connection found dead is closed at the end of its
    # request, and the next request opens another.
    recovery = burst_orders(6, start=8900)
    answers_before = agents.tally.retries
    recovered_at = None
    for i, order in enumerate(recovery):
        refund(agents, f"db-after-{i}", order, 1_500)
        recovered_at = recovered_at or time.monotonic()
    retries_to_recover = agents.tally.retries - answers_before

    tally = agents.tally
    orders = [*paid, *held, *recovery]
    ledger = ledger_doubles([*paid, *recovery], {o.order_id: 1 for o in [*paid, *recovery]})
    audit = audit_per_call(agent, tally.call_ids)
    confirmations = Confirmation.objects.filter(agent=agent)
    held_records = AuditRecord.objects.filter(agent=agent, code="CONFIRMATION_REQUIRED")
    unheld = set(confirmations.values_list("pk", flat=True)) ^ set(
        held_records.values_list("confirmation_id", flat=True)
    )
    figures(
        calls=tally.calls,
        requests=tally.requests,
        retries=tally.retries,
        retried_on=dict(tally.retried_on),
        terminations=terminations,
        connections_terminated=sum(terminated),
        burst_seconds=round(burst_seconds, 1),
        recover_seconds=round((recovered_at or last_termination) - last_termination, 2),
        retries_to_recover=retries_to_recover,
        confirmations=confirmations.count(),
        **ledger,
        **audit,
    )
    assert sum(terminated) >= 3
    assert tally.wrong == []
    # Each worker meets each of its dead connections (the request's, the allowance's) once.
    assert retries_to_recover <= 2 * WORKERS
    assert dict(tally.final) == {
        "OK": DISTINCT + len(recovery),
        "CONFIRMATION_REQUIRED": len(held),
    }
    assert any(why.startswith("503 database_unavailable") for why in tally.retried_on)
    assert ledger == {"doubles": 0, "missing": 0, "ledger_mismatches": {}}
    # No half-written call: a confirmation and its audit record, or neither.
    assert confirmations.count() == len(held)
    assert set(confirmations.values_list("status", flat=True)) == {ConfirmationStatus.PENDING}
    assert unheld == set()
    assert audit["audit_first_runs"] == len(orders)
    assert audit["answered_without_record"] == 0
    assert audit["keys_answered_twice"] == 0
    assert isinstance(agent, Agent)
