"""The agent throttle, and the throttle of failed authentications per address, hold across web
processes: gunicorn with several workers, production settings, PostgreSQL and Redis, and more
requests at once than the rate allows.

Each worker used to count alone in its own memory, so four workers let through about four times
the rate. The test runs in its own database (test_<name>_gunicorn, made, migrated and dropped
here) because the server is a separate process that cannot see the test's transaction.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import environ
import psycopg
import pytest
import requests
from psycopg import sql

from tests.conftest import printed_token, require_service

ROOT = Path(__file__).resolve().parent.parent.parent
WORKERS = 4
RATE = 60
SENT = 150
AUTH_FAILURES = 20
BAD_TOKENS = 300


def database_url() -> dict[str, str]:
    """The test run's PostgreSQL server, from DATABASE_URL (the suite's own database)."""
    url = os.environ.get("DATABASE_URL", "")
    config = environ.Env.db_url_config(url) if url else {}
    require_service(
        config.get("ENGINE") == "django.db.backends.postgresql",
        "needs PostgreSQL: run the suite with DATABASE_URL=postgres://...",
    )
    return {key: str(config.get(key) or "") for key in ("NAME", "USER", "HOST", "PORT")}


@pytest.fixture
def server_database() -> Iterator[str]:
    """An empty database beside the suite's, for the server; its URL. Dropped afterwards."""
    config = database_url()
    name = f"test_{config['NAME']}_gunicorn"
    port = config["PORT"] or "5432"
    admin = f"postgresql://{config['USER']}@{config['HOST']}:{port}/postgres"
    try:
        connection = psycopg.connect(admin, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        require_service(False, f"needs PostgreSQL at {config['HOST']}:{port}: {error}")
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with connection:
        connection.execute(drop)
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"postgres://{config['USER']}@{config['HOST']}:{port}/{name}"
        finally:
            connection.execute(drop)


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    access_log: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def production_env(server_database: str, redis_url: str) -> dict[str, str]:
    """Production settings as a deployment sets them, on plain HTTP on loopback."""
    require_service(importlib.util.find_spec("gunicorn") is not None, "needs gunicorn")
    separator = "&" if "?" in redis_url else "?"
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "TOOLGATE_AUDIT_KEYS": f"1:{secrets.token_hex(32)}",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "False",
        "DATABASE_URL": server_database,
        # A key prefix of its own: earlier runs' counts (for the same agent id) are not seen.
        "CACHE_URL": f"{redis_url}{separator}key_prefix=gunicorn-{uuid.uuid4().hex}",
        "CELERY_BROKER_URL": "",
        "AGENT_THROTTLE_RATE": f"{RATE}/min",
        "AUTH_FAILURE_RATE": f"{AUTH_FAILURES}/min",
        # As behind nginx; a request with no X-Forwarded-For is counted under its peer.
        "TOOLGATE_TRUSTED_PROXY_COUNT": "1",
        "LOG_LEVEL": "WARNING",
        # WhiteNoise warns that STATIC_ROOT does not exist: the API serves no static files.
        "PYTHONWARNINGS": "ignore:No directory at:UserWarning",
    }


def manage(env: dict[str, str], *args: str) -> str:
    completed = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


@pytest.fixture
def gunicorn(production_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    access_log = tmp_path / "access.log"
    server_log = tmp_path / "server.log"
    output = server_log.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "toolgate.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            f"--workers={WORKERS}",
            # The application is loaded before the workers fork, so all are ready together.
            "--preload",
            "--timeout=60",
            f"--access-logfile={access_log}",
            # The worker's process id and the status, to see that several workers answered.
            "--access-logformat=%(p)s %(s)s %(U)s",
        ],
        cwd=ROOT,
        env=production_env,
        # Django logs each 429 as a warning: kept in a file, out of the test's output.
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    server = Server(f"http://127.0.0.1:{port}", process, access_log)
    try:
        wait_until_it_answers(server, server_log)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        output.close()


def wait_until_it_answers(server: Server, server_log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server_log.read_text()
        try:
            # The OpenAPI schema: not throttled, so it spends none of the agent's rate, and it
            # needs no static files (the pages' layout does, and this site has no collectstatic).
            if requests.get(f"{server.url}/api/schema/", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"gunicorn did not answer within 60 s: {server_log.read_text()}")


def send_all_at_once(server: Server, token: str, count: int) -> list[requests.Response]:
    start = threading.Barrier(count)

    def send(number: int) -> requests.Response:
        envelope = {
            "session_id": f"s-{number}",
            "customer_id": "CUS-1",
            "tool": "get_order",
            "arguments": {"order_id": "ORD-1001"},
        }
        start.wait(timeout=60)
        return requests.post(
            f"{server.url}/api/v1/calls",
            data=json.dumps(envelope),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
            timeout=120,
        )

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(send, range(count)))


