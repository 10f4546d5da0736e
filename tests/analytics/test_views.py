"""The managers' pages on hand-made traffic: calls sent through the pipeline (call_dispatch) at
chosen times, so that the rollups fill as in production, and every figure checked against what
was worked out by hand below."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from approvals.services import confirmation_reject
from dispatch.models import Agent, AuditRecord, CallChannel, Confirmation
from dispatch.services import _pipeline, call_dispatch
from orders.models import Order
from tests.conftest import LoginClient, MakeAgent

GOOD_READ = {"order_id": "ORD-1001"}
BAD_READ = {"order_id": 1001}  # INVALID_ARGUMENTS, which the model can fix
UNKNOWN_ORDER = {"order_id": "ORD-9999"}  # ORDER_NOT_FOUND, which it can fix too (ask the user)
SMALL_REFUND = {
    "order_id": "ORD-1001",
    "amount_cents": 1_000,
    "currency": "BRL",
    "reason": "damaged",
}
HELD_REFUND = {**SMALL_REFUND, "amount_cents": 9_000}
BAD_REFUND = {**SMALL_REFUND, "amount_cents": 90.0}


class Clock:
    """The pipeline's own clock, set to the moment a call should have arrived."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = timezone.now()
        self.moment = self.now
        monkeypatch.setattr(_pipeline(), "clock", lambda: self.moment)

    def at(self, moment: datetime) -> Clock:
        self.moment = moment
        return self


@dataclass
class Traffic:
    shop: Agent
    other: Agent
    now: datetime
    held: Confirmation


def send(agent: Agent, session: str, tool: str, arguments: object) -> str:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool=tool,
        arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
    ).code


def record_traffic(make_agent: MakeAgent, clock: Clock) -> Traffic:
    """Nine calls in the current hour and two 30 hours earlier, worked out by hand:

    now, shop-agent, s-1: get_order INVALID_ARGUMENTS (fixed by the next call), get_order OK,
        refund_order OK, the same refund replayed, the same again LOOP_DETECTED (repeat limit 2),
        a refund held (CONFIRMATION_REQUIRED), get_order ORDER_NOT_FOUND;
    now, shop-agent, s-2: refund_order INVALID_ARGUMENTS, never fixed;
    now, other-agent, s-3: get_order OK;
    30 hours ago, shop-agent, s-0: get_order OK, get_order INVALID_ARGUMENTS, never fixed.

    Last 24 hours: 9 calls; rejected 4 (44.4 %); fixable 3 (both INVALID_ARGUMENTS and the
    ORDER_NOT_FOUND), fixed 1 (33.3 %); 1 loop; 1 held.
    The 24 hours before: 2 calls; rejected 1 (50.0 %); fixable 1, fixed 0 (0.0 %).
    """
    shop, _ = make_agent(name="shop-agent", repeat_limit=2)
    other, _ = make_agent(name="other-agent")
    clock.at(clock.now - timedelta(hours=30))
    earlier = [send(shop, "s-0", "get_order", GOOD_READ), send(shop, "s-0", "get_order", BAD_READ)]
    clock.at(clock.now)
    codes = [
        send(shop, "s-1", "get_order", BAD_READ),
        send(shop, "s-1", "get_order", GOOD_READ),
        send(shop, "s-1", "refund_order", SMALL_REFUND),
        send(shop, "s-1", "refund_order", SMALL_REFUND),
        send(shop, "s-1", "refund_order", SMALL_REFUND),
        send(shop, "s-1", "refund_order", HELD_REFUND),
        send(shop, "s-1", "get_order", UNKNOWN_ORDER),
        send(shop, "s-2", "refund_order", BAD_REFUND),
        send(other, "s-3", "get_order", GOOD_READ),
    ]
    assert earlier == ["OK", "INVALID_ARGUMENTS"]
    assert codes == [
        "INVALID_ARGUMENTS",
        "OK",
        "OK",
        "OK",
        "LOOP_DETECTED",
        "CONFIRMATION_REQUIRED",
        "ORDER_NOT_FOUND",
        "INVALID_ARGUMENTS",
        "OK",
    ]
    assert AuditRecord.objects.filter(replayed=True).count() == 1
    return Traffic(shop, other, clock.now, Confirmation.objects.get())


