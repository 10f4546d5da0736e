"""Unknown outcomes of upstream writes are found and settled while Toolgate runs: a key left in
progress by a process killed during the upstream's call is finished by the same call once its
lease ran out (reading what happened before it sends again), settle_outcomes settles it on the
beat's schedule, twice at once settling each key once, and a write declared by its arguments
(effect_of) is settled like one declared by its key."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dispatch.models import Agent, IdempotencyRecord, Movement
from dispatch.outcomes import outcome_settle, outcomes_settle
from dispatch.pipeline.tools import ExecutionContext
from dispatch.registry import tool_registry
from dispatch.tasks import outcomes_settle_task
from tests.conftest import MakeAgent
from tests.upstreams import payments as declarations
from tests.upstreams.conftest import ROOT, TOKEN, PaymentsServer, serve, wait_for
from tests.upstreams.test_payments import REFUND, in_thread, money_counted, refund
from upstreams.http import Upstream
from upstreams.registry import upstream_register, upstream_unregister
from upstreams.tools import UpstreamWrite

pytestmark = pytest.mark.django_db(transaction=True)

only_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="another process reads and writes the test's database",
)
# The caller process's upstream time budget: its lease is every attempt's twice this, and a second.
CALLER_TIMEOUT_SECONDS = 1.0


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent(
        allowed_tools=["get_payment", "refund_payment"], auto_approve_below_cents=50_000
    )[0]


def caller_env(payments: PaymentsServer) -> dict[str, str]:
    from tests.workers import database_url

    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TOOLGATE_UPSTREAMS": "",
        "TOOLGATE_UPSTREAM_PAYMENTS_URL": payments.url,
        "TOOLGATE_UPSTREAM_PAYMENTS_TOKEN": TOKEN,
        "TOOLGATE_UPSTREAM_PAYMENTS_TIMEOUT": str(CALLER_TIMEOUT_SECONDS),
        "TOOLGATE_TEST_PAYMENTS_HONOURS": "1" if payments.honours_idempotency_key else "0",
    }


def start_caller(payments: PaymentsServer, *arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.upstreams.caller", *arguments],
        cwd=ROOT,
        env=caller_env(payments),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def refund_in_a_process_killed_mid_call(
    payments: PaymentsServer, agent: Agent, *, made: bool
) -> None:
    """A refund whose process is SIGKILLed while the upstream has it: after the upstream made
    it (`made`), or while it still waits to."""
    caller = start_caller(
        payments, "call", "--agent", str(agent.pk), "--arguments", json.dumps(REFUND)
    )
    try:
        if made:
            wait_for(lambda: len(payments.refunds()) == 1, 30)
        else:
            wait_for(lambda: payments.state()["received"] == 1, 30)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)


def the_key() -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(tool="refund_payment")


def lease_run_out() -> None:
    def ran_out() -> bool:
        lease = the_key().lease_until
        return lease is not None and lease < timezone.now()

    wait_for(ran_out, 30)


@only_postgresql
def test_a_call_killed_after_the_upstream_made_it_is_replayed_once_its_lease_ran_out(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(hang_after_commit=1)
    refund_in_a_process_killed_mid_call(payments, agent, made=True)
    left = the_key()
    assert left.status == "in_progress" and money_counted() == 2_500
    assert left.remote_call == {
        "arguments": REFUND,
        "customer_id": "cust-1",
        "agent_id": str(agent.pk),
    }

    meanwhile = refund(agent)
    lease_run_out()
    lookups = payments.state().get("lookups", 0)
    finished = refund(agent)

    # Within its lease the process may still be at it; after, the same call finishes it.
    assert meanwhile.code == "CALL_IN_PROGRESS"
    assert (finished.code, finished.data["amount_cents"]) == ("OK", 2_500)
    assert len(payments.refunds()) == 1
    assert payments.state()["payments"]["PAY-1"]["refunded_cents"] == 2_500
    finished_key = the_key()
    assert finished_key.status == "completed" and finished_key.result is not None
    assert finished_key.result["data"] == finished.data
    assert money_counted() == 2_500
    if not payments.honours_idempotency_key:
        # The declared read was asked before anything was sent again.
        assert payments.state()["lookups"] == lookups + 1
        assert payments.state()["requests"] == 1


@only_postgresql
def test_a_call_killed_before_the_upstream_made_it_is_sent_again_under_its_key(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(slow_write=1, slow_seconds=60)
    refund_in_a_process_killed_mid_call(payments, agent, made=False)
    # The request it had sent dies with the upstream's process, unapplied.
    payments.kill()
    payments.start()
    lease_run_out()

    finished = refund(agent)

    assert finished.code == "OK"
    refunds = payments.refunds()
    assert [r["client_reference"] for r in refunds] == [the_key().key]
    assert money_counted() == 2_500


@only_postgresql
def test_settle_outcomes_finishes_a_key_left_in_progress_once_its_lease_ran_out(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(hang_after_commit=1)
    refund_in_a_process_killed_mid_call(payments, agent, made=True)

    early = outcomes_settle(older_than=timedelta(0))
    lease_run_out()
    settled = outcomes_settle(older_than=timedelta(0))
    replayed = refund(agent)

    assert early == []
    assert [(s.tool, s.status) for s in settled] == [("refund_payment", "completed")]
    assert replayed.replayed and replayed.code == "OK"
    assert len(payments.refunds()) == 1
    assert money_counted() == 2_500


@only_postgresql
def test_two_settlers_at_once_settle_each_key_once(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments = payments_honouring
    payments.arm(lose_after_commit=100)
    lost = [refund(agent, session=f"s-{n}", amount_cents=1_000 + n) for n in range(6)]
    assert {r.data["outcome"] for r in lost} == {"unknown"}
    # Each read of an outcome is slow: the two settlers overlap on every key.
    payments.arm(slow=100, slow_seconds=0.3)
    lookups = payments.state().get("lookups", 0)

    settlers = [start_caller(payments, "settle") for _ in range(2)]
    for settler in settlers:
        assert settler.stdout is not None and settler.stdout.readline() == "READY\n"
    for settler in settlers:
        assert settler.stdin is not None
        settler.stdin.write("\n")
        settler.stdin.flush()
    outputs = [settler.communicate(timeout=120)[0] for settler in settlers]

    by_each = [dict(json.loads(output.splitlines()[-1])) for output in outputs]
    keys = set(IdempotencyRecord.objects.values_list("key", flat=True))
    assert not by_each[0].keys() & by_each[1].keys()
    assert by_each[0].keys() | by_each[1].keys() == keys
    assert all(by_each[0]) and all(by_each[1])  # both took some
    assert set(by_each[0].values()) | set(by_each[1].values()) == {"completed"}
    assert payments.state()["lookups"] == lookups + len(keys)
    assert len(payments.refunds()) == 6


# A write declared by its arguments (effect_of) and no outcome_of -------------------------------


def by_arguments(upstream: Upstream) -> tuple[Any, ...]:
    """The payments declarations, its refund declaring the read of its effect by the call's
    arguments rather than by its key alone."""
    get_payment, refund_payment = declarations.tools(upstream)

    def refund_made(
        arguments: declarations.RefundPaymentArguments, context: ExecutionContext
    ) -> Mapping[str, Any] | None:
        found = upstream.read(
            "listRefunds", declarations.Refunds, query={"client_reference": context.idempotency_key}
        )
        assert found is not None
        for made in found.refunds:
            if (made.payment_id, made.amount_cents) == (
                arguments.payment_id,
                arguments.amount_cents,
            ):
                return made.model_dump(mode="json")
        return None

    return (
        get_payment,
        UpstreamWrite(dataclasses.replace(refund_payment, outcome_of=None), effect_of=refund_made),
    )


@pytest.fixture
def payments_by_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PaymentsServer]:
    module = SimpleNamespace(
        UPSTREAM=declarations.payments_upstream(honours_idempotency_key=False),
        tools=by_arguments,
        CURRENCIES=declarations.CURRENCIES,
    )
    for server in serve(tmp_path, monkeypatch, honours_idempotency_key=False):
        upstream_register(module, tool_registry)
        try:
            yield server
        finally:
            upstream_unregister("payments", tool_registry)


def lost_with_the_upstream_killed(payments: PaymentsServer, agent: Agent, **faults: float) -> None:
    payments.arm(**faults)
    answered: list[Any] = []
    caller = in_thread(lambda: answered.append(refund(agent)))
    if "hang_after_commit" in faults:
        wait_for(lambda: len(payments.refunds()) == 1)
    else:
        wait_for(lambda: payments.state()["received"] == 1)
    payments.kill()
    caller.join(30)
    assert answered[0].data["outcome"] == "unknown"
    payments.start()


def test_a_write_declared_by_its_arguments_is_settled_completed_on_the_beat(
    payments_by_arguments: PaymentsServer, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    payments = payments_by_arguments
    assert tool_registry.get("refund_payment").outcome_of is None  # type: ignore[union-attr]
    lost_with_the_upstream_killed(payments, agent, hang_after_commit=1)
    monkeypatch.setattr(settings, "TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS", 0.0)

    entry = settings.CELERY_BEAT_SCHEDULE["settle-outcomes"]
    # Run as a worker runs it. Not .delay().get(): Celery's flag against waiting inside a task is
    # process-wide, so a task another test's thread still runs eagerly would trip it here.
    settled = outcomes_settle_task.apply()
    assert settled.successful(), settled.traceback
    counts = settled.result
    replayed = refund(agent)

    assert entry["task"] == "dispatch.tasks.outcomes_settle_task" and entry["schedule"] <= 300
    assert counts == {"completed": 1}
    assert replayed.replayed and replayed.data["amount_cents"] == 2_500
    assert len(payments.refunds()) == 1
    assert money_counted() == 2_500


def test_a_write_declared_by_its_arguments_never_made_is_settled_open_with_its_money_free(
    payments_by_arguments: PaymentsServer, agent: Agent
) -> None:
    payments = payments_by_arguments
    lost_with_the_upstream_killed(payments, agent, slow_write=1, slow_seconds=30)
    key = the_key().key

    settled = outcome_settle(key=key)
    again = outcome_settle(key=key)

    assert settled is not None and settled.status == "open"
    assert again is None  # nothing left to settle
    assert payments.refunds() == []
    assert money_counted() == 0
    assert Movement.objects.get(key=key).released_at is not None


def test_an_upstream_that_cannot_be_read_leaves_the_key_unknown_and_free_to_settle_again(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments_honouring.arm(lose_after_commit=10)
    refund(agent)
    key = the_key().key
    payments_honouring.kill()

    away = outcome_settle(key=key)
    payments_honouring.start()
    back = outcome_settle(key=key)

    assert away is not None and away.status == "unknown"
    assert back is not None and back.status == "completed"
    assert len(payments_honouring.refunds()) == 1
    assert money_counted() == 2_500


def test_a_key_still_within_its_lease_is_not_settled(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(slow_write=1, slow_seconds=2)
    caller = in_thread(lambda: refund(agent))
    wait_for(lambda: payments.state()["received"] == 1)

    settled = outcomes_settle(older_than=timedelta(0))
    caller.join(30)

    assert settled == []
    assert the_key().status == "completed"
    assert len(payments.refunds()) == 1


# The reconciliation page -------------------------------------------------------------------


@pytest.fixture
def reviewer_browser(client: Any) -> Any:
    from approvals.reviewers import REVIEWERS_GROUP

    rita = User.objects.create_user("rita", password="pw")
    rita.groups.add(Group.objects.get_or_create(name=REVIEWERS_GROUP)[0])
    assert client.login(username="rita", password="pw")
    return client


def lost_answer(payments: PaymentsServer, agent: Agent) -> str:
    payments.arm(lose_after_commit=10)
    assert refund(agent).data["outcome"] == "unknown"
    payments.arm()
    return the_key().key


def test_the_reconciliation_page_lists_a_direct_unknown_outcome_and_settles_it(
    payments_honouring: PaymentsServer, agent: Agent, reviewer_browser: Any
) -> None:
    key = lost_answer(payments_honouring, agent)
    page = reviewer_browser.get(reverse("approvals:reconciliation"))
    settle = reverse("approvals:settle_outcome", args=[key])

    answered = reviewer_browser.post(settle, {"next": "/approvals/reconciliation/"}, follow=True)

    listed = page.content.decode()
    assert key in listed and "Refund payment" in listed and "PAY-1" in listed
    assert settle in listed
    shown = answered.content.decode()
    assert "took effect" in shown and key not in shown
    assert the_key().status == "completed"
    assert refund(agent).replayed
    assert len(payments_honouring.refunds()) == 1
    assert money_counted() == 2_500


def test_settling_from_the_page_is_for_reviewers_by_post_with_csrf_on_a_direct_call(
    payments_honouring: PaymentsServer, agent: Agent, reviewer_browser: Any, client: Any
) -> None:
    key = lost_answer(payments_honouring, agent)
    settle = reverse("approvals:settle_outcome", args=[key])
    outsider = User.objects.create_user("olga", password="pw")
    stranger = Client()
    insider = Client(enforce_csrf_checks=True)
    insider.force_login(User.objects.get(username="rita"))
    other = Client()
    other.force_login(outsider)
    IdempotencyRecord.objects.create(
        key="f" * 64,
        agent=agent,
        session_id="s-9",
        tool="refund_payment",
        status="unknown",
        confirmation_id="c" * 32,
        created_at=timezone.now(),
        updated_at=timezone.now(),
    )

    anonymous = stranger.post(settle)
    not_a_reviewer = other.post(settle)
    without_csrf = insider.post(settle)
    by_get = reviewer_browser.get(settle)
    no_such = reviewer_browser.post(reverse("approvals:settle_outcome", args=["0" * 64]))
    held = reviewer_browser.post(reverse("approvals:settle_outcome", args=["f" * 64]))

    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert not_a_reviewer.status_code == 403
    assert without_csrf.status_code == 403
    assert by_get.status_code == 405
    assert (no_such.status_code, held.status_code) == (404, 404)
    assert IdempotencyRecord.objects.get(pk=key).status == "unknown"
    assert payments_honouring.state().get("lookups", 0) == 0
