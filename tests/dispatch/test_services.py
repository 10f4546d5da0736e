"""How a call's statements are grouped: on PostgreSQL a write in one transaction, a read in none.

These run outside the test's own transaction (transaction=True), as the API's calls do, since a
test transaction would put every call inside one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from dispatch.models import Agent, AuditRecord, IdempotencyRecord, Session
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.state import ClaimRequest
from dispatch.registry import tool_registry
from dispatch.services import call_dispatch
from dispatch.store import OrmState
from tests.conftest import Ledger, MakeAgent

ON_POSTGRESQL = connection.vendor == "postgresql"
postgresql_only = pytest.mark.skipif(
    not ON_POSTGRESQL, reason="needs PostgreSQL: only there do reads run outside a transaction"
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


def call(agent: Agent, tool: str, arguments: dict[str, object]) -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        tool=tool,
        arguments=json.dumps(arguments),
    )


def in_transaction_per_statement(work: Callable[[], object]) -> list[bool]:
    """For each statement that `work` sends: whether it ran inside a transaction block.

    SQLite's BEGIN, which Django sends as a statement just before the block starts, is left out.
    """
    seen: list[bool] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql != "BEGIN":
            seen.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        work()
    return seen


@postgresql_only
def test_a_read_runs_its_statements_outside_any_transaction(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    def read() -> None:
        result = call(agent, "get_order", {"order_id": "ORD-1001"})
        assert result.ok, result.message

    # the opening (with the order), the audit record
    assert in_transaction_per_statement(read) == [False, False]
    assert Session.objects.get(session_id="s-1").steps == 1
    assert IdempotencyRecord.objects.get().attempts == 1
    assert list(AuditRecord.objects.values_list("code", flat=True)) == ["OK"]


@postgresql_only
def test_a_refund_runs_all_its_statements_in_one_transaction(
    make_agent: MakeAgent, ledger: Ledger
) -> None:
    agent, _ = make_agent()

    def refund() -> None:
        result = call(agent, "refund_order", REFUND)
        assert result.ok, result.message

    statements = in_transaction_per_statement(refund)

    assert statements and all(statements)
    assert ledger.state() == (1, 1000)


@postgresql_only
def test_a_refund_refused_before_its_claim_needs_no_transaction(
    make_agent: MakeAgent, ledger: Ledger
) -> None:
    agent, _ = make_agent()

    def float_amount() -> None:
        result = call(agent, "refund_order", {**REFUND, "amount_cents": 25.9})
        assert result.code == "INVALID_ARGUMENTS"

    # the step, the audit record
    assert in_transaction_per_statement(float_amount) == [False, False]
    assert ledger.rows() == 0


@postgresql_only
def test_a_replayed_refund_is_one_transaction_too(make_agent: MakeAgent, ledger: Ledger) -> None:
    agent, _ = make_agent()

    def refund() -> bool:
        return call(agent, "refund_order", REFUND).replayed

    assert refund() is False
    replayed: list[bool] = []
    statements = in_transaction_per_statement(lambda: replayed.append(refund()))

    assert replayed == [True]
    assert statements and all(statements)
    assert ledger.state() == (1, 1000)


@postgresql_only
def test_a_rejected_call_of_an_unknown_tool_needs_no_transaction(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    def unknown() -> None:
        result = call(agent, "teleport_order", {})
        assert result.code == "UNKNOWN_TOOL"

    # the step, the audit record
    assert in_transaction_per_statement(unknown) == [False, False]
    assert AuditRecord.objects.get().step == 1


@postgresql_only
def test_a_reads_asynchronous_first_commit_does_not_outlive_it(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    for step in range(2):
        call(agent, "get_order" if step else "teleport_order", {"order_id": "ORD-1001"})

    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        setting = cursor.fetchone()

    assert setting == ("on",)


@postgresql_only
def test_a_read_inside_a_callers_own_transaction_leaves_its_commit_synchronous(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    transaction.set_autocommit(False)
    try:
        assert call(agent, "get_order", {"order_id": "ORD-1001"}).ok
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            setting = cursor.fetchone()
        transaction.commit()
    finally:
        transaction.set_autocommit(True)

    assert setting == ("on",)
    assert AuditRecord.objects.count() == 1


@postgresql_only
def test_repeated_reads_outside_a_transaction_are_still_counted_into_a_loop(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent(repeat_limit=3)
    codes = [call(agent, "get_order", {"order_id": "ORD-1001"}).code for _ in range(4)]

    assert codes == ["OK", "OK", "OK", "LOOP_DETECTED"]
    assert IdempotencyRecord.objects.get().attempts == 4
    assert AuditRecord.objects.count() == Session.objects.get().steps == 4


@pytest.mark.skipif(ON_POSTGRESQL, reason="SQLite only: there every call is one transaction")
def test_on_sqlite_every_call_is_one_transaction(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()

    def calls() -> None:
        assert call(agent, "get_order", {"order_id": "ORD-1001"}).ok
        assert call(agent, "teleport_order", {}).code == "UNKNOWN_TOOL"

    statements = in_transaction_per_statement(calls)

    assert statements and all(statements)
    assert AuditRecord.objects.count() == Session.objects.get().steps == 2


def test_the_store_refuses_to_claim_a_writes_key_outside_a_transaction(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    claim = ClaimRequest("k" * 64, "refund_order", True, 3, datetime.now(UTC))

    with pytest.raises(RuntimeError, match="transaction"), connection.cursor() as cursor:
        OrmState(cursor, tool_registry).open_call(
            agent_id=str(agent.pk),
            session_id="s-1",
            customer_id="CUS-1",
            step_budget=20,
            claim=claim,
        )

    assert not Session.objects.exists()
