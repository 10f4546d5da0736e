"""The figures against small hand-computed cases, counted live as calls are written, and the same
after a rebuild from the audit records."""

from __future__ import annotations

import json
import threading
import zoneinfo
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.fixtures import Settings

from analytics.decisions import decision_bucket, decision_seconds
from analytics.fills import rollups_fill
from analytics.models import DecisionRollup
from analytics.recovery import recovery_rate
from analytics.replay import policy_what_if
from analytics.rollups import audit_in_session_order, rollups_live, rollups_rebuilt
from analytics.selectors import CallFigures, call_figures, confirmation_outcomes
from approvals.services import confirmation_expire, confirmation_reject
from dispatch.models import Agent, Confirmation
from dispatch.pipeline.what_if import AUTO_EXECUTED, TWO_REVIEWERS, Tally, draft_of
from dispatch.services import _pipeline, call_dispatch
from tests.conftest import MakeAgent, confirmation_rewrite

pytestmark = pytest.mark.usefixtures("orders")

GOOD_READ = {"order_id": "ORD-1001"}
BAD_READ = {"order_id": 1001}  # INVALID_ARGUMENTS, which the model can fix
UNKNOWN_ORDER = {"order_id": "ORD-9999"}  # ORDER_NOT_FOUND, which it cannot
REFUND = {"order_id": "ORD-1001", "currency": "BRL", "reason": "damaged"}
HELD_REFUND = {**REFUND, "amount_cents": 9_000}
READS = ("SELECT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")
BAD_REFUND = {**REFUND, "amount_cents": 90.0}


def send(agent: Agent, session: str, tool: str, arguments: object) -> str:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool=tool,
        arguments=json.dumps(arguments),
    ).code


def figures() -> dict[str, object]:
    """The figures of the last hours, read from the records and again after a fill: the same."""
    now = timezone.now()

    def read() -> dict[str, object]:
        return call_figures(
            since=now - timedelta(hours=2), until=now + timedelta(hours=1)
        ).as_dict()

    from_records = read()
    rollups_fill(lag=timedelta(0))
    from_rollups = read()
    assert from_rollups == from_records
    return from_rollups


