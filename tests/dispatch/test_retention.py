"""The retention of idempotency records and sessions (dispatch/retention.py, docs/retention.md).

Calls go through the pipeline (call_dispatch) as an agent's do; the prune runs as if days had
passed (`now`), or, where a call races it on PostgreSQL, on rows aged by hand."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from dispatch.models import (
    CONFIRMATION_FINAL,
    Agent,
    Confirmation,
    IdempotencyRecord,
    Session,
)
from dispatch.pipeline.results import CallResult
from dispatch.retention import (
    prune_cutoffs,
    records_prune,
    session_keys_delete,
    sessions_delete,
)
from dispatch.services import call_dispatch
from dispatch.tasks import records_prune_task
from tests.conftest import MakeAgent, confirmation_rewrite

pytestmark = pytest.mark.usefixtures("orders")

ROOT = Path(__file__).resolve().parents[2]
KEEP = timedelta(days=7)
LATER = KEEP + timedelta(days=1)
# Every confirmation status that still decides whether its key's effect happens.
LIVE = ["pending", "approved", "executing", "unknown"]


@pytest.fixture
def agent(make_agent: MakeAgent) -> Agent:
    return make_agent(step_budget=50)[0]


def refund(
    agent: Agent, amount_cents: int, *, session: str = "s-1", customer: str = "CUS-1"
) -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id=customer,
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


def read(agent: Agent, *, session: str = "s-1", customer: str = "CUS-1") -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id=customer,
        tool="get_order",
        arguments=json.dumps({"order_id": "ORD-1001"}),
    )


def later(**options: Any) -> Any:
    """The prune as it runs once the keep time has passed."""
    return records_prune(now=timezone.now() + LATER, **options)


def keys(agent: Agent, session: str = "s-1") -> set[str]:
    return set(
        IdempotencyRecord.objects.filter(agent=agent, session_id=session).values_list(
            "key", flat=True
        )
    )


def held(agent: Agent, amount_cents: int = 6_000) -> Confirmation:
    result = refund(agent, amount_cents)
    assert result.code == "CONFIRMATION_REQUIRED", result.message
    return Confirmation.objects.get(pk=result.data["confirmation_id"])


@pytest.mark.django_db
@pytest.mark.parametrize("status", LIVE)
def test_the_key_of_a_confirmation_not_final_is_kept_whatever_its_age_and_so_is_its_session(
    agent: Agent, status: str
) -> None:
    confirmation = held(agent)
    if status != "pending":
        confirmation_rewrite(confirmation.pk, status=status)
    assert read(agent).ok
    settled = keys(agent) - {confirmation.key}

    pruned = later()

    # The read's key goes; the held one's stays, and its session with it.
    assert keys(agent) == {confirmation.key}
    assert pruned.keys == len(settled) == 1
    assert pruned.sessions == 0
    assert Session.objects.filter(agent=agent, session_id="s-1").exists()


@pytest.mark.django_db
def test_an_approved_call_resent_after_the_keep_time_gets_its_confirmation_not_a_second(
    agent: Agent,
) -> None:
    confirmation = held(agent)
    confirmation_rewrite(confirmation.pk, status="approved")

    later()
    again = refund(agent, 6_000)

    assert again.code == "CONFIRMATION_REQUIRED"
    assert again.data["confirmation_id"] == confirmation.pk
    assert Confirmation.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("status", sorted(CONFIRMATION_FINAL))
def test_a_final_confirmations_key_goes_after_the_keep_time_with_its_session(
    agent: Agent, status: str
) -> None:
    confirmation = held(agent)
    confirmation_rewrite(confirmation.pk, status=status)

    pruned = later()

    assert keys(agent) == set()
    assert pruned.sessions == 1
    assert not Session.objects.filter(agent=agent, session_id="s-1").exists()
    # The confirmation is the reviewers' record: it stays.
    assert Confirmation.objects.filter(pk=confirmation.pk).exists()


@pytest.mark.django_db
def test_young_keys_and_sessions_are_kept(agent: Agent) -> None:
    assert refund(agent, 1_000).code == "OK"
    assert read(agent).ok
    before = keys(agent)

    pruned = records_prune(now=timezone.now() + KEEP - timedelta(minutes=1))

    assert (pruned.keys, pruned.sessions) == (0, 0)
    assert keys(agent) == before
    assert Session.objects.filter(agent=agent, session_id="s-1").exists()


@pytest.mark.django_db
def test_a_session_past_its_keep_time_stays_while_one_of_its_keys_is_young(agent: Agent) -> None:
    assert refund(agent, 1_000).code == "OK"
    # Its last call long ago, its key settled since (a held call decided yesterday, say).
    Session.objects.filter(agent=agent).update(last_call_at=timezone.now() - LATER)

    pruned = records_prune()

    assert pruned.sessions == 0
    assert len(keys(agent)) == 1


@pytest.mark.django_db
def test_a_key_whose_outcome_is_unknown_is_kept_whatever_its_age(agent: Agent) -> None:
    assert refund(agent, 1_000).code == "OK"
    (key,) = keys(agent)
    IdempotencyRecord.objects.filter(key=key).update(status="unknown")

    pruned = later()

    assert keys(agent) == {key}
    assert pruned.sessions == 0


@pytest.mark.django_db
def test_a_session_and_its_keys_go_together_in_batches(agent: Agent) -> None:
    for n in range(5):
        session = f"s-{n}"
        assert refund(agent, 100 + n, session=session).ok
        assert read(agent, session=session).ok
    # One key the key pass would keep, young: the session pass deletes it with its session.
    IdempotencyRecord.objects.filter(session_id="s-0").update(updated_at=timezone.now() + LATER)
    Session.objects.filter(session_id="s-0").update(last_call_at=timezone.now() - LATER)
    seen: list[tuple[str, int, int]] = []

    dry = later(batch=2, dry_run=True, progress=lambda *p: seen.append(p))
    assert (dry.keys, dry.sessions) == (8, 4)
    assert IdempotencyRecord.objects.count() == 10

    pruned = records_prune(now=timezone.now() + LATER * 2, batch=2)

    assert (pruned.keys, pruned.sessions) == (10, 5)
    assert (IdempotencyRecord.objects.count(), Session.objects.count()) == (0, 0)
    # Ten keys and five sessions, two rows a slice: six slices and three.
    assert [p[:2] for p in seen if p[0] == "sessions"] == [("sessions", n) for n in (1, 2, 3)]
    assert len([p for p in seen if p[0] == "idempotency records"]) == 6


@pytest.mark.django_db
def test_the_command_says_what_it_would_delete_then_deletes_it(agent: Agent) -> None:
    assert refund(agent, 1_000).code == "OK"
    Session.objects.update(last_call_at=timezone.now() - LATER)
    IdempotencyRecord.objects.update(updated_at=timezone.now() - LATER)

    dry = io.StringIO()
    call_command("prune_records", "--dry-run", stdout=dry)
    assert "dry run: nothing is deleted" in dry.getvalue()
    assert "Would delete 1 idempotency record(s) and 1 session(s)." in dry.getvalue()
    assert IdempotencyRecord.objects.count() == 1

    out = io.StringIO()
    call_command("prune_records", stdout=out)
    assert "sessions: 1 slice(s) walked, 1 deleted" in out.getvalue()
    assert "Deleted 1 idempotency record(s) and 1 session(s)" in out.getvalue()
    assert (IdempotencyRecord.objects.count(), Session.objects.count()) == (0, 0)


@pytest.mark.django_db
def test_beat_runs_the_retention(agent: Agent) -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE["prune-records"]
    assert schedule["task"] == f"{records_prune_task.__module__}.{records_prune_task.__name__}"
    assert refund(agent, 1_000).code == "OK"
    Session.objects.update(last_call_at=timezone.now() - LATER)
    IdempotencyRecord.objects.update(updated_at=timezone.now() - LATER)

    assert records_prune_task.delay().get() == {"keys": 1, "sessions": 1}


@pytest.mark.django_db
@pytest.mark.parametrize("customer", ["CUS-1", "CUS-2"])
def test_a_pruned_session_id_used_again_starts_afresh_and_its_chain_still_verifies(
    agent: Agent, customer: str
) -> None:
    first = refund(agent, 1_000)
    assert first.code == "OK"
    assert read(agent).ok
    Session.objects.update(last_call_at=timezone.now() - LATER)
    IdempotencyRecord.objects.update(updated_at=timezone.now() - LATER)
    assert records_prune().sessions == 1

    again = refund(agent, 1_000, customer=customer)

    # Never the first customer's answer: the same customer's identical call is a new call, and
    # another's is judged for that customer (ORD-1001 is not CUS-2's).
    assert not again.replayed
    assert again.code == ("OK" if customer == "CUS-1" else "ORDER_NOT_FOUND")
    session = Session.objects.get(agent=agent, session_id="s-1")
    assert (session.customer_id, session.steps) == (customer, 1)
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert "OK: every chain holds" in out.getvalue()
    assert "3 records walked" in out.getvalue()


@pytest.mark.parametrize(
    ("name", "seconds", "key_hours"),
    [
        ("TOOLGATE_IDEMPOTENCY_KEEP_SECONDS", 23 * 3600, 24),
        ("TOOLGATE_SESSION_KEEP_SECONDS", 3600, 24),
        ("TOOLGATE_SESSION_KEEP_SECONDS", 36 * 3600, 48),
    ],
)
def test_a_keep_time_below_the_promised_day_or_the_hosts_keys_refuses_to_start(
    name: str, seconds: int, key_hours: int
) -> None:
    env = {
        **os.environ,
        name: str(seconds),
        "TOOLGATE_IDEMPOTENCY_KEY_HOURS": str(key_hours),
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.test",
    }
    completed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode != 0
    assert f"ImproperlyConfigured: {name} must be at least a day" in completed.stderr


# --- a call racing the prune, on PostgreSQL ----------------------------------------------------

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="SQLite runs one writer at a time: a call and a prune cannot interleave there",
)


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """work() on a thread of its own, with a database connection of its own."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # reported to the test
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def value(thread: threading.Thread, outcome: dict[str, Any]) -> Any:
    thread.join(30)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def waiting_on_a_lock(count: int, timeout: float = 10.0) -> None:
    """Until `count` backends of this database wait on a row lock."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    while timezone.now() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
        threading.Event().wait(0.02)
    raise AssertionError(f"{count} backend(s) never waited on a lock")


def aged(agent: Agent) -> None:
    """The session's last call and its keys past their keep time."""
    long_ago = timezone.now() - LATER
    Session.objects.filter(agent=agent).update(last_call_at=long_ago)
    IdempotencyRecord.objects.filter(agent=agent).update(updated_at=long_ago)


