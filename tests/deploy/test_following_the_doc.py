"""What docs/deploy.md's step 1 sets up, followed to the letter: the shared environment file (with
nginx as the one trusted proxy), the owner's file, and each command's role.

The site of tests/deploy/conftest.py writes those files from the page and runs every command as
the page's table says (tests/deploy/site.py); these tests check what that buys: a lockout behind
nginx is one client address's, not everyone's; the owner's commands work as the owner; and the
MCP server starts beside gunicorn with the same shared file.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from requests.adapters import HTTPAdapter

from tests.conftest import AgentClient
from tests.deploy.conftest import App
from tests.deploy.site import (
    Proxy,
    Service,
    doc_environment,
    doc_roles,
    free_port,
    listening,
    wait_until,
)


def test_the_page_runs_each_command_as_the_role_it_needs() -> None:
    roles = doc_roles()
    shared, owner = doc_environment()

    owned = ("migrate", "db_roles", "rebuild_rollups", "load_retail")
    assert {name: roles.get(name) for name in owned} == dict.fromkeys(owned, "owner")
    served = ("gunicorn", "celery worker", "celery beat", "mcp_serve", "create_agent")
    assert {name: roles.get(name) for name in served} == dict.fromkeys(served, "app")
    # Behind nginx, the client is the address nginx wrote.
    assert shared["TOOLGATE_TRUSTED_PROXY_COUNT"] == "1"
    assert "toolgate_app:" in shared["DATABASE_URL"]
    assert "toolgate_owner:" in owner["DATABASE_URL"]
    assert not {"GUNICORN_BIND", "WEB_CONCURRENCY"} & set(shared)


class FromAddress(HTTPAdapter):
    """Connections made from a loopback address of our choosing (127.0.0.0/8 is all this
    machine's), as clients on different hosts would be."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


BrowserFrom = Callable[[str], requests.Session]


@pytest.fixture
def browser_from(site_proxy: Proxy) -> Iterator[BrowserFrom]:
    sessions: list[requests.Session] = []

    def make(address: str) -> requests.Session:
        session = requests.Session()
        session.mount("https://", FromAddress(address))
        session.verify = str(site_proxy.certificate)
        session.trust_env = False
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()


def _log_in(browser: requests.Session, url: str, username: str, password: str) -> requests.Response:
    browser.get(url, timeout=30)
    return browser.post(
        url,
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
        headers={"Referer": url},
        allow_redirects=False,
        timeout=30,
    )


def test_behind_nginx_bad_passwords_lock_out_their_address_and_no_other(
    site_app: App, site_proxy: Proxy, browser_from: BrowserFrom
) -> None:
    site, password = site_app.site, secrets.token_urlsafe(16)
    username = f"locked-{secrets.token_hex(3)}"
    site.production.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        username,
        "--email",
        "locked@example.com",
        DJANGO_SUPERUSER_PASSWORD=password,
    )
    login = f"{site_proxy.url}/accounts/login/"
    attacker, user = browser_from("127.0.0.2"), browser_from("127.0.0.3")

    refused = [_log_in(attacker, login, username, f"wrong-{n}").status_code for n in range(5)]
    locked = _log_in(attacker, login, username, password)
    elsewhere = _log_in(user, login, username, password)

    # The form again with its error, and the fifth failure is answered as a lockout.
    assert refused == [200, 200, 200, 200, 429]
    assert locked.status_code == 429, locked.text[:300]
    assert elsewhere.status_code == 302, elsewhere.text[:300]
    assert "sessionid" in user.cookies
    with site.database.connect(site.database.owner) as connection:
        addresses = connection.execute(
            "SELECT host(ip_address) FROM axes_accessattempt WHERE username = %s", [username]
        ).fetchall()
    assert addresses == [("127.0.0.2",)]


def test_the_rollups_are_rebuilt_and_checked_as_the_owner(
    site_app: App, proxy_client: AgentClient
) -> None:
    site = site_app.site
    order_id = site.database.order_create(total_cents=9_000, customer_id="CUS-930")
    proxy_client.refund(1000, order_id=order_id, session="rollups-1", customer="CUS-930")
    assert site.production.role_of("rebuild_rollups") == site.database.owner

    rebuilt = site.production.manage("rebuild_rollups")
    checked = site.production.manage("rebuild_rollups", "--check")

    assert "Rebuilt" in rebuilt
    assert "agree" in checked


@pytest.fixture
def mcp_server(site_app: App) -> Iterator[tuple[Service, int]]:
    """`mcp_serve --transport http` as docs/deploy.md's unit runs it, with WEB_CONCURRENCY in its
    environment as if the shared file set it for gunicorn: it is one process whatever it says."""
    production = site_app.site.production
    port = free_port()
    env = {**production.env_of("mcp_serve"), "WEB_CONCURRENCY": "3"}
    server = Service(
        "mcp_serve",
        [sys.executable, "manage.py", "mcp_serve", "--transport", "http", "--port", str(port)],
        env=env,
        log=production.directory / "mcp.log",
    )
    try:
        wait_until(lambda: listening(port), what="mcp_serve", process=server)
        yield server, port
    finally:
        server.stop(signal.SIGTERM)


def test_the_mcp_server_starts_beside_gunicorn_and_answers_as_the_application_role(
    site_app: App, mcp_server: tuple[Service, int]
) -> None:
    server, port = mcp_server
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "deploy-test", "version": "1"},
        },
    }

    response = requests.post(
        f"http://127.0.0.1:{port}/mcp",
        data=json.dumps(initialize),
        headers={
            "Authorization": f"Bearer {site_app.site.token}",
            "X-Toolgate-Customer": "CUS-940",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        timeout=30,
    )

    assert response.status_code == 200, response.text[:500]
    assert '"serverInfo"' in response.text
    assert server.alive()