def test_rejected_is_not_ok_and_not_held(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    codes = [
        send(agent, "s-1", "get_order", GOOD_READ),
        send(agent, "s-1", "get_order", BAD_READ),
        send(agent, "s-1", "refund_order", HELD_REFUND),
        send(agent, "s-1", "get_order", UNKNOWN_ORDER),
    ]

    total = figures()["total"]

    assert codes == ["OK", "INVALID_ARGUMENTS", "CONFIRMATION_REQUIRED", "ORDER_NOT_FOUND"]
    assert isinstance(total, dict)
    assert (total["calls"], total["rejected"], total["rejection_rate"]) == (4, 2, 0.5)


def test_a_fix_within_the_next_three_calls_recovers(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    send(agent, "s-1", "refund_order", BAD_REFUND)  # another tool: does not fix the read
    send(agent, "s-1", "get_order", GOOD_READ)

    by_code = figures()["by_code"]

    assert isinstance(by_code, dict)
    assert by_code["INVALID_ARGUMENTS"]["correctable"] == 2
    assert by_code["INVALID_ARGUMENTS"]["recovered"] == 1
    assert by_code["INVALID_ARGUMENTS"]["recovery_rate"] == 0.5


def test_a_fix_after_three_other_calls_does_not_count(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    for _ in range(3):
        send(agent, "s-1", "refund_order", BAD_REFUND)
    send(agent, "s-1", "get_order", GOOD_READ)

    by_tool = figures()["by_tool"]

    assert isinstance(by_tool, dict)
    assert by_tool["get_order"]["correctable"] == 1
    assert by_tool["get_order"]["recovered"] == 0


def test_a_fix_in_another_session_does_not_count(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "get_order", BAD_READ)
    send(agent, "s-2", "get_order", GOOD_READ)

    total = figures()["total"]

    assert isinstance(total, dict)
    assert (total["correctable"], total["recovered"]) == (1, 0)


def test_a_fix_held_for_confirmation_counts(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    send(agent, "s-1", "refund_order", BAD_REFUND)
    code = send(agent, "s-1", "refund_order", HELD_REFUND)

    by_tool = figures()["by_tool"]

    assert code == "CONFIRMATION_REQUIRED"
    assert isinstance(by_tool, dict)
    assert by_tool["refund_order"]["recovery_rate"] == 1.0


def test_a_rejection_the_model_cannot_fix_is_not_in_the_denominator(
    make_agent: MakeAgent,
) -> None:
    agent, _ = make_agent(allowed_tools=["get_order"])
    code = send(agent, "s-1", "refund_order", HELD_REFUND)
    send(agent, "s-1", "get_order", GOOD_READ)

    total = figures()["total"]

    assert code == "TOOL_NOT_ALLOWED"
    assert isinstance(total, dict)
    assert (total["rejected"], total["correctable"], total["recovery_rate"]) == (1, 0, None)


def test_loops_replays_and_step_limits_are_counted_per_tool(make_agent: MakeAgent) -> None:
    agent, _ = make_agent(step_budget=6, repeat_limit=2)
    small = {**HELD_REFUND, "amount_cents": 1_000}
    for _ in range(3):
        send(agent, "s-1", "refund_order", small)  # OK, replayed, LOOP_DETECTED
    for order_id in ("ORD-1001", "ORD-1002", "ORD-9999", "ORD-1003"):
        # Three within the budget of 6 steps, then STEP_LIMIT.
        send(agent, "s-1", "get_order", {"order_id": order_id})

    result = figures()

    assert result["replays_by_tool"] == {"get_order": 0, "refund_order": 1}
    assert result["loop_detections_by_tool"] == {"refund_order": 1}
    assert result["step_limits_by_tool"] == {"get_order": 1}


def test_the_rebuild_agrees_with_the_live_rollups(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    reviewer = User.objects.create_user("rita")
    for session, amount in (("s-1", 9_000), ("s-2", 9_500)):
        send(agent, session, "get_order", BAD_READ)
        send(agent, session, "refund_order", BAD_REFUND)
        send(agent, session, "get_order", GOOD_READ)
        send(agent, session, "refund_order", {**HELD_REFUND, "amount_cents": amount})
    first, second = Confirmation.objects.order_by("session_id")
    confirmation_reject(confirmation_id=first.pk, reviewer=reviewer, reason="Not returned.")
    Confirmation.objects.filter(pk=second.pk).update(expires_at=timezone.now())
    confirmation_expire(confirmation_id=second.pk)
    rollups_fill(lag=timedelta(0))
    live = rollups_live()

    rebuilt, waiting = rollups_rebuilt(audit_in_session_order())
    out = StringIO()
    call_command("rebuild_rollups", "--check", stdout=out)

    assert rebuilt == live
    assert sum(row[0] for row in live.days.values()) == 8
    assert sorted(key[3] for key in live.decisions) == ["", "rita"]
    assert waiting == []
    assert "agree" in out.getvalue()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL: concurrent writers"
)
@pytest.mark.django_db(transaction=True)
def test_fills_beside_concurrent_writers_count_every_call_once_and_a_rebuild_agrees(
    make_agent: MakeAgent, settings: Settings
) -> None:
    agent, _ = make_agent(step_budget=200, repeat_limit=200)
    barrier = threading.Barrier(8)
    writing = threading.Event()
    writing.set()

    def session(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            # Each session's calls one after another, as an agent sends them; the sessions at once.
            for round_ in range(5):
                send(agent, f"s-{index}", "get_order", BAD_READ)
                send(agent, f"s-{index}", "get_order", GOOD_READ)
                send(agent, f"s-{index}-{round_}", "refund_order", BAD_REFUND)
        finally:
            connection.close()

    def fill() -> None:
        # As beat fills, while the calls are written: a call here takes milliseconds, so a tenth
        # of a second is lag enough.
        try:
            while writing.is_set():
                rollups_fill(lag=timedelta(seconds=0.1))
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=9) as pool:
        filling = pool.submit(fill)
        list(pool.map(session, range(8)))
        writing.clear()
        filling.result()
    rollups_fill(lag=timedelta(0))
    live = rollups_live()
    out = StringIO()
    # Every call has committed: the rebuild counts up to now.
    settings.TOOLGATE_ROLLUP_LAG_SECONDS = 0

    call_command("rebuild_rollups", stdout=out)

    assert sum(row[0] for row in live.hours.values()) == 8 * 5 * 3
    assert sum(row[0] for row in live.days.values()) == 8 * 5 * 3
    assert sum(row[3] for row in live.days.values()) == 8 * 5
    assert rollups_live() == live
    assert "Rebuilt" in out.getvalue()


def test_the_what_if_reads_the_records_and_writes_nothing(make_agent: MakeAgent) -> None:
    agent, _ = make_agent(two_reviewers_from_cents=5_500)
    send(agent, "s-1", "refund_order", {**REFUND, "amount_cents": 3_000})
    send(agent, "s-2", "refund_order", {**REFUND, "amount_cents": 1_500})
    send(agent, "s-3", "refund_order", {**REFUND, "amount_cents": 6_000})
    send(agent, "s-3", "refund_order", {**REFUND, "amount_cents": 6_000})  # a replay: not judged
    send(agent, "s-4", "get_order", GOOD_READ)  # moves no money: not judged
    assert agent.current_policy is not None
    draft = draft_of(
        agent.current_policy.snapshot(),
        {"auto_approve_below_cents": 20_000, "two_reviewers_from_cents": None},
    )
    now = timezone.now()

    with CaptureQueriesContext(connection) as queries:
        result = policy_what_if(
            agent_id=agent.pk,
            since=now - timedelta(hours=1),
            until=now + timedelta(hours=1),
            draft=draft,
        )

    assert result.calls == 3
    assert result.actual[AUTO_EXECUTED] == Tally(2, {"BRL": 4_500})
    assert result.actual[TWO_REVIEWERS] == Tally(1, {"BRL": 6_000})
    assert result.draft[AUTO_EXECUTED] == Tally(3, {"BRL": 10_500})
    assert [(m.actual, m.draft, m.tally.calls) for m in result.moves] == [
        (TWO_REVIEWERS, AUTO_EXECUTED, 1)
    ]
    assert result.moves[0].examples[0].call.session_id == "s-3"
    # A savepoint (the replay reads in a transaction of its own) writes nothing either.
    assert all(query["sql"].lstrip().upper().startswith(READS) for query in queries)


def test_the_rollups_recovery_is_the_recovery_rate_of_the_records(make_agent: MakeAgent) -> None:
    agent, _ = make_agent()
    for session in ("s-1", "s-2", "s-3"):
        send(agent, session, "get_order", BAD_READ)
        send(agent, session, "refund_order", BAD_REFUND)
        if session != "s-3":
            send(agent, session, "get_order", GOOD_READ)
    send(agent, "s-1", "refund_order", HELD_REFUND)
    now = timezone.now()

    from_rollups = figures()["by_tool_and_code"]
    from_records = recovery_rate(start=now - timedelta(hours=2), end=now + timedelta(hours=1))

    assert isinstance(from_rollups, list)
    assert {
        (row["tool"], row["code"]): (row["correctable"], row["recovered"])
        for row in from_rollups
        if row["correctable"]
    } == {
        key: (recovery.rejected, recovery.recovered)
        for key, recovery in from_records.by_tool_and_code.items()
    }


# Long ranges: whole days from the daily rollups, hours at the ends -------------------------------


@pytest.fixture
def calls_over_three_days(make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch) -> datetime:
    """Three days of calls at 23:30 the day before, at noon and at 23:30 UTC, two rejections a
    session; the sessions at 23:30 fix theirs at 00:30, after midnight. Returns the first
    midnight."""
    agent, _ = make_agent(step_budget=100)
    midnight = timezone.now().astimezone(UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    ) - timedelta(days=3)
    moment = midnight
    monkeypatch.setattr(_pipeline(), "clock", lambda: moment)
    for day in range(3):
        for offset, session in ((-0.5, "early"), (12, "noon"), (23.5, "late")):
            moment = midnight + timedelta(days=day, hours=offset)
            send(agent, f"{session}-{day}", "get_order", BAD_READ)
            send(agent, f"{session}-{day}", "get_order", UNKNOWN_ORDER)
        moment = midnight + timedelta(days=day, hours=24.5)
        send(agent, f"late-{day}", "get_order", GOOD_READ)
    return midnight


def test_days_and_hours_give_the_figures_of_the_hours_alone(
    calls_over_three_days: datetime,
) -> None:
    since = calls_over_three_days - timedelta(hours=1)  # an hour before the first midnight
    until = since + timedelta(days=3)  # an hour before the last

    from_days = call_figures(since=since, until=until, bucket=timedelta(days=1))
    from_hours = call_figures(since=since, until=until, bucket=timedelta(hours=1))

    assert from_days.as_dict()["by_tool_and_code"] == from_hours.as_dict()["by_tool_and_code"]
    # Each day 2 calls at 23:30 the day before, 2 at noon, 2 at 23:30 and a fix at 00:30 the next
    # day; the range leaves out the last day's 23:30 and its fix.
    assert from_days.total.calls == 7 + 7 + 4
    # Both rejections of the sessions at 23:30 of the first two days, fixed after midnight.
    assert from_days.total.recovered == 4
    per_day: dict[tuple[datetime, str], int] = {}
    for (hour, code), calls in from_hours.by_bucket_code.items():
        day = hour.replace(hour=0)
        per_day[day, code] = per_day.get((day, code), 0) + calls
    assert dict(from_days.by_bucket_code) == per_day


def test_a_reader_whose_days_are_not_utcs_gets_their_own_days(
    calls_over_three_days: datetime,
) -> None:
    since = calls_over_three_days - timedelta(hours=1)
    until = since + timedelta(days=3)

    with timezone.override(zoneinfo.ZoneInfo("America/Sao_Paulo")):  # UTC-3, no summer time
        local = call_figures(since=since, until=until, bucket=timedelta(days=1))
    in_utc = call_figures(since=since, until=until, bucket=timedelta(days=1))

    first = calls_over_three_days.date()
    assert local.as_dict()["by_tool_and_code"] == in_utc.as_dict()["by_tool_and_code"]
    assert {bucket.astimezone(UTC).hour for bucket, _ in local.by_bucket_code} == {3}
    # The fixes at 00:30 UTC are at 21:30 the day before in São Paulo.
    assert ok_days(local) == [first, first + timedelta(days=1)]
    assert ok_days(in_utc) == [first + timedelta(days=1), first + timedelta(days=2)]


def ok_days(figures: CallFigures) -> list[date]:
    return sorted(bucket.date() for bucket, code in figures.by_bucket_code if code == "OK")


def test_the_totals_alone_are_those_of_the_chart(calls_over_three_days: datetime) -> None:
    since, until = calls_over_three_days, calls_over_three_days + timedelta(days=2, hours=5)

    totals = call_figures(since=since, until=until, bucket=None)
    charted = call_figures(since=since, until=until, bucket=timedelta(hours=1))

    assert totals.as_dict()["by_tool_and_code"] == charted.as_dict()["by_tool_and_code"]


# Decision times: from the daily histogram of decisions, and from the held calls at a range's ends


# How far a percentile read from the histogram may be from the exact one (analytics/selectors.py).
PRECISION = 0.045


@pytest.fixture
def decisions_two_days_ago(make_agent: MakeAgent) -> datetime:
    """Four held calls decided at noon UTC two days ago, after 60 s and 600 s (rejected by rita),
    3,600 s (rejected by bruno) and 7,200 s (expired). Returns the moment of the decisions."""
    agent, _ = make_agent()
    decided = timezone.now().astimezone(UTC).replace(
        hour=12, minute=0, second=0, microsecond=0
    ) - timedelta(days=2)
    rita, bruno = User.objects.create_user("rita"), User.objects.create_user("bruno")
    for index, (wait, reviewer) in enumerate(
        ((60, rita), (600, rita), (3_600, bruno), (7_200, None))
    ):
        refund = {**HELD_REFUND, "amount_cents": 9_000 + index}
        assert send(agent, f"s-{index}", "refund_order", refund) == "CONFIRMATION_REQUIRED"
        held = Confirmation.objects.get(session_id=f"s-{index}")
        confirmation_rewrite(
            held.pk,
            created_at=decided - timedelta(seconds=wait),
            expires_at=decided + timedelta(hours=1) if reviewer else decided,
        )
        if reviewer is None:
            confirmation_expire(confirmation_id=held.pk, now=decided)
        else:
            confirmation_reject(
                confirmation_id=held.pk, reviewer=reviewer, reason="No.", now=decided
            )
    return decided


def test_decision_times_are_the_exact_ones_within_the_histograms_precision(
    decisions_two_days_ago: datetime,
) -> None:
    now = timezone.now()

    outcomes = confirmation_outcomes(since=now - timedelta(days=5), until=now)

    # All four: 60, 600, 3,600 and 7,200 s. rita: 60 and 600. bruno: 3,600.
    assert outcomes["time_to_decision_seconds"] == {
        "p50": pytest.approx((600 + 3_600) / 2, rel=PRECISION),
        "p90": pytest.approx(3_600 + 0.7 * (7_200 - 3_600), rel=PRECISION),
    }
    assert outcomes["by_reviewer"] == {
        "bruno": {
            "decided": 1,
            "p50": pytest.approx(3_600, rel=PRECISION),
            "p90": pytest.approx(3_600, rel=PRECISION),
        },
        "rita": {
            "decided": 2,
            "p50": pytest.approx(330, rel=PRECISION),
            "p90": pytest.approx(546, rel=PRECISION),
        },
    }
    assert outcomes["by_status"] == {"expired": 1, "rejected": 3}


def test_decision_times_at_a_ranges_ends_are_those_of_its_days(
    decisions_two_days_ago: datetime,
) -> None:
    now = timezone.now()

    rollups_fill(lag=timedelta(0))
    whole_days = confirmation_outcomes(since=now - timedelta(days=5), until=now)
    hours = confirmation_outcomes(
        since=decisions_two_days_ago - timedelta(hours=3), until=decisions_two_days_ago
    )
    DecisionRollup.objects.all().delete()
    days_without_rollup = confirmation_outcomes(since=now - timedelta(days=5), until=now)

    assert hours == whole_days
    # The whole days were read from the histogram, not from the held calls.
    assert days_without_rollup["time_to_decision_seconds"] == {"p50": None, "p90": None}


def test_a_decision_times_bucket_stands_for_it_within_4_5_percent() -> None:
    times = [1.0, 1.04, 59.9, 60.0, 61.3, 3_600.0, 86_399.0, 7 * 86_400.0]

    shown = [decision_seconds(decision_bucket(seconds)) for seconds in times]

    assert all(abs(s - t) <= 0.0443 * t for s, t in zip(shown, times, strict=True))
    assert decision_seconds(decision_bucket(0.2)) == 0.5