@pytest.fixture
def token(production_env: dict[str, str]) -> str:
    """The server's database migrated, and an agent made in it as an operator makes one."""
    manage(production_env, "migrate", "--no-input", "-v", "0")
    return printed_token(manage(production_env, "create_agent", "limited", "--tools", "get_order"))


def test_workers_together_let_through_exactly_the_rate_and_answer_the_rest_429(
    token: str, gunicorn: Server
) -> None:
    responses = send_all_at_once(gunicorn, token, SENT)

    statuses = Counter(response.status_code for response in responses)
    assert statuses == {200: RATE, 429: SENT - RATE}, statuses
    # What passed reached the pipeline: the order does not exist in this empty database.
    passed = [response.json() for response in responses if response.status_code == 200]
    assert {result["code"] for result in passed} == {"ORDER_NOT_FOUND"}
    refused = [response for response in responses if response.status_code == 429]
    assert {response.json()["error"]["code"] for response in refused} == {"throttled"}
    assert all(0 < int(response.headers["Retry-After"]) <= 60 for response in refused)
    served_by = Counter(
        line.split()[0]
        for line in gunicorn.access_log.read_text().splitlines()
        if line.endswith("/api/v1/calls")
    )
    assert len(served_by) > 1, served_by
    assert sum(served_by.values()) == SENT


def test_workers_together_answer_a_flood_of_bad_tokens_with_the_rate_in_401s_and_bounded_events(
    token: str, gunicorn: Server, production_env: dict[str, str]
) -> None:
    attacker, neighbour = "203.0.113.7", "198.51.100.20"

    def post(authorization: str, address: str) -> requests.Response:
        envelope = {
            "session_id": "s-1",
            "customer_id": "CUS-1",
            "tool": "get_order",
            "arguments": {"order_id": "ORD-1001"},
        }
        return requests.post(
            f"{gunicorn.url}/api/v1/calls",
            data=json.dumps(envelope),
            headers={
                "Authorization": authorization,
                "Content-Type": "application/json",
                # What nginx appends; the client's own entry, to the left, is ignored.
                "X-Forwarded-For": f"10.0.0.{len(authorization) % 250}, {address}",
            },
            timeout=120,
        )

    # The good token works from the attacker's address before the flood: it is known.
    assert post(f"Token {token}", attacker).status_code == 200
    threads, each = 30, BAD_TOKENS // 30
    start = threading.Barrier(threads)

    def guess(number: int) -> list[int]:
        start.wait(timeout=60)
        return [post(f"Token tg_guess-{number}-{k}", attacker).status_code for k in range(each)]

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        statuses = Counter(status for row in pool.map(guess, range(threads)) for status in row)
    seconds = time.monotonic() - began
    known = post(f"Token {token}", attacker)
    neighbour_good = post(f"Token {token}", neighbour)
    neighbour_bad = post("Token tg_guess-neighbour", neighbour)
    with psycopg.connect(
        production_env["DATABASE_URL"].replace("postgres://", "postgresql://")
    ) as db:
        rows = db.execute(
            "SELECT client_address::text, status, reason, count(*) FROM dispatch_securityevent "
            "GROUP BY 1, 2, 3 ORDER BY 1, 2"
        ).fetchall()
    print(
        f"\n{BAD_TOKENS} bad tokens from one address on {WORKERS} workers in {seconds:.1f} s: "
        f"{dict(statuses)}; security events {rows}"
    )

    assert statuses == {401: AUTH_FAILURES, 429: BAD_TOKENS - AUTH_FAILURES}, statuses
    assert known.status_code == 200
    assert (neighbour_good.status_code, neighbour_bad.status_code) == (200, 401)
    assert [(address.split("/")[0], status, reason, n) for address, status, reason, n in rows] == [
        (neighbour, 401, "authentication_failed", 1),
        (attacker, 401, "authentication_failed", AUTH_FAILURES),
        (attacker, 429, "authentication_throttled", 1),
    ]