def login_in_group(username: str, *groups: str) -> Client:
    user = User.objects.create_user(username, password="pw")
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = LoginClient()
    assert client.login(username=username, password="pw")
    return client


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture
def traffic(make_agent: MakeAgent, clock: Clock, orders: dict[str, Order]) -> Traffic:
    return record_traffic(make_agent, clock)


@pytest.fixture
def manager(db: None) -> Client:
    return login_in_group("max", "managers")


def headline_values(response: Any) -> dict[str, tuple[str, str]]:
    return {h.label: (h.value, h.change) for h in response.context["headlines"]}


def listed_calls(client: Client, url: str) -> set[str]:
    response = client.get(url)
    assert response.status_code == 200
    return {row.record.call_id for row in response.context["rows"]}


def calls_where(**filters: Any) -> set[str]:
    return set(AuditRecord.objects.filter(**filters).values_list("call_id", flat=True))


# Who may read the pages ------------------------------------------------------------------------

PAGES = ["/analytics/", "/analytics/calls/", "/analytics/export.csv"]


@pytest.mark.parametrize("path", [*PAGES, "/analytics/sessions/1/s-1/"])
def test_anonymous_readers_are_sent_to_the_login(client: Client, db: None, path: str) -> None:
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


@pytest.mark.parametrize("path", PAGES)
def test_a_reviewer_who_is_not_a_manager_gets_403(traffic: Traffic, path: str) -> None:
    reviewer = login_in_group("rita", "reviewers")

    response = reviewer.get(path)

    assert response.status_code == 403


def test_a_user_in_no_group_may_not_read_a_session(traffic: Traffic) -> None:
    nobody = login_in_group("nina")

    response = nobody.get(f"/analytics/sessions/{traffic.shop.pk}/s-1/")

    assert response.status_code == 403


def test_a_reviewer_may_read_a_session_timeline(traffic: Traffic) -> None:
    reviewer = login_in_group("rita", "reviewers")

    response = reviewer.get(f"/analytics/sessions/{traffic.shop.pk}/s-1/")

    assert response.status_code == 200


# The dashboard ---------------------------------------------------------------------------------


