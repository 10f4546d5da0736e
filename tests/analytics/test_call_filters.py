"""The calls page's own filters: customer, session, channel and a search in what the model sent,
with the range, agent, tool and code it had already; on PostgreSQL the search reads a trigram
index however long the audit trail."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from analytics.selectors import calls_narrowed
from dispatch.models import AuditRecord, CallChannel
from dispatch.services import call_dispatch
from orders.models import Order
from tests.analytics.test_views import Clock, Traffic, login_in_group, record_traffic
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture
def traffic(make_agent: MakeAgent, clock: Clock, orders: dict[str, Order]) -> Traffic:
    return record_traffic(make_agent, clock)


@pytest.fixture
def manager(db: None) -> Client:
    return login_in_group("max", "managers")


def listed(manager: Client, **params: Any) -> list[AuditRecord]:
    response = manager.get("/analytics/calls/", params)
    assert response.status_code == 200
    return [row.record for row in response.context["rows"]]


def test_the_calls_filter_by_session_customer_and_channel(
    traffic: Traffic, manager: Client
) -> None:
    call_dispatch(
        agent=traffic.other,
        session_id="s-9",
        customer_id="CUS-9",
        tool="get_order",
        arguments='{"order_id": "ORD-1001"}',
    )

    assert {r.session_id for r in listed(manager, session="s-2")} == {"s-2"}
    assert [r.session_id for r in listed(manager, customer="CUS-9")] == ["s-9"]
    assert len(listed(manager, customer="CUS-1")) == 9
    assert listed(manager, channel=CallChannel.MCP) == []
    assert len(listed(manager, channel=CallChannel.API)) == 10


def test_the_search_finds_text_in_the_raw_arguments_in_any_case(
    traffic: Traffic, manager: Client
) -> None:
    found = listed(manager, q="ord-9999")
    wrong_amount = listed(manager, q='"AMOUNT_CENTS": 90.0')

    assert [r.code for r in found] == ["ORDER_NOT_FOUND"]
    assert [r.code for r in wrong_amount] == ["INVALID_ARGUMENTS"]
    page = manager.get("/analytics/calls/", {"q": "ord-9999"}).content.decode()
    assert "arguments containing “ord-9999”" in page


def test_filters_combine_and_live_in_the_links_to_further_pages(
    traffic: Traffic, manager: Client
) -> None:
    records = listed(manager, tool="refund_order", session="s-1", code="OK")

    assert len(records) == 2 and all(r.tool == "refund_order" for r in records)
    page = manager.get(
        "/analytics/calls/", {"tool": "refund_order", "q": "damaged", "customer": "CUS-1"}
    ).content.decode()
    # The form says what is applied; Clear takes every filter off.
    assert 'value="damaged"' in page and 'value="CUS-1"' in page
    assert 'href="/analytics/calls/">Clear</a>' in page


def test_a_search_too_short_for_the_index_is_left_out_and_said(
    traffic: Traffic, manager: Client
) -> None:
    response = manager.get("/analytics/calls/", {"q": "OR"})

    assert len(response.context["rows"]) == 9
    assert "at least 3 characters" in response.content.decode()


def test_no_call_says_what_will_appear(manager: Client) -> None:
    page = manager.get("/analytics/calls/").content.decode()
    filtered = manager.get("/analytics/calls/", {"customer": "CUS-1"}).content.decode()

    assert "No agent called a tool in this range" in page
    assert "Try a wider range or fewer filters" in filtered


def test_the_calls_page_reads_as_many_queries_for_seven_calls_as_for_nine(
    traffic: Traffic, manager: Client
) -> None:
    def count(**params: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert manager.get("/analytics/calls/", params).status_code == 200
        return len(captured)

    # Both lists hold a call whose confirmation they show.
    assert count(session="s-1") == count()


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the trigram index exists on PostgreSQL only; SQLite searches without it",
)
def test_the_search_reads_the_trigram_index(traffic: Traffic) -> None:
    search = calls_narrowed(AuditRecord.objects.order_by(), search="ord-9999")
    sql, params = search.query.sql_with_params()
    with connection.cursor() as cursor:
        # A few rows would be read whole anyway: forbid that, and see which index the plan uses.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "audit_raw_arguments_trgm" in plan, plan


def test_the_customer_filter_reads_its_index(traffic: Traffic) -> None:
    indexes = {index.name for index in AuditRecord._meta.indexes}

    assert {"audit_customer_idx", "audit_raw_arguments_trgm"} <= indexes


def test_a_list_past_the_counted_most_says_more_than(
    traffic: Traffic, manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("analytics.views.CALLS_COUNTED", 5)

    response = manager.get("/analytics/calls/")

    assert "More than 5 calls" in response.content.decode()
    assert len(response.context["rows"]) == 5
