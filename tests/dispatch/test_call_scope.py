"""How a call's statements are grouped on PostgreSQL: a write in one transaction, a read in none.

These run outside the test's own transaction (transaction=True), as the API's calls do, since a
test transaction would put every call inside one.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from django.db import connection

from dispatch.models import AuditRecord, IdempotencyRecord, Session
from dispatch.services import call_dispatch
from tests.conftest import Ledger, MakeAgent

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's call scopes"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders"),
]

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def in_transaction_per_statement(work: Callable[[], object]) -> list[bool]:
    """For each statement that `work` sends: whether it ran inside a transaction block."""
    seen: list[bool] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        work()
    return seen


def test_a_read_runs_its_statements_outside_any_transaction(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    def read() -> None:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="get_order",
            arguments=json.dumps({"order_id": "ORD-1001"}),
        )
        assert result.ok, result.message

    # open, the order, the audit record with the key's settlement
    assert in_transaction_per_statement(read) == [False, False, False]
    assert Session.objects.get(session_id="s-1").steps == 1
    assert IdempotencyRecord.objects.get().attempts == 1
    assert list(AuditRecord.objects.values_list("code", flat=True)) == ["OK"]


def test_a_refund_runs_all_its_statements_in_one_transaction(
    make_agent: MakeAgent, ledger: Ledger
) -> None:
    agent, _ = make_agent()

    def refund() -> None:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(REFUND),
        )
        assert result.ok, result.message

    statements = in_transaction_per_statement(refund)

    assert statements and all(statements)
    assert ledger.state() == (1, 1000)


def test_a_refund_refused_before_its_claim_needs_no_transaction(
    make_agent: MakeAgent, ledger: Ledger
) -> None:
    agent, _ = make_agent()

    def float_amount() -> None:
        result = call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps({**REFUND, "amount_cents": 25.9}),
        )
        assert result.code == "INVALID_ARGUMENTS"

    # the step, the audit record
    assert in_transaction_per_statement(float_amount) == [False, False]
    assert ledger.rows() == 0


def test_a_replayed_refund_is_one_transaction_too(make_agent: MakeAgent, ledger: Ledger) -> None:
    agent, _ = make_agent()

    def refund() -> bool:
        return call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(REFUND),
        ).replayed

    assert refund() is False
    replayed: list[bool] = []
    statements = in_transaction_per_statement(lambda: replayed.append(refund()))

    assert replayed == [True]
    assert statements and all(statements)
    assert ledger.state() == (1, 1000)


def test_a_rejected_call_of_an_unknown_tool_needs_no_transaction(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    def unknown() -> None:
        result = call_dispatch(
            agent=agent, session_id="s-1", customer_id="CUS-1", tool="cancel_order", arguments="{}"
        )
        assert result.code == "UNKNOWN_TOOL"

    # the step, the audit record
    assert in_transaction_per_statement(unknown) == [False, False]
    assert AuditRecord.objects.get().step == 1


def test_a_reads_asynchronous_first_commit_does_not_outlive_it(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    for step in range(2):
        call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="get_order" if step else "cancel_order",
            arguments=json.dumps({"order_id": "ORD-1001"}),
        )

    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        setting = cursor.fetchone()

    assert setting == ("on",)


def test_repeated_reads_outside_a_transaction_are_still_counted_into_a_loop(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent(repeat_limit=3)
    codes = [
        call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="get_order",
            arguments=json.dumps({"order_id": "ORD-1001"}),
        ).code
        for _ in range(4)
    ]

    assert codes == ["OK", "OK", "OK", "LOOP_DETECTED"]
    assert IdempotencyRecord.objects.get().attempts == 4
    assert AuditRecord.objects.count() == Session.objects.get().steps == 4