def test_the_headline_figures_match_the_hand_computed_ones(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/")

    assert response.status_code == 200
    assert headline_values(response) == {
        "Calls": ("9", "▲ 350 %"),
        "Rejection rate": ("44.4 %", "▼ 5.6 pp"),
        "Recovery rate": ("33.3 %", "▲ 33.3 pp"),
        "Loop detections": ("1", "▲ new"),
        "Held calls": ("1", "▲ new"),
    }
    assert [h.previous for h in response.context["headlines"]][:3] == [
        "vs 2 in the 24 hours before",
        "vs 50.0 % in the 24 hours before",
        "vs 0.0 % in the 24 hours before",
    ]
    page = response.content.decode()
    assert "44.4 %" in page and "▲ 350 %" in page


def test_the_table_counts_each_tool_and_code_with_its_share_and_recovery(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/")

    rows = [
        (row.tool, row.code, row.calls, row.share_text, row.recovery_text)
        for row in response.context["rows"]
    ]
    assert rows == [
        ("get_order", "OK", 2, "22.2 %", "—"),
        ("refund_order", "OK", 2, "22.2 %", "—"),
        ("get_order", "INVALID_ARGUMENTS", 1, "11.1 %", "100.0 %"),
        ("get_order", "ORDER_NOT_FOUND", 1, "11.1 %", "0.0 %"),
        ("refund_order", "CONFIRMATION_REQUIRED", 1, "11.1 %", "—"),
        ("refund_order", "INVALID_ARGUMENTS", 1, "11.1 %", "0.0 %"),
        ("refund_order", "LOOP_DETECTED", 1, "11.1 %", "—"),
    ]


def test_the_table_sorts_by_the_column_in_the_query_string(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/?sort=recovery")

    assert [(row.tool, row.code) for row in response.context["rows"]][:4] == [
        ("get_order", "INVALID_ARGUMENTS"),
        ("get_order", "ORDER_NOT_FOUND"),
        ("refund_order", "INVALID_ARGUMENTS"),
        ("get_order", "OK"),
    ]


def test_the_charts_carry_the_hand_computed_figures(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/")

    charts = response.context["charts_drawn"]
    over_time = {s["label"]: s for s in charts["rejection_over_time"]["series"]}
    assert set(over_time) == {"INVALID_ARGUMENTS", "LOOP_DETECTED", "ORDER_NOT_FOUND"}
    # The last bucket is the current hour: 2 of its 9 calls were INVALID_ARGUMENTS.
    assert over_time["INVALID_ARGUMENTS"]["values"][-1] == 22.22
    assert over_time["INVALID_ARGUMENTS"]["texts"][-1] == "22.2 % (2 of 9)"
    assert sum(over_time["LOOP_DETECTED"]["values"][:-1]) == 0
    recovery = charts["recovery_by_tool"]
    assert recovery["labels"] == ["get_order", "refund_order"]
    assert recovery["series"][0]["values"] == [50.0, 0.0]
    assert recovery["series"][0]["texts"] == ["50.0 % (1 of 2)", "0.0 % (0 of 1)"]
    stuck = charts["stuck_by_tool"]
    assert stuck["labels"] == ["refund_order"]
    assert {s["label"]: s["values"] for s in stuck["series"]} == {
        "replays": [1],
        "loop detections": [1],
    }
    assert charts["confirmation_outcomes"]["labels"] == ["pending"]
    assert charts["confirmation_outcomes"]["series"][0]["values"] == [1]
    # The page carries them for the browser, safely encoded.
    assert '<script id="analytics-charts" type="application/json">' in response.content.decode()


def test_a_tool_in_the_query_string_changes_the_figures(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/?tool=refund_order")

    assert headline_values(response)["Calls"][0] == "5"
    assert headline_values(response)["Rejection rate"][0] == "40.0 %"
    assert {row.tool for row in response.context["rows"]} == {"refund_order"}


def test_an_agent_in_the_query_string_changes_the_figures(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get(f"/analytics/?agent={traffic.other.pk}")

    assert headline_values(response)["Calls"] == ("1", "")
    assert headline_values(response)["Rejection rate"][0] == "0.0 %"
    assert response.context["scope"].agent == traffic.other


def test_a_longer_range_counts_the_earlier_calls(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/?range=7d")

    assert headline_values(response)["Calls"][0] == "11"
    assert headline_values(response)["Recovery rate"][0] == "25.0 %"
    assert response.context["scope"].bucket == timedelta(hours=6)


def test_a_custom_range_of_days_counts_only_those_days(traffic: Traffic, manager: Client) -> None:
    day = timezone.localtime(traffic.now - timedelta(hours=30)).date().isoformat()

    response = manager.get(f"/analytics/?range=custom&since={day}&until={day}")

    scope = response.context["scope"]
    assert (scope.since.date().isoformat(), scope.span) == (day, timedelta(days=1))
    assert headline_values(response)["Calls"][0] == "2"


def test_a_named_range_wins_over_the_dates_a_form_also_sends(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/?range=24h&since=2024-01-01&until=2024-01-02")

    assert response.context["scope"].range_key == "24h"
    assert headline_values(response)["Calls"][0] == "9"


@pytest.mark.parametrize(
    "query",
    [
        "range=forever",
        "since=yesterday",
        "since=2026-02-30",
        "since=2024-01-05&until=2024-01-01",
        "since=2000-01-01&until=2030-01-01",
        "since=0001-01-01",
        "until=9999-12-31T23:59:59",
        "agent=abc",
        "agent=99999999999999999999999",
        "tool=" + "x" * 500,
        "sort=nonsense",
    ],
)
def test_nonsense_in_the_query_string_is_answered_with_the_default_range(
    traffic: Traffic, manager: Client, query: str
) -> None:
    response = manager.get(f"/analytics/?{query}")

    assert response.status_code == 200
    assert response.context["scope"].span == timedelta(hours=24)


def test_a_range_that_is_not_possible_is_explained(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/?since=2024-01-05&until=2024-01-01")

    assert "The range must start before it ends." in response.content.decode()


def test_without_any_call_the_page_says_how_to_get_data(manager: Client) -> None:
    response = manager.get("/analytics/")

    page = response.content.decode()
    assert "No tool calls recorded yet" in page
    assert "make demo" in page and "manage.py simulate_agents" in page
    assert "analytics-charts" not in page


def test_a_range_without_calls_says_so(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/?since=2024-01-01&until=2024-01-02")

    page = response.content.decode()
    assert "No calls in this range" in page
    assert "Look at the last 30 days" in page


# The calls behind a figure ---------------------------------------------------------------------


def test_every_cell_of_the_table_lists_exactly_the_calls_behind_it(
    traffic: Traffic, manager: Client
) -> None:
    rows = manager.get("/analytics/").context["rows"]

    for row in rows:
        listed = listed_calls(manager, row.url)

        expected = calls_where(
            tool=row.tool, code=row.code, at__gte=traffic.now - timedelta(hours=1)
        )
        assert listed == expected, (row.tool, row.code)
        assert len(listed) == row.calls


def test_a_recovery_cell_lists_the_fixable_rejections_behind_it(
    traffic: Traffic, manager: Client
) -> None:
    row = next(r for r in manager.get("/analytics/").context["rows"] if r.correctable)

    listed = listed_calls(manager, row.recovery_url)

    assert listed == calls_where(session_id="s-1", code="INVALID_ARGUMENTS")


def test_each_headline_lists_the_calls_it_counts(traffic: Traffic, manager: Client) -> None:
    urls = {h.label: h.url for h in manager.get("/analytics/").context["headlines"]}
    current = {"at__gte": traffic.now - timedelta(hours=1)}

    assert len(listed_calls(manager, urls["Calls"])) == 9
    assert listed_calls(manager, urls["Rejection rate"]) == calls_where(
        code__in=["INVALID_ARGUMENTS", "LOOP_DETECTED", "ORDER_NOT_FOUND"], **current
    )
    assert listed_calls(manager, urls["Recovery rate"]) == calls_where(
        code__in=["INVALID_ARGUMENTS", "ORDER_NOT_FOUND"], **current
    )
    assert listed_calls(manager, urls["Loop detections"]) == calls_where(code="LOOP_DETECTED")
    assert listed_calls(manager, urls["Held calls"]) == calls_where(code="CONFIRMATION_REQUIRED")


def test_a_bar_of_the_chart_over_time_lists_the_calls_of_its_hour_and_code(
    traffic: Traffic, manager: Client
) -> None:
    charts = manager.get("/analytics/").context["charts_drawn"]
    series = next(
        s for s in charts["rejection_over_time"]["series"] if s["label"] == "INVALID_ARGUMENTS"
    )

    current, earlier = series["urls"][-1], series["urls"][-7]

    assert listed_calls(manager, current) == calls_where(
        code="INVALID_ARGUMENTS", at__gte=traffic.now - timedelta(hours=1)
    )
    assert listed_calls(manager, earlier) == set()
    assert parse_qs(urlsplit(current).query)["since"] == [
        traffic.now.astimezone(UTC).strftime("%Y-%m-%dT%H:00Z")
    ]


def test_a_month_is_drawn_by_day_and_each_day_lists_its_own_calls(
    traffic: Traffic, manager: Client
) -> None:
    charts = manager.get("/analytics/?range=30d").context["charts_drawn"]
    chart = charts["rejection_over_time"]
    series = next(s for s in chart["series"] if s["label"] == "INVALID_ARGUMENTS")
    earlier_day = timezone.localtime(traffic.now - timedelta(hours=30))
    earlier = chart["labels"].index(f"{earlier_day.day} {earlier_day:%b}")

    today, that_day = series["urls"][-1], series["urls"][earlier]

    # 30 days up to the end of the current hour touch 31 calendar days, the first and the last
    # in part; in the last hour of a day they touch 30 whole ones.
    until = timezone.localtime(traffic.now).replace(minute=0, second=0, microsecond=0)
    until += timedelta(hours=1)
    days = (until - timedelta(microseconds=1)).date() - (until - timedelta(days=30)).date()
    assert len(chart["labels"]) == days.days + 1
    assert series["texts"][earlier] == "50.0 % (1 of 2)"
    assert listed_calls(manager, today) == calls_where(
        code="INVALID_ARGUMENTS", at__gte=traffic.now - timedelta(hours=1)
    )
    assert listed_calls(manager, that_day) == calls_where(
        code="INVALID_ARGUMENTS", session_id="s-0"
    )


def test_the_replay_bar_lists_the_replayed_call(traffic: Traffic, manager: Client) -> None:
    charts = manager.get("/analytics/").context["charts_drawn"]
    replays = next(s for s in charts["stuck_by_tool"]["series"] if s["label"] == "replays")

    listed = listed_calls(manager, replays["urls"][0])

    assert listed == calls_where(replayed=True)


def test_held_calls_are_listed_by_their_outcome_and_who_decided(
    traffic: Traffic, manager: Client
) -> None:
    rita = User.objects.create_user("rita")
    confirmation_reject(confirmation_id=traffic.held.pk, reviewer=rita, reason="Not yet returned.")
    held = calls_where(code="CONFIRMATION_REQUIRED")

    charts = manager.get("/analytics/").context["charts_drawn"]

    outcomes = charts["confirmation_outcomes"]
    assert outcomes["labels"] == ["rejected"]
    assert listed_calls(manager, outcomes["series"][0]["urls"][0]) == held
    decisions = charts["decision_times"]
    assert decisions["labels"] == ["all held calls", "rita"]
    assert listed_calls(manager, decisions["series"][0]["urls"][1]) == held
    assert listed_calls(manager, "/analytics/calls/?outcome=held&status=executed") == set()
    assert listed_calls(manager, "/analytics/calls/?outcome=held&decided_by=someone") == set()


def test_the_list_shows_what_was_sent_escaped_and_what_the_model_was_told(
    traffic: Traffic, manager: Client
) -> None:
    send(traffic.shop, "s-9", "get_order", '{"order_id": "<script>alert(1)</script>"}')

    response = manager.get("/analytics/calls/?code=INVALID_ARGUMENTS&tool=get_order")

    page = response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    record = AuditRecord.objects.get(session_id="s-9")
    assert record.message and escape(record.message) in page
    assert f"/analytics/sessions/{traffic.shop.pk}/s-9/" in page


def test_long_arguments_are_cut_in_the_list_and_whole_on_the_call(
    traffic: Traffic, manager: Client
) -> None:
    raw = json.dumps({"order_id": "ORD-1001", "note": "x" * 400})
    send(traffic.shop, "s-9", "get_order", raw)
    record = AuditRecord.objects.get(session_id="s-9")

    listing = manager.get("/analytics/calls/?code=INVALID_ARGUMENTS&tool=get_order")
    detail = manager.get(f"/analytics/calls/{record.call_id}/")

    row = next(r for r in listing.context["rows"] if r.record.call_id == record.call_id)
    assert row.truncated and len(row.raw_shown) == 161
    assert escape(raw) not in listing.content.decode()
    assert detail.status_code == 200
    assert escape(raw) in detail.content.decode()


def test_the_list_is_paged(
    make_agent: MakeAgent, orders: dict[str, Order], manager: Client
) -> None:
    agent, _ = make_agent()
    for index in range(52):
        send(agent, f"p-{index}", "get_order", GOOD_READ)

    first = manager.get("/analytics/calls/?code=OK")
    second = manager.get("/analytics/calls/?code=OK&page=2")
    beyond = manager.get("/analytics/calls/?code=OK&page=abc")

    assert len(first.context["rows"]) == 50 and len(second.context["rows"]) == 2
    assert {r.record.call_id for r in first.context["rows"]}.isdisjoint(
        {r.record.call_id for r in second.context["rows"]}
    )
    assert "page=2" in first.content.decode()
    assert beyond.status_code == 200


def test_an_unknown_call_is_404(manager: Client) -> None:
    assert manager.get("/analytics/calls/0123456789abcdef/").status_code == 404


# A session's timeline --------------------------------------------------------------------------


def test_the_timeline_shows_every_call_of_the_session_in_order(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get(f"/analytics/sessions/{traffic.shop.pk}/s-1/")

    rows = response.context["rows"]
    assert [(r.record.step, r.record.code, r.record.replayed) for r in rows] == [
        (1, "INVALID_ARGUMENTS", False),
        (2, "OK", False),
        (3, "OK", False),
        (4, "OK", True),
        (5, "LOOP_DETECTED", False),
        (6, "CONFIRMATION_REQUIRED", False),
        (7, "ORDER_NOT_FOUND", False),
    ]
    assert [r.stage for r in rows][:2] == ["3 · schema", "8 · execution"]
    page = response.content.decode()
    # A manager reads the held call on the records' read-only page, which they may open.
    assert f"/records/confirmations/{traffic.held.pk}/" in page
    assert manager.get(f"/records/confirmations/{traffic.held.pk}/").status_code == 200
    assert "replayed" in page
    assert escape(rows[0].record.message) in page


def test_the_timeline_names_who_decided_a_held_call(traffic: Traffic, manager: Client) -> None:
    rita = User.objects.create_user("rita")
    confirmation_reject(confirmation_id=traffic.held.pk, reviewer=rita, reason="Not yet returned.")

    response = manager.get(f"/analytics/sessions/{traffic.shop.pk}/s-1/")

    page = response.content.decode()
    assert "decided by rita" in page and "Not yet returned." in page


def test_the_timeline_marks_the_calls_that_came_over_mcp(traffic: Traffic, manager: Client) -> None:
    call_dispatch(
        agent=traffic.shop,
        session_id="mcp-1",
        customer_id="CUS-1",
        tool="get_order",
        arguments={"order_id": "ORD-1001"},
        channel=CallChannel.MCP,
    )

    over_mcp = manager.get(f"/analytics/sessions/{traffic.shop.pk}/mcp-1/")
    over_api = manager.get(f"/analytics/sessions/{traffic.shop.pk}/s-1/")

    assert 'title="called over MCP (mcp_serve)">MCP</span>' in over_mcp.content.decode()
    assert "called over MCP" not in over_api.content.decode()


def test_a_session_without_calls_is_404(traffic: Traffic, manager: Client) -> None:
    assert manager.get(f"/analytics/sessions/{traffic.shop.pk}/nope/").status_code == 404
    assert manager.get("/analytics/sessions/999999/s-1/").status_code == 404


# The CSV ---------------------------------------------------------------------------------------


def csv_rows(response: Any) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


CSV_HEADER = [
    "call_id",
    "at",
    "agent",
    "session_id",
    "customer_id",
    "channel",
    "step",
    "tool",
    "code",
    "outcome",
    "replayed",
    "confirmation_id",
    "confirmation_status",
    "arguments",
    "message",
]


def test_the_csv_holds_the_calls_of_the_range_one_row_a_call(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/export.csv")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="toolgate-calls-')
    rows = csv_rows(response)
    assert rows[0] == CSV_HEADER
    # The 9 calls of the last 24 hours, oldest first, each as the calls page shows it.
    since = traffic.now - timedelta(hours=24)
    expected = AuditRecord.objects.filter(at__gte=since).order_by("at", "id")
    assert [row[0] for row in rows[1:]] == [record.call_id for record in expected]
    assert len(rows) == 10
    by_id = {row[0]: dict(zip(CSV_HEADER, row, strict=True)) for row in rows[1:]}
    held = by_id[AuditRecord.objects.get(confirmation_id=traffic.held.pk).call_id]
    assert held["agent"] == "shop-agent"
    assert held["session_id"] == "s-1"
    assert held["customer_id"] == "CUS-1"
    assert held["tool"] == "refund_order"
    assert held["code"] == "CONFIRMATION_REQUIRED"
    assert held["outcome"] == "held"
    assert held["confirmation_id"] == traffic.held.pk
    assert held["confirmation_status"] == "pending"
    assert json.loads(held["arguments"]) == HELD_REFUND
    assert held["replayed"] == "no"
    assert sum(1 for row in by_id.values() if row["replayed"] == "yes") == 1


def test_the_csv_follows_the_filters(traffic: Traffic, manager: Client) -> None:
    response = manager.get(f"/analytics/export.csv?agent={traffic.other.pk}&range=7d")

    rows = csv_rows(response)[1:]
    assert [(row[2], row[7], row[8]) for row in rows] == [("other-agent", "get_order", "OK")]
    coded = csv_rows(manager.get("/analytics/export.csv?code=INVALID_ARGUMENTS"))[1:]
    assert {row[8] for row in coded} == {"INVALID_ARGUMENTS"} and len(coded) == 2


def test_the_csv_does_not_let_a_tool_name_run_as_a_formula(
    traffic: Traffic, manager: Client
) -> None:
    send(traffic.shop, "s-9", "=HYPERLINK(1)", "{}")

    rows = csv_rows(manager.get("/analytics/export.csv"))

    assert [row[7] for row in rows if row[8] == "UNKNOWN_TOOL"] == ["'=HYPERLINK(1)"]


def test_a_range_with_more_calls_than_a_csv_holds_is_sent_back_to_narrow(
    traffic: Traffic, manager: Client, settings: Any
) -> None:
    settings.TOOLGATE_CSV_MAX_ROWS = 8

    response = manager.get("/analytics/export.csv?range=24h")

    # Refused before any byte of a file: a redirect to the dashboard of the same range, which
    # says why.
    assert response.status_code == 302
    assert "Content-Disposition" not in response
    assert response["Location"].startswith("/analytics/?")
    assert "range=24h" in response["Location"]
    page = manager.get(response["Location"]).content.decode()
    assert "The range holds more than 8 calls, the most one CSV holds" in page
    settings.TOOLGATE_CSV_MAX_ROWS = 9
    assert len(csv_rows(manager.get("/analytics/export.csv?range=24h"))) == 10


# Counts beside every rate, and the tools no agent may call ----------------------------------


def test_the_rates_say_their_counts(traffic: Traffic, manager: Client) -> None:
    response = manager.get("/analytics/")

    counted = {h.label: h.counted for h in response.context["headlines"]}
    assert counted["Rejection rate"] == "4 of 9 calls"
    assert counted["Recovery rate"] == "1 of 3 fixable rejections"
    page = response.content.decode()
    assert "4 of 9 calls" in page
    charts = response.context["charts"]
    stuck = {s["label"]: s["texts"] for s in charts["stuck_by_tool"]["series"]}
    assert stuck["replays"] == ["1 of 5 calls"]
    assert charts["confirmation_outcomes"]["series"][0]["texts"] == ["1 of 1"]
    # The table beside each chart says the same.
    assert "50.0 % (1 of 2)" in page and "1 of 5 calls" in page


def test_tool_names_no_agent_may_call_are_one_entry_with_their_names(
    traffic: Traffic, manager: Client
) -> None:
    for name in ("lookup_order", "fetch_order", "lookup_order"):
        send(traffic.shop, f"s-{name}", name, json.dumps(GOOD_READ))

    response = manager.get("/analytics/")

    charts = response.context["charts"]
    recovery = charts["recovery_by_tool"]
    assert "lookup_order" not in recovery["labels"] and "fetch_order" not in recovery["labels"]
    assert "unknown tools (2 names)" in recovery["labels"]
    index = recovery["labels"].index("unknown tools (2 names)")
    assert recovery["series"][0]["texts"][index] == "0.0 % (0 of 3)"
    note = next(r["note"] for r in recovery["rows"] if r["label"] == "unknown tools (2 names)")
    assert note == "fetch_order, lookup_order"
    # Its bar leads to the calls refused as unknown tools.
    assert "code=UNKNOWN_TOOL" in recovery["series"][0]["urls"][index]
    rows = [
        (row.tool, row.code, row.calls, row.names)
        for row in response.context["rows"]
        if row.code == "UNKNOWN_TOOL"
    ]
    assert rows == [("unknown tools (2 names)", "UNKNOWN_TOOL", 3, ("fetch_order", "lookup_order"))]
    page = response.content.decode()
    assert "<code>fetch_order</code>, <code>lookup_order</code>" in page


def test_the_calls_page_downloads_the_calls_it_lists(traffic: Traffic, manager: Client) -> None:
    page = manager.get("/analytics/calls/?customer=CUS-1&code=INVALID_ARGUMENTS&page=1")
    link = re.search(r'href="(/analytics/export\.csv\?[^"]*)" download', page.content.decode())

    assert link is not None
    href = html.unescape(link[1])
    assert "customer=CUS-1" in href and "code=INVALID_ARGUMENTS" in href and "page=" not in href
    rows = csv_rows(manager.get(href))[1:]
    listed = set(re.findall(r'href="/analytics/calls/([0-9a-f]{32})/"', page.content.decode()))
    assert listed and {row[0] for row in rows} == listed
    assert {(row[4], row[8]) for row in rows} == {("CUS-1", "INVALID_ARGUMENTS")}


def test_a_csv_of_the_calls_page_too_large_is_sent_back_to_the_calls_page(
    traffic: Traffic, manager: Client, settings: Any
) -> None:
    settings.TOOLGATE_CSV_MAX_ROWS = 1

    response = manager.get("/analytics/export.csv?customer=CUS-1")

    assert response.status_code == 302
    assert response["Location"].startswith("/analytics/calls/?")
    assert "customer=CUS-1" in response["Location"]
