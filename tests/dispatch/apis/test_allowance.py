"""The human gate is on the money (issue 14, hole 1), through real HTTP.

A refund split into small calls, an agent past its daily cap and a refund repeated from another
conversation are held; on PostgreSQL, concurrent small refunds for one customer cannot together
pass the threshold, while unrelated refunds all run. An agent host's Idempotency-Key gets the
first answer again, so a host that restarts under a new session cannot refund twice. Every test
asserts the ledger, and the audit records or confirmations behind the answers.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Sum
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer

from dispatch.host_keys import TAKE_OVER_AFTER, request_hash
from dispatch.models import (
    Agent,
    AuditRecord,
    Confirmation,
    HostIdempotencyKey,
    Movement,
    SecurityEvent,
    Session,
)
from orders.models import Refund
from orders.services import gateway_faults_set
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent
from tests.dispatch.apis.test_concurrency import all_at_once, results_of
from tests.factories import OrderFactory

pytestmark = pytest.mark.usefixtures("orders")

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL: concurrent requests on one SQLite file take turns on its write lock",
)

THRESHOLD = 5_000  # DEFAULT_POLICY's auto_approve_below_cents


def refund_arguments(order_id: str = "ORD-1001", amount_cents: int = 1000) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "reason": "damaged",
    }


REFUND = refund_arguments()


def moved_by_policy() -> int:
    """What the ledger says moved without a human."""
    rows = Refund.objects.filter(approval="policy")
    return int(rows.aggregate(total=Sum("amount_cents"))["total"] or 0)


def hold_reason(result: dict[str, Any]) -> dict[str, Any]:
    """The reason the held call's confirmation keeps for the reviewer."""
    confirmation = Confirmation.objects.get(pk=result["data"]["confirmation_id"])
    assert confirmation.hold_reason is not None
    assert confirmation.hold_reason == result["data"]["reason"]
    reason: dict[str, Any] = confirmation.hold_reason
    return reason


# The split refund, the daily cap and the possible duplicate ------------------------------------


def test_nine_small_refunds_move_less_than_the_threshold_without_a_human(
    api: AgentClient, ledger: Ledger
) -> None:
    small = [
        OrderFactory.create(order_id=f"ORD-300{n}", customer_id="CUS-1", total_cents=20_000)
        for n in (1, 2, 3)
    ]
    amounts = [4_990 + n for n in range(9)]

    results = [
        api.refund(amount, order_id=small[n % 3].order_id) for n, amount in enumerate(amounts)
    ]

    assert [result["code"] for result in results] == ["OK"] + ["CONFIRMATION_REQUIRED"] * 8
    assert moved_by_policy() == 4_990 < THRESHOLD
    assert Refund.objects.count() == 1
    assert ledger.state(small[0].order_id) == (1, 4_990)
    # Each held one counts in the sum of the ones after it.
    held_before = 0
    for amount, result in zip(amounts[1:], results[1:], strict=True):
        reason = hold_reason(result)
        assert reason["kind"] == "window_sum"
        assert reason["data"]["held_cents"] == held_before
        assert reason["data"]["sum_cents"] == 4_990 + held_before + amount
        held_before += amount
    assert "4990 for ORD-3001" in results[1]["message"]
    assert Confirmation.objects.count() == 8
    assert list(AuditRecord.objects.values_list("code", flat=True)) == (
        ["OK"] + ["CONFIRMATION_REQUIRED"] * 8
    )


def test_while_a_large_refund_is_held_no_small_one_of_the_customer_moves_without_a_human(
    api: AgentClient, ledger: Ledger
) -> None:
    large = OrderFactory.create(order_id="ORD-3000", customer_id="CUS-1", total_cents=60_000)
    small = OrderFactory.create(order_id="ORD-3001", customer_id="CUS-1", total_cents=20_000)

    held = api.refund(40_000, order_id=large.order_id)
    after = api.refund(10, order_id=small.order_id, session="s-2")

    assert held["code"] == after["code"] == "CONFIRMATION_REQUIRED"
    assert hold_reason(held)["kind"] == "amount"
    reason = hold_reason(after)
    assert reason["kind"] == "window_sum"
    assert reason["data"]["held_cents"] == 40_000
    assert reason["data"]["sum_cents"] == 40_010
    assert "held for a reviewer" in after["message"]
    assert moved_by_policy() == 0
    assert ledger.state(small.order_id) == (0, 0)


