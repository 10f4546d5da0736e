"""Managers' requests beside the agents': each takes one of a few slots and is told at once when
they are all taken, while agents' calls are answered; a range that cannot be read in time says
so, in the API's JSON envelope or on the page, never with a 500."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic, sleep
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import Client
from pytest_django.fixtures import Settings

from analytics.heavy import manager_slot
from tests.analytics import test_views
from tests.analytics.test_views import Traffic
from tests.conftest import MakeAgent

pytestmark = pytest.mark.usefixtures("orders")

# test_views' traffic and signed-in manager.
clock = test_views.clock
traffic = test_views.traffic
manager = test_views.manager


def slow_statement() -> str:
    """A read that takes longer than any test waits, unless the statement timeout stops it."""
    if connection.vendor == "postgresql":
        return "SELECT pg_sleep(5)"
    # SQLite has no sleep: counting to a billion takes minutes.
    return (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000)"
        " SELECT count(*) FROM n"
    )


def run_slowly(*args: Any, **kwargs: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(slow_statement())
        cursor.fetchall()
    raise AssertionError("the statement ran to its end")


@pytest.fixture
def short_timeout(settings: Settings) -> None:
    settings.TOOLGATE_MANAGER_TIMEOUT_SECONDS = 0.3


@contextmanager
def every_slot_taken() -> Iterator[None]:
    """Another request holds the site's only slot: on PostgreSQL, a transaction of another
    connection (the slots are the database's); on SQLite, the process's semaphore."""
    if connection.vendor != "postgresql":
        with manager_slot() as taken:
            assert taken
            yield
        return
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), manager_slot() as taken:
                assert taken
                holding.set()
                done.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        yield
    finally:
        done.set()
        holder.join()


def agent_call(token: str) -> dict[str, Any]:
    response = Client().post(
        "/api/v1/calls",
        json.dumps(
            {
                "session_id": "s-busy",
                "customer_id": "CUS-1",
                "tool": "get_order",
                "arguments": {"order_id": "ORD-1001"},
            }
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


# Out of time -------------------------------------------------------------------------------------


def test_a_what_if_past_its_deadline_says_so_and_keeps_the_draft(
    traffic: Traffic, manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("analytics.what_if.manager_deadline", lambda request: monotonic() - 1)

    response = manager.get(
        "/analytics/what-if/",
        {"agent": str(traffic.shop.pk), "range": "24h", "BRL_auto_approve_below": "200"},
    )

    assert response.status_code == 503
    page = response.content.decode()
    assert "This range is too long to judge in time" in page
    assert "ask for a shorter range" in page
    assert 'name="BRL_auto_approve_below" value="200"' in page
    assert "rows" not in response.context


def test_the_what_if_api_past_its_deadline_answers_in_its_json_envelope(
    traffic: Traffic, manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("analytics.apis.manager_deadline", lambda request: monotonic() - 1)

    response = manager.get("/api/v1/metrics/what-if", {"agent": str(traffic.shop.pk)})

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert (error["status"], error["code"], error["retryable"]) == (503, "range_too_heavy", False)
    assert "shorter range" in error["message"]


@pytest.mark.usefixtures("short_timeout")
def test_the_what_if_s_read_is_stopped_by_the_statement_timeout(
    traffic: Traffic, manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "analytics.replay._money_calls_sql", lambda start, until: (slow_statement(), [])
    )
    started = monotonic()

    response = manager.get("/analytics/what-if/", {"agent": str(traffic.shop.pk)})

    assert monotonic() - started < 4
    assert response.status_code == 503
    assert "This range is too long to judge in time" in response.content.decode()


@pytest.mark.usefixtures("short_timeout")
def test_a_page_whose_statement_runs_out_of_time_says_so_not_500(
    manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("analytics.views.call_figures", run_slowly)
    started = monotonic()

    response = manager.get("/analytics/", {"range": "30d"})

    assert monotonic() - started < 4
    assert response.status_code == 503
    page = response.content.decode()
    assert "This range is too long to read in time" in page
    assert "0.3 seconds" in page


@pytest.mark.usefixtures("short_timeout")
def test_the_metrics_api_out_of_time_answers_in_its_json_envelope(
    manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("analytics.apis.call_figures", run_slowly)

    response = manager.get("/api/v1/metrics")

    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["code"], error["retryable"]) == ("range_too_heavy", False)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the statement timeout is PostgreSQL's setting"
)
@pytest.mark.usefixtures("short_timeout")
def test_the_statement_timeout_ends_with_the_manager_s_request(
    manager: Client, make_agent: MakeAgent
) -> None:
    _, token = make_agent()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        before = cursor.fetchone()

    assert manager.get("/analytics/").status_code == 200

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        assert cursor.fetchone() == before
    assert agent_call(token)["code"] == "OK"


# Slots -------------------------------------------------------------------------------------------


def test_when_every_slot_is_taken_managers_are_told_at_once_and_agents_are_answered(
    manager: Client, make_agent: MakeAgent
) -> None:
    _, token = make_agent()

    with every_slot_taken():
        started = monotonic()
        page = manager.get("/analytics/")
        api = manager.get("/api/v1/metrics/what-if", {"agent": "1"})
        waited = monotonic() - started
        answer = agent_call(token)

    assert waited < 1
    assert page.status_code == 503 and page["Retry-After"] == "2"
    assert "Other reports are running" in page.content.decode()
    assert api.status_code == 503 and api["Retry-After"] == "2"
    error = api.json()["error"]
    assert (error["code"], error["retryable"]) == ("managers_busy", True)
    assert (answer["code"], answer["data"]["order_id"]) == ("OK", "ORD-1001")
    # The slot is back once its holder is done.
    assert manager.get("/analytics/").status_code == 200


# Committed as in production: the request's transaction is the outermost, and its end lets the
# slot go (inside a test's transaction it would hold it until the test ends).
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("short_timeout")
def test_a_slot_is_let_go_however_the_request_ended(
    manager: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patched:
        patched.setattr("analytics.views.call_figures", run_slowly)
        assert manager.get("/analytics/").status_code == 503

    with every_slot_taken():
        busy = manager.get("/analytics/")

    assert busy.status_code == 503
    assert manager.get("/analytics/").status_code == 200


def test_an_anonymous_request_is_sent_to_log_in_without_waiting_for_a_slot(
    django_assert_num_queries: Any,
) -> None:
    anonymous = Client()

    with every_slot_taken():
        with django_assert_num_queries(0):
            page = anonymous.get("/analytics/")
        # Refused by the API's authentication (which records the refusal), not told it is busy.
        api = anonymous.get("/api/v1/metrics/what-if", {"agent": "1"})

    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    assert api.status_code in (401, 403)
    assert api.json()["error"]["code"] == "not_authenticated"


# The request's connection is the outermost one, as in production with CONN_MAX_AGE.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/analytics/", "/api/v1/metrics/what-if?agent=1"])
def test_a_connection_the_database_ended_is_a_retryable_503_then_the_page_again(
    manager: Client, path: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("ending a server's connection to the database needs PostgreSQL")
    assert manager.get("/analytics/").status_code == 200
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            sleep(0.01)

    try:
        lost = manager.get(path)
        again = manager.get("/analytics/")
    finally:
        connection.close()

    assert lost.status_code == 503 and lost["Retry-After"] == "2"
    if path.startswith("/api/"):
        error = lost.json()["error"]
        assert (error["code"], error["retryable"]) == ("database_unavailable", True)
    else:
        assert "The database is unavailable" in lost.content.decode()
    assert again.status_code == 200
