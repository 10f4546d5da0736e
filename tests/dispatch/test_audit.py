"""The audit records' chains: tampered with as the database's owner would, and found by
`manage.py verify_audit`; sealed and written out; calls of different sessions never waiting on
each other's chain."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from pytest_django import Settings

from dispatch import tasks
from dispatch.audit import audit_seal
from dispatch.audit_keys import audit_mac
from dispatch.models import Agent, AuditRecord, AuditSeal, IdempotencyRecord, Movement
from dispatch.pipeline.audit_chain import AUDIT_FIELDS, GENESIS, audit_chain, covered, link_hash
from dispatch.services import call_dispatch
from dispatch.store import backends
from orders.models import Order
from tests.conftest import MakeAgent

POSTGRESQL = connection.vendor == "postgresql"
Capture = Callable[..., Any]


@contextmanager
def as_owner(table: str) -> Iterator[CursorWrapper]:
    """A cursor of the tables' owner, who may set the append-only trigger aside."""
    with connection.cursor() as cursor:
        if POSTGRESQL:
            # The test's rows are still being checked at its commit: checked now instead.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        yield cursor
        if POSTGRESQL:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def verify(*arguments: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("verify_audit", *arguments, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue()
    return 0, out.getvalue()


def read(agent: Agent, session: str = "s-1") -> None:
    result = call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="get_order",
        arguments=json.dumps({"order_id": "ORD-1001"}),
    )
    assert result.ok, result.message


def refund(agent: Agent, session: str = "s-1", amount_cents: int = 500) -> None:
    result = call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="refund_order",
        arguments=json.dumps(
            {
                "order_id": "ORD-1001",
                "amount_cents": amount_cents,
                "currency": "BRL",
                "reason": "damaged",
            }
        ),
    )
    assert result.ok, result.message


@pytest.fixture
def audited(make_agent: MakeAgent, orders: dict[str, Order]) -> Agent:
    """Two sessions of one agent: five calls in s-1 (reads, a refund, a refusal), two in s-2."""
    agent, _ = make_agent()
    read(agent)
    refund(agent)
    read(agent)
    call_dispatch(
        agent=agent, session_id="s-1", customer_id="CUS-1", tool="get_order", arguments="{"
    )
    read(agent)
    read(agent, "s-2")
    refund(agent, "s-2", 300)
    return agent


def chain(agent: Agent, session: str = "s-1") -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(agent=agent, session_id=session).order_by("chain_seq"))


def test_every_call_is_the_next_link_of_its_session(audited: Agent) -> None:
    records = chain(audited)

    assert [record.chain_seq for record in records] == [1, 2, 3, 4, 5]
    previous = GENESIS
    for record in records:
        fields = covered(AUDIT_FIELDS, AuditRecord.objects.filter(pk=record.pk).values().get())
        expected = link_hash(
            chain=audit_chain(audited.pk, "s-1"),
            seq=record.chain_seq or 0,
            previous=previous,
            fields=fields,
        )
        assert record.chain_hash == expected
        previous = expected


def test_a_clean_audit_verifies(audited: Agent) -> None:
    code, out = verify()

    assert code == 0, out
    assert "2 chains, 7 records walked" in out
    assert "OK: every chain holds" in out


def test_it_names_the_record_whose_field_the_owner_changed(audited: Agent) -> None:
    target = chain(audited)[1]
    with as_owner("dispatch_auditrecord") as cursor:
        cursor.execute(
            "UPDATE dispatch_auditrecord SET ok = false, code = 'REFUSED' WHERE id = %s",
            [target.pk],
        )

    code, out = verify()

    assert code == 1
    assert (
        f"ALTERED audit:{audited.pk}:s-1 seq 2 (record {target.pk}): its fields or hash do not "
        "match its chain" in out
    )
    assert out.count("ALTERED") == 1


def test_it_names_the_gap_of_a_record_the_owner_deleted(audited: Agent) -> None:
    records = chain(audited)
    with as_owner("dispatch_auditrecord") as cursor:
        cursor.execute("DELETE FROM dispatch_auditrecord WHERE id = %s", [records[2].pk])

    code, out = verify()

    assert code == 1
    assert (
        f"REMOVED audit:{audited.pk}:s-1 seq 3 (record {records[3].pk}): seq 3 missing before "
        "this one" in out
    )


