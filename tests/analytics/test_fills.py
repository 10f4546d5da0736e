"""The rollups filled from what is recorded: calls from the audit records, decisions from the
confirmations' event log, each fill one transaction that moves its fill state, up to the first
call within the lag; a half-filled state refilled whole; the check that compares."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

# The module, not the task: pytest looks at every name of a test module while collecting, and
# looking at a task binds it to Celery's app then, before the worker tests set theirs up.
from analytics import tasks
from analytics.fills import CALLS, DECISIONS, rollups_fill
from analytics.models import (
    CallRollup,
    DecisionRollup,
    FillProgress,
    FillState,
    PendingRecovery,
)
from analytics.rollups import audit_in_session_order, rollups_live, rollups_rebuilt
from approvals.services import confirmation_reject
from dispatch.models import Agent, AuditRecord, Confirmation
from dispatch.services import _pipeline, call_dispatch
from tests.conftest import MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

GOOD_READ = {"order_id": "ORD-1001"}
BAD_READ = {"order_id": 1001}  # INVALID_ARGUMENTS, which the model can fix
HELD_REFUND = {
    "order_id": "ORD-1001",
    "currency": "BRL",
    "reason": "damaged",
    "amount_cents": 9_000,
}
NOW = timedelta(0)


def send(agent: Agent, session: str, arguments: object, tool: str = "get_order") -> str:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool=tool,
        arguments=json.dumps(arguments),
    ).code


def counted(code: str) -> list[int]:
    """calls, replayed, correctable, recovered of get_order's rows with `code`."""
    totals = [0, 0, 0, 0]
    for row in CallRollup.objects.filter(tool="get_order", code=code):
        for index, value in enumerate((row.calls, row.replayed, row.correctable, row.recovered)):
            totals[index] += value
    return totals


def state(name: str) -> FillState:
    return FillState.objects.get(property=name)


def test_a_call_writes_no_rollup_and_a_fill_counts_it(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)
    unfilled = CallRollup.objects.count()

    filled = rollups_fill(lag=NOW)

    assert unfilled == 0
    assert filled.calls == 1
    assert counted("OK") == [1, 0, 0, 0]
    assert state(CALLS).last_id == AuditRecord.objects.get().pk