@pytest.fixture
def first_refund(agent: Agent) -> Iterator[CallResult]:
    result = refund(agent, 1_000)
    assert result.code == "OK"
    aged(agent)
    yield result


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_call_arriving_while_its_session_is_deleted_waits_and_opens_a_new_one(
    agent: Agent, first_refund: CallResult
) -> None:
    deleted = threading.Event()
    go = threading.Event()

    def prune() -> tuple[int, int]:
        with transaction.atomic(), connection.cursor() as cursor:
            params = {**prune_cutoffs(timezone.now()), "after": 0}
            gone = sessions_delete(cursor, params)
            deleted.set()
            # The session's row is deleted and its keys not yet: a call must not see this.
            go.wait(10)
            return len(gone), session_keys_delete(cursor, gone)

    pruner = in_thread(prune)
    assert deleted.wait(10)
    # Another customer sends the very call the first customer's session answered.
    caller = in_thread(lambda: refund(agent, 1_000, customer="CUS-2"))
    waiting_on_a_lock(1)
    go.set()

    assert value(*pruner) == (1, 1)
    result = value(*caller)
    assert not result.replayed
    assert result.code == "ORDER_NOT_FOUND"
    session = Session.objects.get(agent=agent, session_id="s-1")
    assert (session.customer_id, session.steps) == ("CUS-2", 1)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_prune_arriving_while_a_call_runs_in_its_session_waits_and_keeps_it(
    agent: Agent, first_refund: CallResult
) -> None:
    inside = threading.Event()
    go = threading.Event()

    def hold_the_call(result: CallResult) -> None:
        inside.set()
        go.wait(10)

    # The identical refund, resent: it replays, in its own transaction, which stays open.
    caller = in_thread(
        lambda: call_dispatch(
            agent=agent,
            session_id="s-1",
            customer_id="CUS-1",
            tool="refund_order",
            arguments=json.dumps(
                {
                    "order_id": "ORD-1001",
                    "amount_cents": 1_000,
                    "currency": "BRL",
                    "reason": "damaged",
                }
            ),
            on_result=hold_the_call,
        )
    )
    assert inside.wait(10)
    pruner = in_thread(records_prune)
    waiting_on_a_lock(1)
    go.set()

    result = value(*caller)
    pruned = value(*pruner)
    assert result.replayed
    assert (pruned.keys, pruned.sessions) == (0, 0)
    session = Session.objects.get(agent=agent, session_id="s-1")
    assert session.steps == 2
    assert len(keys(agent)) == 1
    # The replay keeps answering afterwards.
    assert refund(agent, 1_000).replayed
