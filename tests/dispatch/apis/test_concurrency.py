"""Real concurrent HTTP requests against the threaded live server, on PostgreSQL.

A call that claims a write's key is one transaction, so an identical call blocks on the idempotency
record's row lock and is then replayed, and different refunds of one order queue on the order's
row: the ledger adds up under any interleaving. Reads run with no transaction around them, and a
session raced by two customers is still bound to exactly one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from django.db import connection
from pytest_django.live_server_helper import LiveServer

from dispatch.models import AuditRecord, Confirmation, Session
from orders.services import gateway_faults_set
from tests.conftest import AgentClient, Ledger, MakeAgent

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="needs PostgreSQL and concurrent connections"
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders"),
]

# Room for many identical calls in one session: the limits under test are elsewhere.
ROOMY = {"step_budget": 200, "repeat_limit": 100, "auto_approve_below_cents": 5_000}


def connect(client: AgentClient) -> None:
    """Open the client's keep-alive connection with a harmless read.

    The live server queues only ten new connections, so calls released together must travel on
    connections that are already open; a read refused on a full queue is simply sent again.
    """
    for _ in range(20):
        try:
            assert client.get("/api/v1/codes").status_code == 200
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise AssertionError("could not connect to the live server")


def all_at_once(
    live_server: LiveServer,
    token: str,
    count: int,
    send: Callable[[AgentClient, int], requests.Response],
) -> list[requests.Response]:
    """send(client, i) for i in 0..count-1, each on its own connection, released together."""
    barrier = threading.Barrier(count)

    def work(index: int) -> requests.Response:
        with requests.Session() as http:
            client = AgentClient(live_server.url, token, http)
            connect(client)
            barrier.wait(timeout=30)
            return send(client, index)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(work, range(count)))


def results_of(responses: list[requests.Response]) -> list[dict[str, Any]]:
    statuses = Counter(response.status_code for response in responses)
    assert statuses == {200: len(responses)}, [r.text for r in responses if r.status_code != 200]
    return [response.json() for response in responses]


REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def test_32_identical_refunds_at_once_refund_once_and_replay_the_rest(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(**ROOMY)[1]

    results = results_of(
        all_at_once(live_server, token, 32, lambda api, _: api.post_call("refund_order", REFUND))
    )

    assert Counter(result["code"] for result in results) == {"OK": 32}
    assert sum(1 for result in results if not result["replayed"]) == 1
    assert len({result["data"]["refund_id"] for result in results}) == 1
    assert len({result["call_id"] for result in results}) == 32
    assert ledger.state() == (1, 1000)
    assert AuditRecord.objects.count() == 32
    assert Session.objects.get().steps == 32


def test_50_different_refunds_of_one_order_at_once_never_pass_its_total(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    # No human in the way: what is under test is the order's total, not the policy's allowance.
    token = make_agent(**{**ROOMY, "auto_approve_below_cents": 10**9})[1]
    amounts = [500 + i for i in range(50)]

    # Fifty sessions, so that no two calls share a key or a session row: only the order is shared.
    # Amounts differ, so that none is held as a duplicate of another.
    results = results_of(
        all_at_once(
            live_server,
            token,
            50,
            lambda api, i: api.post_call(
                "refund_order", {**REFUND, "amount_cents": amounts[i]}, session=f"s-{i}"
            ),
        )
    )

    codes = Counter(result["code"] for result in results)
    rows, refunded_cents = ledger.state()
    assert set(codes) <= {"OK", "AMOUNT_EXCEEDS_REFUNDABLE"}
    executed = [amounts[i] for i, result in enumerate(results) if result["ok"]]
    refused = [amounts[i] for i, result in enumerate(results) if not result["ok"]]
    assert codes["OK"] == rows == len(executed) >= 20
    assert refunded_cents == sum(executed) <= 12_000
    # Each refused one was refused for want of room, and there is less room now.
    assert all(amount > 12_000 - refunded_cents for amount in refused)
    refund_ids = [result["data"]["refund_id"] for result in results if result["ok"]]
    assert len(set(refund_ids)) == rows
    assert AuditRecord.objects.count() == 50


def test_a_resent_call_whose_response_was_lost_refunds_once_however_often_it_races(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(**ROOMY)[1]
    gateway_faults_set(lose_response_after_commit=3)
    with requests.Session() as http:
        lost = AgentClient(live_server.url, token, http).call("refund_order", REFUND)
    assert lost["code"] == "UPSTREAM_UNAVAILABLE"
    assert lost["data"]["outcome"] == "unknown"
    assert ledger.state() == (1, 1000)

    results = results_of(
        all_at_once(live_server, token, 16, lambda api, _: api.post_call("refund_order", REFUND))
    )

    assert Counter(result["code"] for result in results) == {"OK": 16}
    assert sum(1 for result in results if not result["replayed"]) == 1
    assert len({result["data"]["refund_id"] for result in results}) == 1
    assert ledger.state() == (1, 1000)


def test_identical_refunds_racing_a_lost_response_refund_once(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(**ROOMY)[1]
    gateway_faults_set(lose_response_after_commit=1)

    results = results_of(
        all_at_once(live_server, token, 16, lambda api, _: api.post_call("refund_order", REFUND))
    )

    assert Counter(result["code"] for result in results) == {"OK": 16}
    assert sum(1 for result in results if not result["replayed"]) == 1
    assert ledger.state() == (1, 1000)


def test_identical_held_refunds_at_once_share_one_confirmation(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(**ROOMY)[1]

    results = results_of(
        all_at_once(
            live_server,
            token,
            16,
            lambda api, _: api.post_call("refund_order", {**REFUND, "amount_cents": 6000}),
        )
    )

    assert Counter(result["code"] for result in results) == {"CONFIRMATION_REQUIRED": 16}
    assert len({result["data"]["confirmation_id"] for result in results}) == 1
    assert sum(1 for result in results if not result["replayed"]) == 1
    assert Confirmation.objects.count() == 1
    assert ledger.state() == (0, 0)


def test_a_new_session_raced_by_two_customers_is_bound_to_exactly_one(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(**ROOMY)[1]

    responses = all_at_once(
        live_server,
        token,
        20,
        lambda api, i: api.post_call(
            "get_order",
            {"order_id": "ORD-1001" if i % 2 else "ORD-1002"},
            customer="CUS-1" if i % 2 else "CUS-2",
        ),
    )

    session = Session.objects.get()
    winners = [r for r in responses if r.status_code == 200]
    assert Counter(r.status_code for r in responses) == {200: 10, 409: 10}
    assert all(r.json()["ok"] for r in winners)
    assert session.steps == AuditRecord.objects.count() == 10
    assert {record.customer_id for record in AuditRecord.objects.all()} == {session.customer_id}
    assert ledger.rows() == 0