def test_a_second_record_at_a_place_is_refused_and_named_when_the_owner_forces_it(
    audited: Agent,
) -> None:
    copied: dict[str, Any] = dict(
        AuditRecord.objects.filter(pk=chain(audited)[1].pk).values().get()
    )
    copied.pop("id")
    forged = {**copied, "call_id": "f" * 32, "code": "OK", "message": "Refunded twice."}
    with pytest.raises(IntegrityError), transaction.atomic():
        AuditRecord.objects.create(**forged)
    if not POSTGRESQL:
        return  # SQLite keeps the unique constraint inside its table: no owner sets it aside.
    with as_owner("dispatch_auditrecord") as cursor:
        cursor.execute("ALTER TABLE dispatch_auditrecord DROP CONSTRAINT audit_chain_place")
        inserted = AuditRecord.objects.create(**forged)

    code, out = verify()

    assert code == 1
    assert f"INSERTED audit:{audited.pk}:s-1 seq 2 (record {inserted.pk})" in out


def test_a_record_inserted_outside_any_chain_is_named(audited: Agent) -> None:
    copied: dict[str, Any] = dict(
        AuditRecord.objects.filter(pk=chain(audited, "s-2")[0].pk).values().get()
    )
    copied.pop("id")
    inserted = AuditRecord.objects.create(
        **{**copied, "call_id": "e" * 32, "chain_seq": None, "chain_hash": ""}
    )

    code, out = verify()

    assert code == 1
    assert f"INSERTED audit:{audited.pk}:s-2 no seq (record {inserted.pk})" in out


