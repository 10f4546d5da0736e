"""An Idempotency-Key whose first answer was not final is finished, not replayed and not rerun.

The refund whose outcome was unknown (its answer lost after the ledger took it, or Toolgate
failing on the way) is resent with the same key from a new session, as a restarted host sends it:
it runs again in the first request's session, where the pipeline finishes it under its own key,
and the ledger holds one refund. Every test ends on the ledger.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
import requests
from django.db import connection
from pytest_django.live_server_helper import LiveServer

from dispatch.models import AuditRecord, HostIdempotencyKey, Session
from orders.services import gateway_faults_set
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent
from tests.dispatch.apis.test_concurrency import all_at_once

pytestmark = pytest.mark.usefixtures("orders")

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: its connections to terminate, and concurrent writers",
)

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def keyed_refund(client: AgentClient, key: str, session: str) -> requests.Response:
    return client.post_call(
        "refund_order", REFUND, session=session, headers={"Idempotency-Key": key}
    )


def answer_of(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def sessions_of_the_refunds() -> list[str]:
    records = AuditRecord.objects.filter(tool="refund_order").order_by("at", "id")
    return list(records.values_list("session_id", flat=True))


def test_it_finishes_a_refund_whose_outcome_was_unknown_when_resent_from_a_new_session(
    api: AgentClient, ledger: Ledger
) -> None:
    # The ledger takes the refund each time and its answer is lost, past every retry.
    gateway_faults_set(lose_response_after_commit=3)
    unknown = answer_of(keyed_refund(api, "key-1", session="before-restart"))
    assert (unknown["code"], unknown["data"]["outcome"]) == ("UPSTREAM_UNAVAILABLE", "unknown")

    finished = keyed_refund(api, "key-1", session="after-restart")
    again = keyed_refund(api, "key-1", session="after-another-restart")

    assert answer_of(finished)["code"] == "OK"
    assert "Idempotent-Replayed" not in finished.headers
    assert answer_of(finished)["data"]["refunded_cents"] == 1_000
    assert again.content == finished.content
    assert again.headers["Idempotent-Replayed"] == "true"
    # Finished in the first request's session, under the pipeline's key of the first call.
    assert sessions_of_the_refunds() == ["before-restart", "before-restart"]
    assert not Session.objects.filter(session_id__startswith="after").exists()
    assert HostIdempotencyKey.objects.get().response_body == finished.text
    assert ledger.state() == (1, 1_000)
    assert ledger.rows() == 1


@on_postgresql
def test_a_refund_whose_reservation_connections_were_terminated_executes_once(
    client_for: ClientFor, make_agent: MakeAgent, ledger: Ledger
) -> None:
    # Under a daily cap a refund reserves its money on a connection of its own. A refund of
    # another customer opens those connections (one of the same customer would count in the sum
    # of the refund after it).
    api = client_for(make_agent(daily_cap_cents=1_000_000)[1])
    earlier = api.refund(
        2_000, order_id="ORD-1002", currency="USD", customer="CUS-2", session="earlier"
    )
    assert earlier["code"] == "OK"
    terminate_the_other_connections()

    # The reservation finds its connection closed at its first statement, before anything of it
    # was written, and reserves on a new one (dispatch/store/allowance.py): no 503 to resend.
    first = keyed_refund(api, "key-1", session="after-restart")
    again = keyed_refund(api, "key-1", session="after-restart")

    assert answer_of(first)["code"] == "OK"
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert sessions_of_the_refunds() == ["earlier", "after-restart"]
    assert ledger.state() == (1, 1_000)
    assert ledger.state("ORD-1002") == (1, 2_000)
    assert ledger.rows() == 2


def terminate_the_other_connections() -> None:
    """End every other connection to the test database, as a failover would; not this one."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        others = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND pid <> %s",
                [connection.connection.info.backend_pid],
            )
        ]
        assert others, "no other connection to terminate"
        for pid in others:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        while admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [others]
        ).fetchone():
            time.sleep(0.01)


@on_postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_resends_racing_for_an_unfinished_key_finish_the_refund_once(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger, attempt: int
) -> None:
    token = make_agent()[1]
    gateway_faults_set(lose_response_after_commit=3)
    first = keyed_refund(AgentClient(live_server.url, token), "raced-key", "before-restart")
    assert answer_of(first)["data"]["outcome"] == "unknown"

    responses = all_at_once(
        live_server,
        token,
        8,
        lambda client, i: keyed_refund(client, "raced-key", session=f"restart-{i}"),
    )

    answered = [response for response in responses if response.status_code == 200]
    busy = [response for response in responses if response.status_code == 409]
    assert len(answered) + len(busy) == 8
    assert all(r.json()["error"]["code"] == "idempotency_key_in_progress" for r in busy)
    assert len({response.content for response in answered}) == 1
    assert answered[0].json()["code"] == "OK"
    assert sum("Idempotent-Replayed" not in response.headers for response in answered) == 1
    assert sessions_of_the_refunds() == ["before-restart", "before-restart"]
    assert ledger.state() == (1, 1_000)
    assert ledger.rows() == 1
