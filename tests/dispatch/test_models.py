"""The audit trail: one record per call that reached the pipeline, and on PostgreSQL nothing can
change or remove one."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from dispatch.models import Agent, AuditRecord
from dispatch.services import call_dispatch
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

REFUND = {"order_id": "ORD-1001", "amount_cents": 1000, "currency": "BRL", "reason": "damaged"}


@pytest.mark.usefixtures("orders")
def test_every_call_that_reaches_the_pipeline_leaves_one_audit_record(
    api: AgentClient, client_for: ClientFor, ledger: Ledger
) -> None:
    reached = [
        api.call("get_order", '{"order_id": "ORD-1001"}'),
        api.call("nope", "{}"),
        api.call("refund_order", "[]"),
        api.call("refund_order", {**REFUND, "amount_cents": 25.9}),
        api.refund(1000),
        api.refund(1000),
        api.refund(5000),
        api.refund(1000, order_id="ORD-1002"),
    ]
    # Envelope errors never reach the pipeline, so they leave no record.
    assert api.post_body("not json").status_code == 400
    assert client_for("tg_wrong").post_call("get_order", {}).status_code == 401
    assert api.post_call("get_order", {}, customer="CUS-2").status_code == 409

    records = list(AuditRecord.objects.order_by("step"))
    assert [r.call_id for r in records] == [a["call_id"] for a in reached]
    assert [r.code for r in records] == [a["code"] for a in reached]
    assert [r.ok for r in records] == [a["ok"] for a in reached]
    assert [r.replayed for r in records] == [a["replayed"] for a in reached]
    assert [r.step for r in records] == list(range(1, 9))
    assert {(r.session_id, r.customer_id, r.policy_version) for r in records} == {
        ("s-1", "CUS-1", 1)
    }
    assert records[1].tool == "nope"
    assert records[2].arguments is None and records[2].key == ""
    assert records[4].arguments == REFUND
    assert records[4].key == records[5].key != ""
    assert records[6].confirmation_id == reached[6]["data"]["confirmation_id"]
    assert all(r.duration_ms >= 0 for r in records)
    assert ledger.state() == (1, 1000)


@pytest.mark.usefixtures("orders")
def test_the_audit_keeps_the_raw_arguments_bounded(api: AgentClient, ledger: Ledger) -> None:
    raw = '{"order_id": "' + "9" * 10_000 + '"}'

    result = api.call("get_order", raw)

    assert result["code"] == "INVALID_JSON"
    record = AuditRecord.objects.get()
    assert record.raw_arguments == raw[:4096]
    assert ledger.rows() == 0


@pytest.fixture
def audited(make_agent: MakeAgent) -> AuditRecord:
    agent: Agent = make_agent()[0]
    call_dispatch(
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        tool="get_order",
        arguments={"order_id": "ORD-1"},
    )
    return AuditRecord.objects.get()


append_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's"
)


@append_only
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE dispatch_auditrecord SET code = 'OK', ok = true WHERE id = %s",
        "UPDATE dispatch_auditrecord SET message = message WHERE id = %s",
        "DELETE FROM dispatch_auditrecord WHERE id = %s",
    ],
    ids=["a forged outcome", "a no-op update", "a delete"],
)
def test_the_database_refuses_to_change_or_remove_an_audit_record(
    audited: AuditRecord, statement: str
) -> None:
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [audited.pk])

    kept = AuditRecord.objects.get(pk=audited.pk)
    assert (kept.code, kept.ok, kept.message) == (audited.code, audited.ok, audited.message)


@append_only
def test_the_orm_cannot_change_or_remove_an_audit_record_either(audited: AuditRecord) -> None:
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditRecord.objects.filter(pk=audited.pk).update(code="OK")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditRecord.objects.filter(pk=audited.pk).delete()

    assert AuditRecord.objects.get(pk=audited.pk).code == audited.code


@append_only
def test_records_can_still_be_appended(audited: AuditRecord, make_agent: MakeAgent) -> None:
    agent = Agent.objects.get(pk=audited.agent_id)
    call_dispatch(
        agent=agent,
        session_id="s-1",
        customer_id="CUS-1",
        tool="get_order",
        arguments={"order_id": "ORD-2"},
    )

    assert AuditRecord.objects.count() == 2
