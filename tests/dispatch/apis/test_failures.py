"""Whatever goes wrong, the agent API answers in its JSON envelope: a database that is away is a
503 the host may retry, an unexpected error a 500 with an id that is also in the log."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import requests
from django.db import connection
from django.test import Client
from pytest_django.live_server_helper import LiveServer

from dispatch.models import AuditRecord, SecurityEvent
from tests.conftest import AgentClient, ClientFor, Ledger, MakeAgent

ENVELOPE = json.dumps(
    {
        "session_id": "s-1",
        "customer_id": "CUS-1",
        "tool": "refund_order",
        "arguments": {
            "order_id": "ORD-1001",
            "amount_cents": 1000,
            "currency": "BRL",
            "reason": "damaged",
        },
    }
)


def error_of(response: requests.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["status"] == status
    error: dict[str, Any] = body["error"]
    return error


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class _GoneSqliteConnection:
    """The driver's connection to a database that went away: every statement fails."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self._real = real

    def cursor(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        raise sqlite3.OperationalError("disk I/O error")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def database_away() -> Iterator[None]:
    """The live server's database stops answering, and comes back afterwards."""
    if connection.vendor == "postgresql":
        # The server opens a connection per request from these settings (the same dict in every
        # thread): it is refused, as when PostgreSQL is down.
        settings_dict = connection.settings_dict
        kept = (settings_dict["HOST"], settings_dict["PORT"])
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", str(closed_port())
        try:
            yield
        finally:
            settings_dict["HOST"], settings_dict["PORT"] = kept
    else:
        # The test database is in memory, one connection shared with the live server and never
        # reopened, so it cannot be refused: the driver's connection itself fails instead.
        connection.ensure_connection()
        real = connection.connection
        connection.connection = _GoneSqliteConnection(real)
        try:
            yield
        finally:
            connection.connection = real


# 503: the database is away ---------------------------------------------------------------------


@pytest.mark.usefixtures("orders")
def test_a_database_that_is_away_is_a_retryable_503_in_the_envelope(
    api: AgentClient, ledger: Ledger
) -> None:
    with database_away():
        # Authentication reads the token's agent before any view runs.
        read = api.get("/api/v1/codes")
        call = api.post_body(ENVELOPE)

    for response in (read, call):
        error = error_of(response, 503)
        assert error["code"] == "database_unavailable"
        assert error["retryable"] is True
    assert api.get("/api/v1/codes").status_code == 200
    assert ledger.state() == (0, 0)
    assert AuditRecord.objects.count() == 0


@pytest.mark.urls("tests.dispatch.urls_with_faults")
def test_a_database_that_is_away_outside_an_api_view_is_a_503_too(api: AgentClient) -> None:
    with database_away():
        response = api.get("/api/v1/test/plain-query")

    error = error_of(response, 503)
    assert (error["code"], error["retryable"]) == ("database_unavailable", True)
    assert api.get("/api/v1/test/plain-query").text == "read"


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_database_dropped_is_a_retryable_503_in_the_envelope(
    make_agent: MakeAgent,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("dropping a server's connection to the database needs PostgreSQL")
    token = make_agent()[1]
    # Django's test client keeps its connection between requests, as production's CONN_MAX_AGE
    # does; PostgreSQL then ends it, as a restart or a failover would.
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/codes").status_code == 200
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            time.sleep(0.01)

    try:
        response = client.get("/api/v1/codes")
    finally:
        connection.close()

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "database_unavailable"
    assert response.json()["error"]["retryable"] is True


# 500: an unexpected error, with an id to find it in the log -------------------------------------


@pytest.mark.urls("tests.dispatch.urls_with_faults")
@pytest.mark.parametrize("path", ["/api/v1/test/fault", "/api/v1/test/plain-fault"])
def test_an_unexpected_error_is_a_500_in_the_envelope_with_its_id_in_the_log(
    api: AgentClient, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    with caplog.at_level(logging.ERROR):
        response = api.get(path)

    error = error_of(response, 500)
    assert (error["code"], error["retryable"]) == ("internal_error", False)
    error_id = error["error_id"]
    assert error_id in error["message"]
    assert "a fault on purpose" not in response.text
    logged = [record for record in caplog.records if error_id in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert "a fault on purpose" in str(logged[0].exc_info[1])


# Everything else under the prefix ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/calls/", "/api/v1/"])
def test_a_path_the_api_lacks_is_a_404_in_the_envelope(api: AgentClient, path: str) -> None:
    error = error_of(api.get(path), 404)

    assert error["code"] == "not_found"


def test_the_api_answers_json_to_a_client_that_asks_for_html(
    api: AgentClient, client_for: ClientFor
) -> None:
    html = {"Accept": "text/html"}

    codes = api.http.get(f"{api.base_url}/api/v1/codes", headers=api.headers(html), timeout=30)
    anonymous = client_for(None).post_body(ENVELOPE, headers=html)

    assert codes.status_code == 200
    assert codes.headers["Content-Type"] == "application/json"
    assert "codes" in codes.json()
    assert error_of(anonymous, 401)["code"] == "not_authenticated"


def test_a_host_the_server_does_not_serve_is_a_400_in_the_envelope(
    live_server: LiveServer,
) -> None:
    response = requests.get(
        f"{live_server.url}/api/v1/codes", headers={"Host": "evil.example"}, timeout=30
    )

    error = error_of(response, 400)
    assert error["code"] == "host_not_allowed"
    assert "evil.example" not in error["message"]
    event = SecurityEvent.objects.get()
    assert (event.status, event.reason, event.path) == (400, "host_not_allowed", "/api/v1/codes")


def test_pages_outside_the_api_keep_their_html_errors(live_server: LiveServer) -> None:
    response = requests.get(f"{live_server.url}/no-such-page", timeout=30)

    assert response.status_code == 404
    assert response.headers["Content-Type"].startswith("text/html")