def test_the_last_records_deleted_after_a_seal_are_found_against_the_seal_written_out(
    audited: Agent,
    settings: Settings,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = ["log", f"file:{seals}"]
    with django_capture_on_commit_callbacks(execute=True):
        audit_seal()
    records = chain(audited)
    # The owner deletes the session's last two records: its head is now the third.
    with as_owner("dispatch_auditrecord") as cursor:
        cursor.execute(
            "DELETE FROM dispatch_auditrecord WHERE id IN (%s, %s)",
            [records[3].pk, records[4].pk],
        )

    alone, _ = verify()
    code, out = verify("--seals", str(seals))

    # Without the seal, a chain cut short looks whole.
    assert alone == 0
    assert code == 1
    assert "seals: 1 in" in out and "2 chains sealed" in out
    assert (
        f"REMOVED audit:{audited.pk}:s-1 seq 4 (no record): sealed at seq 5, the chain now ends "
        "at seq 3" in out
    )


def test_a_chain_rewritten_whole_after_a_seal_is_found_against_it(
    audited: Agent,
    settings: Settings,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = [f"file:{seals}"]
    with django_capture_on_commit_callbacks(execute=True):
        audit_seal()
    # The owner, holding the audit key too, changes a record and computes every later hash and
    # MAC again: only the seal written out tells.
    name, previous = audit_chain(audited.pk, "s-2"), GENESIS
    with as_owner("dispatch_auditrecord"):
        for record in chain(audited, "s-2"):
            fields = covered(AUDIT_FIELDS, AuditRecord.objects.filter(pk=record.pk).values().get())
            if record.chain_seq == 2:
                fields["message"] = "Nothing was refunded."
            previous = link_hash(
                chain=name, seq=record.chain_seq or 0, previous=previous, fields=fields
            )
            AuditRecord.objects.filter(pk=record.pk).update(
                message=fields["message"], chain_hash=previous, chain_mac=audit_mac(previous)
            )

    alone, _ = verify()
    code, out = verify("--seals", str(seals))

    assert alone == 0
    assert code == 1
    assert f"ALTERED audit:{audited.pk}:s-2 seq 2 (no record): the chain was rewritten" in out


def test_a_seal_changed_in_its_file_or_in_the_database_is_found(
    audited: Agent,
    settings: Settings,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    seals = tmp_path / "seals.jsonl"
    settings.TOOLGATE_AUDIT_SEAL_SINKS = [f"file:{seals}"]
    with django_capture_on_commit_callbacks(execute=True):
        audit_seal()
        read(audited, "s-3")
        audit_seal()
    lines = seals.read_text().splitlines()
    first = json.loads(lines[0])
    first["heads"][0][1] = 4
    seals.write_text(json.dumps(first) + "\n" + lines[1] + "\n")
    AuditSeal.objects.filter(number=2).update(hash="0" * 64)

    code, out = verify("--seals", str(seals))

    assert code == 1
    assert "seal 1 (line 1) does not match its hash" in out
    assert "the database's seal 2 is not the one written out" in out


def test_a_seal_names_the_chains_that_moved_since_the_last(
    audited: Agent,
    settings: Settings,
    django_capture_on_commit_callbacks: Capture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.TOOLGATE_AUDIT_SEAL_SINKS = ["log"]
    with django_capture_on_commit_callbacks(execute=True):
        first = audit_seal()
    read(audited, "s-2")
    caplog.clear()
    with (
        caplog.at_level("INFO", logger="toolgate.audit.seal"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        second = audit_seal()
    s2 = chain(audited, "s-2")[-1]

    assert [head[0] for head in first.heads] == [
        audit_chain(audited.pk, "s-1"),
        audit_chain(audited.pk, "s-2"),
    ]
    assert second.previous == first.hash
    # Every chain that moved within the overlap is named again; s-2 with its new head.
    assert [audit_chain(audited.pk, "s-2"), s2.chain_seq, s2.chain_hash] in second.heads
    [line] = [record.getMessage() for record in caplog.records]
    assert json.loads(line)["hash"] == second.hash


def test_the_seal_command_and_a_bad_path_for_the_verifier(audited: Agent) -> None:
    out = StringIO()
    call_command("seal_audit", stdout=out)

    assert out.getvalue().startswith("seal 1: 2 chains, ")
    with pytest.raises(CommandError, match="cannot read the seals"):
        call_command("verify_audit", "--seals", "/nonexistent/seals.jsonl", stdout=StringIO())


postgresql_only = pytest.mark.skipif(
    not POSTGRESQL, reason="SQLite lets one writer at a time: sessions racing need PostgreSQL"
)


def _in_thread(work: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    return threading.Thread(target=run)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_reads_racing_in_one_session_keep_one_chain(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent, _ = make_agent(step_budget=500, repeat_limit=500)
    read(agent)
    errors: list[BaseException] = []

    def reads() -> None:
        for _ in range(15):
            read(agent)

    threads = [_in_thread(reads, errors) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert [record.chain_seq for record in chain(agent)] == list(range(1, 62))
    code, out = verify()
    assert code == 0, out


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_write_whose_place_a_read_took_links_again_and_commits_once(
    make_agent: MakeAgent, orders: dict[str, Order], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read of the session passes its opening (the head it links to is read) and waits before
    # its record; a refund of the same session then opens on the same head and, before its last
    # statement, lets the read append: the refund's record finds its place taken as it commits.
    agent, _ = make_agent()
    read(agent)
    read_opened, refund_ending, read_recorded = (threading.Event() for _ in range(3))
    ends: list[tuple[bool, bool]] = []
    original = backends.PostgreSQL.end_call

    def end_call(
        self: backends.PostgreSQL, *args: Any, commit: bool = False, **kwargs: Any
    ) -> bool:
        if commit:
            refund_ending.set()
            read_recorded.wait(10)
        else:
            read_opened.set()
            refund_ending.wait(10)
        linked = original(self, *args, commit=commit, **kwargs)
        ends.append((commit, linked))
        if not commit:
            read_recorded.set()
        return linked

    monkeypatch.setattr(backends.PostgreSQL, "end_call", end_call)
    errors: list[BaseException] = []
    reader = _in_thread(lambda: read(agent), errors)
    reader.start()
    read_opened.wait(10)
    refund(agent, amount_cents=700)
    reader.join(15)

    assert errors == []
    # The read appended first; the refund's last statement found its place taken and went back
    # to its savepoint, then linked again and committed with its scope: one record, one
    # movement, one ledger row.
    assert ends == [(False, True), (True, False), (False, True)]
    records = chain(agent)
    assert [record.chain_seq for record in records] == [1, 2, 3]
    assert [record.tool for record in records] == ["get_order", "get_order", "refund_order"]
    assert Movement.objects.filter(amount_cents=700).count() == 1
    assert orders["ORD-1001"].refunds.filter(amount_cents=700).count() == 1
    code, out = verify()
    assert code == 0, out


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_call_never_waits_on_another_sessions_chain(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    agent, _ = make_agent()
    read(agent, "s-A")
    moved = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []
    answered: list[str] = []

    def holds_its_chain() -> None:
        # A write of s-A (CUS-1) that has recorded its call and not committed yet.
        with transaction.atomic():
            refund(agent, "s-A")
            moved.set()
            release.wait(10)

    def other_session() -> None:
        moved.wait(10)
        with connection.cursor() as cursor:
            # Waiting on a row of s-A's would fail this call rather than hang the test.
            cursor.execute("SET lock_timeout = '2s'")
        for arguments in (
            {"order_id": "ORD-1002"},
            {"order_id": "ORD-1002", "amount_cents": 300, "currency": "USD", "reason": "damaged"},
        ):
            result = call_dispatch(
                agent=agent,
                session_id="s-B",
                customer_id="CUS-2",
                tool="refund_order" if "amount_cents" in arguments else "get_order",
                arguments=json.dumps(arguments),
            )
            answered.append(result.code)

    holder = _in_thread(holds_its_chain, errors)
    other = _in_thread(other_session, errors)
    holder.start()
    other.start()
    other.join(15)
    s_a_while_held = AuditRecord.objects.filter(session_id="s-A").count()
    release.set()
    holder.join(15)

    assert errors == []
    # s-B read and refunded while s-A's session was held by its uncommitted call.
    assert answered == ["OK", "OK"]
    assert s_a_while_held == 1
    assert [record.chain_seq for record in chain(agent, "s-B")] == [1, 2]
    assert [record.chain_seq for record in chain(agent, "s-A")] == [1, 2]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_write_whose_place_a_read_took_links_after_it_and_commits_once(
    make_agent: MakeAgent, orders: dict[str, Order]
) -> None:
    # A write's last statement is sent with its commit (dispatch/store/backends.py); a read of
    # its session that opened before it and records after its opening takes its place, and the
    # write goes back to its savepoint, links after the read and commits its key and money too.
    agent, _ = make_agent()
    read(agent)
    read_opened, write_opened = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def late_read() -> None:
        def record_after_the_write_opened(execute: Any, sql: str, *args: Any) -> Any:
            if "INSERT INTO dispatch_auditrecord" in sql:
                read_opened.set()
                write_opened.wait(10)
            return execute(sql, *args)

        with connection.execute_wrapper(record_after_the_write_opened):
            read(agent)

    def write() -> None:
        def opened(execute: Any, sql: str, *args: Any) -> Any:
            result = execute(sql, *args)
            if "INSERT INTO dispatch_idempotencyrecord" in sql:
                write_opened.set()
            return result

        read_opened.wait(10)
        with connection.execute_wrapper(opened):
            refund(agent)

    threads = [_in_thread(late_read, errors), _in_thread(write, errors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)

    assert errors == []
    records = chain(agent)
    assert [(record.chain_seq, record.tool) for record in records] == [
        (1, "get_order"),
        (2, "get_order"),
        (3, "refund_order"),
    ]
    key = records[2].key
    assert IdempotencyRecord.objects.get(key=key).status == "completed"
    assert Movement.objects.filter(key=key, released_at=None).count() == 1
    orders["ORD-1001"].refresh_from_db()
    assert orders["ORD-1001"].refunded_cents == 500
    code, out = verify()
    assert code == 0, out


def test_beat_seals_every_five_minutes_through_its_task(
    audited: Agent, django_capture_on_commit_callbacks: Capture
) -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["seal-audit"]

    with django_capture_on_commit_callbacks(execute=True):
        number = tasks.audit_seal_task.delay().get()

    assert (entry["task"], entry["schedule"]) == ("dispatch.tasks.audit_seal_task", 300.0)
    assert number == AuditSeal.objects.get().number == 1
