"""Redis stopped while agents call and reviewers approve: a Redis of the test's own (the machine's
is never stopped), the web processes' cache and broker, and the Celery worker's broker.

Every agent call needs Redis (the throttle counts there for every web process): with it down the
agent gets 503 `rate_limiter_unavailable`, retryable, and the same call succeeds once it is back.
An approval needs only the database: made while Redis is down it is kept (the approved row is the
outbox) and executes once, after Redis returns, when the beat's resend sends it again.
"""

from __future__ import annotations

import time

import pytest
import requests
from django.contrib.auth.models import Group, User

from approvals.models import ConfirmationEvent
from approvals.selectors import REVIEWERS_GROUP
from approvals.services import confirmation_approve
from dispatch.models import Confirmation, ConfirmationStatus
from orders.models import Refund
from tests.conftest import Figures, MakeAgent
from tests.deploy.site import DIRECT_HEADERS
from tests.faults.conftest import Agents, StartWeb, audit_per_call, ledger_doubles
from tests.faults.test_web import burst_orders, refund
from tests.workers import RedisServer, StartWorker, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.faults,
    pytest.mark.timeout(240),
]

# The beat's resend every second, of what no worker took within two; a lease of three seconds.
OUTBOX = {
    "TOOLGATE_EXECUTION_SWEEP_SECONDS": "1",
    "TOOLGATE_EXECUTION_RESEND_SECONDS": "2",
    "TOOLGATE_EXECUTION_LEASE_SECONDS": "3",
}
HELD = 6
CALLS_WHILE_DOWN = 5


def test_redis_stopped_calls_are_retryable_and_approvals_execute_once_when_it_is_back(
    own_redis: RedisServer,
    start_worker: StartWorker,
    start_web: StartWeb,
    make_agent: MakeAgent,
    figures: Figures,
) -> None:
    web = start_web(workers=2, redis_url=own_redis.url, **OUTBOX)
    agent, token = make_agent(auto_approve_below_cents=5_000)
    reviewer = User.objects.create_user("faults-reviewer", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    held_orders = burst_orders(HELD, start=9000)
    paid_orders = burst_orders(CALLS_WHILE_DOWN, start=9100)
    agents = Agents(web.url, token)
    held = [
        refund(agents, f"redis-held-{i}", order, 6_000)["data"]["confirmation_id"]
        for i, order in enumerate(held_orders)
    ]

    own_redis.stop()
    down_at = time.monotonic()
    # The agents' calls: one request each, while Redis is down.
    while_down = []
    for i, order in enumerate(paid_orders):
        response = requests.post(
            f"{web.url}/api/v1/calls",
            json={
                "session_id": f"s-redis-{i}",
                "customer_id": order.customer_id,
                "tool": "refund_order",
                "arguments": {
                    "order_id": order.order_id,
                    "amount_cents": 1_000,
                    "currency": "BRL",
                    "reason": "damaged",
                },
            },
            headers={
                **DIRECT_HEADERS,
                "Authorization": f"Token {token}",
                "Idempotency-Key": f"redis-{i}",
            },
            timeout=30,
        )
        while_down.append((response.status_code, response.json()["error"]))
    # The reviewers' approvals: the database is enough.
    approving = time.monotonic()
    for confirmation_id in held:
        confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    approve_seconds = (time.monotonic() - approving) / HELD
    statuses_while_down = set(
        Confirmation.objects.filter(pk__in=held).values_list("status", flat=True)
    )
    refunds_while_down = Refund.objects.filter(order__in=held_orders).count()

    own_redis.start()
    up_at = time.monotonic()
    start_worker(beat=True, **OUTBOX)
    for i, order in enumerate(paid_orders):
        refund(agents, f"redis-{i}", order, 1_000)
    wait_until(
        lambda: (
            set(Confirmation.objects.filter(pk__in=held).values_list("status", flat=True))
            == {ConfirmationStatus.EXECUTED}
        ),
        "the approvals made while Redis was down to execute",
        timeout=60,
    )
    executed_after = time.monotonic() - up_at
    executions = list(
        ConfirmationEvent.objects.filter(confirmation_id__in=held, kind="executed").values_list(
            "confirmation_id", flat=True
        )
    )

    expected = {order.order_id: 1 for order in [*held_orders, *paid_orders]}
    ledger = ledger_doubles([*held_orders, *paid_orders], expected)
    audit = audit_per_call(agent, agents.tally.call_ids)
    figures(
        calls_while_down=len(while_down),
        answers_while_down=sorted({f"{status} {error['code']}" for status, error in while_down}),
        approvals_while_down=HELD,
        seconds_per_approval_while_down=round(approve_seconds, 2),
        redis_down_seconds=round(up_at - down_at, 1),
        executed_within_seconds_of_redis_back=round(executed_after, 1),
        retries=agents.tally.retries,
        **ledger,
        **audit,
    )
    assert all(status == 503 and error["retryable"] for status, error in while_down)
    assert {error["code"] for _, error in while_down} == {"rate_limiter_unavailable"}
    assert statuses_while_down == {ConfirmationStatus.APPROVED}
    assert refunds_while_down == 0
    assert sorted(executions) == sorted(held)
    assert ledger == {"doubles": 0, "missing": 0, "ledger_mismatches": {}}
    # The held calls and the calls made again once Redis was back: one record each.
    assert audit["audit_first_runs"] == HELD + CALLS_WHILE_DOWN
    assert executed_after < 60