def test_a_fix_after_a_fill_recovers_the_rejection_the_fill_left_waiting(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", BAD_READ)
    rollups_fill(lag=NOW)
    waiting = PendingRecovery.objects.count()
    send(agent, "s-1", GOOD_READ)

    rollups_fill(lag=NOW)

    assert waiting == 1
    assert counted("INVALID_ARGUMENTS") == [1, 0, 1, 1]
    assert not PendingRecovery.objects.exists()


def test_a_fill_stops_at_the_first_call_within_the_lag_and_the_next_counts_the_rest(
    make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, _ = make_agent()
    now = timezone.now()
    moment = now - timedelta(minutes=5)
    monkeypatch.setattr(_pipeline(), "clock", lambda: moment)
    send(agent, "s-1", GOOD_READ)  # 5 minutes ago
    moment = now
    send(agent, "s-2", GOOD_READ)  # now: may still be committing elsewhere
    moment = now - timedelta(minutes=5)
    send(agent, "s-3", GOOD_READ)  # 5 minutes ago, written after: waits behind the one before
    first = AuditRecord.objects.order_by("id").first()
    assert first is not None

    within_lag = rollups_fill(lag=timedelta(minutes=1))
    then = state(CALLS).last_id
    later = rollups_fill(lag=NOW)

    assert (within_lag.calls, later.calls) == (1, 2)
    assert then == first.pk
    assert counted("OK")[0] == 3


def test_the_figures_read_the_calls_no_fill_has_counted_yet(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", BAD_READ)
    rollups_fill(lag=NOW)
    send(agent, "s-1", GOOD_READ)
    client = manager_client()

    total = client.get("/api/v1/metrics", {"agent": str(agent.pk)}).json()["calls"]["total"]

    assert (total["calls"], total["correctable"], total["recovered"]) == (2, 1, 1)


def test_a_fill_that_fails_counts_nothing_and_the_next_counts_once(
    make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the process died here")

    with monkeypatch.context() as patched:
        patched.setattr("analytics.fills._advance", fail)
        with pytest.raises(RuntimeError):
            rollups_fill(lag=NOW)
    after_failure = (CallRollup.objects.count(), FillState.objects.filter(last_id__gt=0).count())
    rollups_fill(lag=NOW)

    assert after_failure == (0, 0)
    assert counted("OK") == [1, 0, 0, 0]


def test_a_half_filled_state_is_refilled_whole_from_the_records(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", BAD_READ)
    send(agent, "s-1", GOOD_READ)
    rollups_fill(lag=NOW)
    # As the release before left them: a call its own statement counted after the migration.
    row = CallRollup.objects.get(code="OK")
    CallRollup.objects.filter(pk=row.pk).update(calls=row.calls + 1)
    FillState.objects.update(state=FillProgress.STARTED)

    rollups_fill(lag=NOW)

    assert rollups_live() == rollups_rebuilt(audit_in_session_order())[0]
    assert {s.state for s in FillState.objects.all()} == {FillProgress.DONE}


def test_the_check_finds_a_row_the_fills_did_not_count_so(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)
    rollups_fill(lag=NOW)
    CallRollup.objects.update(calls=2)

    with pytest.raises(CommandError, match="1 rollup rows differ"):
        call_command("rebuild_rollups", "--check")


def test_decisions_are_counted_from_the_event_log_not_by_the_decision(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", HELD_REFUND, tool="refund_order")
    rita = User.objects.create_user("rita")
    confirmation_reject(
        confirmation_id=Confirmation.objects.get().pk, reviewer=rita, reason="Not returned."
    )
    before = DecisionRollup.objects.count()

    filled = rollups_fill(lag=NOW)

    assert before == 0
    assert filled.events is not None and filled.events >= 1
    assert list(DecisionRollup.objects.values_list("decided_by", "decisions")) == [("rita", 1)]
    assert state(DECISIONS).state == FillProgress.DONE


def test_beat_fills_every_minute_and_leaves_a_call_within_the_lag_to_a_later_fill(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)
    entry = settings.CELERY_BEAT_SCHEDULE["fill-rollups"]

    result = tasks.rollups_fill_task.delay().get()

    assert (entry["task"], entry["schedule"]) == ("analytics.tasks.rollups_fill_task", 60.0)
    assert result == {"calls": 0, "events": 0}


def test_the_dashboard_says_how_fresh_its_rollups_are(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)
    client = manager_client()
    unfilled = client.get("/analytics/").content.decode()
    rollups_fill(lag=NOW)

    filled = client.get("/analytics/").content.decode()

    assert "No fill of the rollups has run yet" in unfilled
    assert "Counted from the rollups up to" in filled
    assert client.get("/api/v1/metrics").json()["rollups"]["filled_at"] is not None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL: row locks")
@pytest.mark.django_db(transaction=True)
def test_a_fill_finding_another_at_work_leaves_it_the_state(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", GOOD_READ)
    rollups_fill(lag=NOW)
    send(agent, "s-1", GOOD_READ)
    holding, done = threading.Event(), threading.Event()

    def other_fill() -> None:
        try:
            with transaction.atomic():
                FillState.objects.select_for_update().filter(property=CALLS).get()
                holding.set()
                done.wait(timeout=30)
        finally:
            connection.close()

    thread = threading.Thread(target=other_fill)
    thread.start()
    holding.wait(timeout=30)
    try:
        skipped = rollups_fill(lag=NOW)
    finally:
        done.set()
        thread.join(timeout=30)
    afterwards = rollups_fill(lag=NOW)

    assert skipped.calls is None
    assert afterwards.calls == 1
    assert counted("OK")[0] == 2


def manager_client() -> Client:
    user = User.objects.create_user(f"max-{timezone.now().timestamp()}", password="pw")
    user.groups.add(Group.objects.get_or_create(name="managers")[0])
    client = Client()
    client.force_login(user)
    return client
