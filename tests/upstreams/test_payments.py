"""A refund through an HTTP upstream (the payments stand-in in its own process) executes once,
whatever the upstream does: with or without its own idempotency, answers lost after commit,
killed mid-call; and what it says that is bad is answered, never shown raw, never leaking its
credentials."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from approvals.deciding import confirmation_approve
from approvals.errors import RecheckUnavailable
from dispatch.models import Agent, AuditRecord, Confirmation, IdempotencyRecord, Movement
from dispatch.outcomes import outcomes_settle
from dispatch.pipeline.results import CallResult
from dispatch.services import call_dispatch
from tests.conftest import ClientFor, MakeAgent
from tests.upstreams.conftest import TOKEN, PaymentsServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REFUND = {"payment_id": "PAY-1", "amount_cents": 2_500, "currency": "BRL", "reason": "damaged"}


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    # Refunds below 50.00 run at once; from 50.00 a reviewer decides.
    return make_agent(
        allowed_tools=["get_payment", "refund_payment"], auto_approve_below_cents=5_000
    )[0]


def call(agent: Agent, tool: str, arguments: dict[str, Any], session: str = "s-1") -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="cust-1",
        tool=tool,
        arguments=json.dumps(arguments),
    )


def refund(agent: Agent, session: str = "s-1", **changes: Any) -> CallResult:
    return call(agent, "refund_payment", {**REFUND, **changes}, session)


def in_thread(target: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def money_counted() -> int:
    return sum(
        Movement.objects.filter(released_at=None, tool="refund_payment").values_list(
            "amount_cents", flat=True
        )
    )


def test_a_refund_executes_once_and_its_repeat_replays(
    payments: PaymentsServer, agent: Agent
) -> None:
    first = refund(agent)
    again = refund(agent)

    assert (first.code, first.data["amount_cents"]) == ("OK", 2_500)
    assert again.replayed and again.data == first.data
    assert [r["amount_cents"] for r in payments.refunds()] == [2_500]
    assert payments.state()["payments"]["PAY-1"]["refunded_cents"] == 2_500
    assert money_counted() == 2_500


def test_an_answer_lost_after_commit_executes_once(payments: PaymentsServer, agent: Agent) -> None:
    payments.arm(lose_after_commit=1)

    result = refund(agent)

    assert result.code == "OK"
    assert len(payments.refunds()) == 1
    assert money_counted() == 2_500


def test_answers_lost_every_time_stay_unknown_with_their_money_until_read(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments = payments_honouring
    payments.arm(lose_after_commit=10)

    lost = refund(agent)

    assert (lost.code, lost.data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "unknown")
    assert IdempotencyRecord.objects.get(tool="refund_payment").status == "unknown"
    assert money_counted() == 2_500
    payments.arm()

    settled = refund(agent)

    assert settled.code == "OK"
    assert IdempotencyRecord.objects.get(tool="refund_payment").status == "completed"
    assert len(payments.refunds()) == 1
    assert money_counted() == 2_500


def test_an_upstream_killed_mid_call_refunds_once_when_it_is_back(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(hang_after_commit=1)
    answered: list[CallResult] = []
    caller = in_thread(lambda: answered.append(refund(agent)))
    wait_for(lambda: len(payments.refunds()) == 1)

    payments.kill()
    caller.join(30)

    assert (answered[0].code, answered[0].data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "unknown")
    assert money_counted() == 2_500
    payments.start()

    resumed = refund(agent)

    assert resumed.code == "OK"
    assert len(payments.refunds()) == 1
    assert payments.state()["payments"]["PAY-1"]["refunded_cents"] == 2_500
    assert money_counted() == 2_500


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="reads another connection's commits while the call is in flight",
)
def test_the_key_and_the_money_commit_before_the_upstream_is_called(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(slow_write=1, slow_seconds=1.5)
    seen: dict[str, Any] = {}
    caller = in_thread(lambda: seen.setdefault("result", refund(agent)))

    def committed() -> bool:
        record = IdempotencyRecord.objects.filter(tool="refund_payment").first()
        return record is not None and Movement.objects.filter(key=record.key).exists()

    wait_for(committed)
    in_flight = IdempotencyRecord.objects.get(tool="refund_payment").status
    refunded_meanwhile = len(payments.refunds())
    caller.join(30)

    assert (in_flight, refunded_meanwhile) == ("in_progress", 0)
    assert seen["result"].code == "OK"
    assert len(payments.refunds()) == 1


def test_a_refusal_after_the_gate_said_yes_releases_the_money_and_is_escaped(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(markup=1)

    refused = refund(agent)

    assert refused.code == "UPSTREAM_REFUSED"
    assert "<script>" not in refused.message and "&lt;script&gt;" in refused.message
    assert "<" not in json.dumps(refused.as_dict())
    assert payments.refunds() == []
    assert money_counted() == 0
    assert IdempotencyRecord.objects.get(tool="refund_payment").status == "open"


def test_a_check_reads_the_live_state_through_the_upstream(
    payments: PaymentsServer, agent: Agent
) -> None:
    too_much = refund(agent, amount_cents=10_001)
    wrong_currency = refund(agent, currency="USD")
    not_hers = refund(agent, payment_id="PAY-3")

    assert too_much.code == "PAYMENT_AMOUNT_EXCEEDS_REFUNDABLE"
    assert wrong_currency.code == "PAYMENT_CURRENCY_MISMATCH"
    assert not_hers.code == "PAYMENT_NOT_FOUND"
    assert payments.state()["received"] == 0
    assert money_counted() == 0


def test_arguments_that_fail_the_schema_never_reach_the_upstream(
    payments: PaymentsServer, agent: Agent
) -> None:
    floats = refund(agent, amount_cents=25.0)
    extra = refund(agent, note="x")

    assert floats.code == extra.code == "INVALID_ARGUMENTS"
    assert payments.state()["received"] == 0


def test_a_held_refund_approved_executes_once_on_the_upstream(
    payments: PaymentsServer, agent: Agent
) -> None:
    reviewer = User.objects.create_user("rita", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    held = refund(agent, amount_cents=6_000)
    assert held.code == "CONFIRMATION_REQUIRED"
    assert payments.refunds() == []

    confirmation_approve(confirmation_id=held.data["confirmation_id"], reviewer=reviewer)

    confirmation = Confirmation.objects.get(pk=held.data["confirmation_id"])
    assert confirmation.status == "executed"
    assert [r["amount_cents"] for r in payments.refunds()] == [6_000]


def test_an_upstream_away_during_the_approval_leaves_the_held_refund_pending(
    payments: PaymentsServer, agent: Agent
) -> None:
    reviewer = User.objects.create_user("rita", password="pw")
    reviewer.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    held = refund(agent, amount_cents=6_000)
    confirmation_id = held.data["confirmation_id"]
    payments.kill()

    with pytest.raises(RecheckUnavailable, match="could not be checked now"):
        confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)

    assert Confirmation.objects.get(pk=confirmation_id).status == "pending"
    payments.start()
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    assert Confirmation.objects.get(pk=confirmation_id).status == "executed"
    assert len(payments.refunds()) == 1


def test_an_upstream_that_is_down_is_a_retryable_answer(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.kill()

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})
    write = refund(agent)

    assert (read.code, read.retryable) == ("UPSTREAM_UNAVAILABLE", True)
    assert (write.code, write.retryable) == ("UPSTREAM_READ_FAILED", True)
    assert money_counted() == 0


def test_an_upstream_slower_than_the_time_budget_is_unavailable(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(slow=3, slow_seconds=4)

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})

    assert (read.code, read.data["outcome"]) == ("UPSTREAM_UNAVAILABLE", "not_applied")


@pytest.mark.parametrize("fault", ["malformed", "wrong_schema"])
def test_an_answer_that_is_not_the_declared_one_is_not_shown(
    payments: PaymentsServer, agent: Agent, fault: str
) -> None:
    payments.arm(**{fault: 1})

    read = call(agent, "get_payment", {"payment_id": "PAY-1"})

    assert read.code == "UPSTREAM_BAD_ANSWER"
    assert "lots" not in read.message and "not json" not in read.message


@pytest.mark.parametrize("fault", ["malformed_write", "wrong_schema_write"])
def test_a_write_answered_unreadably_executes_once(
    payments: PaymentsServer, agent: Agent, fault: str
) -> None:
    payments.arm(**{fault: 1})

    result = refund(agent)

    assert result.code == "OK"
    assert len(payments.refunds()) == 1


def test_credentials_never_appear_in_a_result_the_audit_or_a_log(
    payments: PaymentsServer, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    results = [call(agent, "get_payment", {"payment_id": "PAY-1"}), refund(agent)]
    payments.arm(markup=1)
    results.append(refund(agent, amount_cents=3))
    payments.kill()
    results += [call(agent, "get_payment", {"payment_id": "PAY-1"}), refund(agent, amount_cents=4)]

    written = json.dumps([r.as_dict() for r in results])
    audited = json.dumps(
        list(AuditRecord.objects.values_list("message", "raw_arguments", "arguments"))
    )
    assert TOKEN not in written
    assert TOKEN not in audited
    assert TOKEN not in caplog.text


def test_a_lost_answer_is_settled_by_the_outcome_read_with_its_money_moved(
    payments_honouring: PaymentsServer, agent: Agent
) -> None:
    payments_honouring.arm(lose_after_commit=10)
    assert refund(agent).data["outcome"] == "unknown"
    payments_honouring.arm()

    settled = outcomes_settle(older_than=timedelta(0))

    assert [(s.tool, s.status) for s in settled] == [("refund_payment", "completed")]
    again = refund(agent)
    assert again.replayed and again.code == "OK"
    assert len(payments_honouring.refunds()) == 1
    assert money_counted() == 2_500


def test_an_effect_that_never_happened_is_settled_open_with_its_money_released(
    payments: PaymentsServer, agent: Agent
) -> None:
    payments.arm(slow_write=1, slow_seconds=30)
    answered: list[CallResult] = []
    caller = in_thread(lambda: answered.append(refund(agent)))
    wait_for(lambda: payments.state()["received"] == 1)
    payments.kill()
    caller.join(30)
    assert answered[0].data["outcome"] == "unknown"
    payments.start()

    settled = outcomes_settle(older_than=timedelta(0))

    assert [s.status for s in settled] == ["open"]
    assert payments.refunds() == []
    assert money_counted() == 0


def test_an_agent_host_refunds_through_the_api_once_with_its_own_idempotency_key(
    payments: PaymentsServer, make_agent: MakeAgent, client_for: ClientFor
) -> None:
    _, token = make_agent(allowed_tools=["get_payment", "refund_payment"])
    api = client_for(token)
    headers = {"Idempotency-Key": "host-key-1"}

    first = api.post_call("refund_payment", REFUND, customer="cust-1", headers=headers)
    again = api.post_call("refund_payment", REFUND, customer="cust-1", headers=headers)

    assert first.status_code == again.status_code == 200
    assert first.json()["code"] == "OK" and again.json()["data"] == first.json()["data"]
    assert TOKEN not in first.text
    assert len(payments.refunds()) == 1