def test_past_its_daily_cap_an_agents_refunds_for_any_customer_are_held(
    make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    capped = client_for(make_agent(daily_cap_cents=6_000)[1])
    other = client_for(make_agent(daily_cap_cents=6_000)[1])
    OrderFactory.create(order_id="ORD-3100", customer_id="CUS-3", total_cents=12_000)
    first = capped.refund(4_000)

    second = capped.refund(3_000, order_id="ORD-3100", customer="CUS-3", session="s-3")
    # 30.00 of CUS-3's is held now, and counts in the customer's sum: 15.00 more stays below 50.00.
    by_another_agent = other.refund(1_500, order_id="ORD-3100", customer="CUS-3", session="s-3")

    assert first["code"] == "OK"
    assert second["code"] == "CONFIRMATION_REQUIRED"
    reason = hold_reason(second)
    assert reason["kind"] == "agent_daily_cap"
    assert reason["data"] == {"agent_day_cents": 4_000, "daily_cap_cents": 6_000}
    assert "daily cap of 6000" in second["message"]
    assert by_another_agent["code"] == "OK"
    assert ledger.state() == (1, 4_000)
    assert ledger.state("ORD-3100") == (1, 1_500)
    assert moved_by_policy() == 5_500


@pytest.mark.parametrize("elsewhere", ["another session", "another agent"])
def test_a_refund_repeating_one_executed_elsewhere_is_held_as_a_possible_duplicate(
    api: AgentClient,
    make_agent: MakeAgent,
    client_for: ClientFor,
    ledger: Ledger,
    elsewhere: str,
) -> None:
    first = api.refund(1_000, session="s-1")
    again_from = api if elsewhere == "another session" else client_for(make_agent()[1])

    again = again_from.refund(1_000, session="s-2")

    assert first["code"] == "OK"
    assert again["code"] == "CONFIRMATION_REQUIRED"
    reason = hold_reason(again)
    assert reason["kind"] == "possible_duplicate"
    (earlier,) = reason["data"]["earlier"]
    assert (earlier["subject"], earlier["amount_cents"]) == ("ORD-1001", 1_000)
    # Another conversation's ids are not the model's to see.
    assert "session_id" not in earlier and "agent_id" not in earlier
    assert "possible duplicate" in again["message"]
    assert "ORD-1001" in again["message"]
    assert ledger.state() == (1, 1_000)
    assert Refund.objects.get().approval == "policy"


# The race, on PostgreSQL -------------------------------------------------------------------------


@on_postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_20_small_refunds_at_once_for_one_customer_never_pass_the_threshold_without_a_human(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger, attempt: int
) -> None:
    tokens = [make_agent()[1], make_agent()[1]]
    orders = [
        OrderFactory.create(order_id=f"ORD-40{n}", customer_id="CUS-7", total_cents=12_000)
        for n in range(4)
    ]
    # Distinct amounts, so that none is held as a duplicate of another: only the sum holds them.
    amounts = [900 + i for i in range(20)]

    def send(client: AgentClient, i: int) -> requests.Response:
        # Two agents, four sessions each, four orders: only the customer is shared by all.
        host = AgentClient(client.base_url, tokens[i % 2], client.http)
        return host.post_call(
            "refund_order",
            refund_arguments(orders[i % 4].order_id, amounts[i]),
            session=f"race-{i % 4}",
            customer="CUS-7",
        )

    results = results_of(all_at_once(live_server, tokens[0], 20, send))

    executed = [amounts[i] for i, result in enumerate(results) if result["code"] == "OK"]
    held = [i for i, result in enumerate(results) if result["code"] == "CONFIRMATION_REQUIRED"]
    assert len(executed) + len(held) == 20
    assert executed, "at least the first refund runs without a human"
    assert sum(executed) < THRESHOLD
    # Nothing was held while there was room: each held refund would have reached the threshold.
    assert sum(executed) + min(amounts[i] for i in held) >= THRESHOLD
    for i in held:
        reason = hold_reason(results[i])
        assert reason["kind"] == "window_sum"
        assert reason["data"]["sum_cents"] >= THRESHOLD
    assert moved_by_policy() == sum(executed)
    assert Refund.objects.count() == len(executed)
    assert sum(ledger.state(order.order_id)[1] for order in orders) == sum(executed)
    reserved = Movement.objects.filter(released_at=None, approval="policy")
    assert reserved.aggregate(total=Sum("amount_cents"))["total"] == sum(executed)
    assert Confirmation.objects.count() == len(held)
    assert AuditRecord.objects.count() == 20


@on_postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_20_refunds_at_once_for_20_customers_of_one_agent_all_run(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger, attempt: int
) -> None:
    token = make_agent()[1]
    orders = [
        OrderFactory.create(order_id=f"ORD-41{i:02d}", customer_id=f"CUS-R{i}") for i in range(20)
    ]

    results = results_of(
        all_at_once(
            live_server,
            token,
            20,
            lambda client, i: client.post_call(
                "refund_order",
                refund_arguments(orders[i].order_id, 1_000),
                session=f"unrelated-{i}",
                customer=orders[i].customer_id,
            ),
        )
    )

    assert Counter(result["code"] for result in results) == {"OK": 20}
    assert all(not result["replayed"] for result in results)
    assert [ledger.state(order.order_id) for order in orders] == [(1, 1_000)] * 20
    assert moved_by_policy() == 20_000
    assert Confirmation.objects.count() == 0
    assert AuditRecord.objects.count() == 20


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_refund_stuck_in_its_gateway_call_holds_up_no_other_customers_refund_of_the_agent(
    api: AgentClient, client_for: ClientFor, agent: tuple[Agent, str], ledger: Ledger
) -> None:
    OrderFactory.create(order_id="ORD-4200", customer_id="CUS-8")
    # Another transaction holds ORD-1001's row, so the refund below stops in the middle of its
    # gateway call, with everything its own transaction locks, and its reservation made.
    holder = connections[DEFAULT_DB_ALIAS].copy()
    holder.set_autocommit(False)
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (holder_pid,) = cursor.fetchone()
            cursor.execute("SELECT 1 FROM orders_order WHERE order_id = 'ORD-1001' FOR UPDATE")
        stuck = pool.submit(api.refund, 1_000, session="stuck")
        _wait_until_blocked_by(holder, holder_pid)

        other = client_for(agent[1]).refund(
            1_000, order_id="ORD-4200", customer="CUS-8", session="other"
        )
        stuck_meanwhile = not stuck.done()
    finally:
        holder.rollback()
        holder.close()
        pool.shutdown()
    unstuck = stuck.result()

    assert other["code"] == "OK"
    assert stuck_meanwhile
    assert unstuck["code"] == "OK"
    assert ledger.state("ORD-4200") == (1, 1_000)
    assert ledger.state() == (1, 1_000)


def _wait_until_blocked_by(holder: BaseDatabaseWrapper, pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with holder.cursor() as cursor:
            # Statistics are read once per transaction unless their snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [pid],
            )
            (blocked,) = cursor.fetchone()
        if blocked:
            return
        time.sleep(0.02)
    raise AssertionError("the refund never reached the order's row lock")


# The Idempotency-Key header ----------------------------------------------------------------------


def keyed_refund(
    client: AgentClient,
    key: str,
    *,
    session: str = "s-1",
    customer: str = "CUS-1",
    arguments: Any = None,
    tool: str = "refund_order",
) -> requests.Response:
    return client.post_call(
        tool,
        refund_arguments() if arguments is None else arguments,
        session=session,
        customer=customer,
        headers={"Idempotency-Key": key},
    )


def test_a_host_restarted_under_a_new_session_gets_the_first_answer_and_refunds_once(
    api: AgentClient, ledger: Ledger
) -> None:
    key = str(uuid.uuid4())
    first = keyed_refund(api, key, session="before-restart")

    again = keyed_refund(api, key, session="after-restart")

    assert first.status_code == again.status_code == 200
    assert first.json()["code"] == "OK"
    assert again.content == first.content
    assert again.headers["Content-Type"] == first.headers["Content-Type"] == "application/json"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert ledger.state() == (1, 1_000)
    # The resend never reached the pipeline: no call, no session, no confirmation.
    assert AuditRecord.objects.count() == 1
    assert not Session.objects.filter(session_id="after-restart").exists()
    assert Confirmation.objects.count() == 0
    stored = HostIdempotencyKey.objects.get()
    assert (stored.key, stored.status_code, stored.response_body) == (key, 200, first.text)
    assert stored.completed_at is not None


def test_without_a_key_the_restarted_hosts_resend_is_only_held_as_a_possible_duplicate(
    api: AgentClient, ledger: Ledger
) -> None:
    api.refund(1_000, session="before-restart")

    again = api.refund(1_000, session="after-restart")

    assert again["code"] == "CONFIRMATION_REQUIRED"
    assert ledger.state() == (1, 1_000)


def test_a_held_call_resent_with_its_key_gets_the_same_confirmation(
    api: AgentClient, ledger: Ledger
) -> None:
    first = keyed_refund(api, "held-1", arguments=refund_arguments(amount_cents=6_000))

    again = keyed_refund(
        api, "held-1", session="s-2", arguments=refund_arguments(amount_cents=6_000)
    )

    assert first.json()["code"] == "CONFIRMATION_REQUIRED"
    assert again.content == first.content
    assert Confirmation.objects.count() == 1
    assert AuditRecord.objects.count() == 1
    assert ledger.state() == (0, 0)


@pytest.mark.parametrize(
    "change",
    [
        {"arguments": refund_arguments(amount_cents=1_001)},
        {"arguments": json.dumps(refund_arguments())},
        {"customer": "CUS-2", "session": "s-2", "arguments": refund_arguments("ORD-1002")},
        {"tool": "get_order", "arguments": {"order_id": "ORD-1001"}},
    ],
    ids=["another amount", "the arguments as text", "another customer", "another tool"],
)
def test_the_same_key_with_another_request_is_a_422_and_runs_nothing(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger, change: dict[str, Any]
) -> None:
    first = keyed_refund(api, "key-1")

    reused = keyed_refund(api, "key-1", **change)

    assert first.json()["code"] == "OK"
    assert reused.status_code == 422
    assert reused.json() == {
        "error": {
            "status": 422,
            "code": "idempotency_key_reused",
            "message": "The Idempotency-Key 'key-1' was first sent with another customer_id, "
            "tool or arguments; a key names one request. Use a new key for a new request.",
            "retryable": False,
        }
    }
    assert ledger.state() == (1, 1_000)
    assert ledger.rows() == 1
    assert AuditRecord.objects.count() == 1
    event = SecurityEvent.objects.get()
    assert (event.status, event.reason, event.agent_id) == (
        422,
        "idempotency_key_reused",
        agent[0].pk,
    )


def test_the_same_arguments_in_another_key_order_are_the_same_request(
    api: AgentClient, ledger: Ledger
) -> None:
    first = keyed_refund(api, "key-1")

    again = keyed_refund(api, "key-1", arguments=dict(reversed(refund_arguments().items())))

    assert again.status_code == 200
    assert again.content == first.content
    assert ledger.state() == (1, 1_000)


def test_keys_are_per_agent(
    api: AgentClient, make_agent: MakeAgent, client_for: ClientFor, ledger: Ledger
) -> None:
    other = client_for(make_agent()[1])
    first = keyed_refund(api, "shared-key")

    others = keyed_refund(other, "shared-key", arguments=refund_arguments(amount_cents=2_000))

    assert first.json()["code"] == others.json()["code"] == "OK"
    assert others.json()["call_id"] != first.json()["call_id"]
    assert ledger.state() == (2, 3_000)
    assert HostIdempotencyKey.objects.count() == 2


def _running_key(agent: Agent, key: str, claimed_ago: timedelta) -> HostIdempotencyKey:
    """A key whose first request is still running, or whose process died, `claimed_ago`."""
    claimed_at = timezone.now() - claimed_ago
    return HostIdempotencyKey.objects.create(
        agent=agent,
        key=key,
        request_hash=request_hash(customer_id="CUS-1", tool="refund_order", arguments=REFUND),
        created_at=claimed_at,
        claimed_at=claimed_at,
    )


def test_a_request_while_the_first_with_its_key_runs_is_a_retryable_409(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger
) -> None:
    running = _running_key(agent[0], "key-1", claimed_ago=timedelta(seconds=2))

    response = keyed_refund(api, "key-1", session="s-2")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_progress"
    assert response.json()["error"]["retryable"] is True
    assert response.headers["Retry-After"] == "1"
    assert ledger.state() == (0, 0)
    assert AuditRecord.objects.count() == 0
    running.refresh_from_db()
    assert running.completed_at is None


def test_a_key_left_running_by_a_process_that_died_is_taken_over(
    api: AgentClient, agent: tuple[Agent, str], ledger: Ledger
) -> None:
    stuck = _running_key(agent[0], "key-1", claimed_ago=TAKE_OVER_AFTER + timedelta(seconds=1))

    response = keyed_refund(api, "key-1", session="s-2")
    again = keyed_refund(api, "key-1", session="s-3")

    assert response.status_code == 200
    assert response.json()["code"] == "OK"
    assert again.content == response.content
    assert ledger.state() == (1, 1_000)
    stuck.refresh_from_db()
    assert stuck.completed_at is not None
    assert stuck.response_body == response.text


def test_an_envelope_error_is_not_kept_against_the_key(api: AgentClient, ledger: Ledger) -> None:
    api.call("get_order", {"order_id": "ORD-1001"}, session="s-1")
    conflict = keyed_refund(
        api, "key-1", session="s-1", customer="CUS-2", arguments=refund_arguments("ORD-1002")
    )
    malformed = api.post_body("{", headers={"Idempotency-Key": "key-1"})
    assert HostIdempotencyKey.objects.count() == 0

    # Not the request the key was first sent with, and still not a 422: no answer was kept.
    later = keyed_refund(api, "key-1", session="s-2")

    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "session_conflict"
    assert malformed.status_code == 400
    assert later.status_code == 200
    assert later.json()["code"] == "OK"
    assert ledger.state() == (1, 1_000)


def test_a_retryable_result_is_not_kept_against_the_key(api: AgentClient, ledger: Ledger) -> None:
    gateway_faults_set(fail_before_commit=3)
    unavailable = keyed_refund(api, "key-1")

    again = keyed_refund(api, "key-1")

    assert unavailable.json()["code"] == "UPSTREAM_UNAVAILABLE"
    assert unavailable.json()["retryable"] is True
    assert again.json()["code"] == "OK"
    assert "Idempotent-Replayed" not in again.headers
    assert ledger.state() == (1, 1_000)
    assert HostIdempotencyKey.objects.get().response_body == again.text


@pytest.mark.parametrize(
    "key",
    ["", "k" * 256, "clé", "tab\there", "del\x7f"],
    ids=["empty", "256 characters", "not ASCII", "a tab", "a control character"],
)
def test_a_malformed_key_is_a_400_and_runs_nothing(
    api: AgentClient, ledger: Ledger, key: str
) -> None:
    response = keyed_refund(api, key)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "malformed_envelope"
    assert "Idempotency-Key header must be 1 to 255 printable ASCII characters" in error["message"]
    assert ledger.state() == (0, 0)
    assert AuditRecord.objects.count() == 0
    assert HostIdempotencyKey.objects.count() == 0


def test_a_key_of_255_printable_characters_is_taken(api: AgentClient, ledger: Ledger) -> None:
    key = ("A key, with spaces & punctuation: ~!" * 8)[:255]

    first = keyed_refund(api, key)
    again = keyed_refund(api, key, session="s-2")

    assert again.content == first.content
    assert HostIdempotencyKey.objects.get().key == key
    assert ledger.state() == (1, 1_000)


@on_postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_requests_racing_with_one_key_run_the_call_once(
    live_server: LiveServer, make_agent: MakeAgent, ledger: Ledger, attempt: int
) -> None:
    token = make_agent()[1]

    # Each from another session, as from hosts restarting at once: only the key ties them.
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
    assert ledger.state() == (1, 1_000)
    assert AuditRecord.objects.count() == 1
    assert Confirmation.objects.count() == 0
    assert HostIdempotencyKey.objects.get().response_body == answered[0].text
