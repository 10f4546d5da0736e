"""Slow clients cannot stall the site: nginx reads each request whole before gunicorn sees it.

gunicorn's sync workers serve one request each, from its first byte to its last. A client that
sends its headers and then one byte of its body holds a worker for as long as it likes (until
gunicorn's timeout restarts the worker, 30 s); as many such clients as there are workers, and
every other request waits. Sent to nginx, the same clients hold nothing but a socket in nginx.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import requests

from tests.conftest import AgentClient
from tests.deploy.conftest import App
from tests.deploy.site import SERVER_NAME, Proxy

# More than the workers, so that every worker would be held and some wait in gunicorn's backlog.
EXTRA_SLOW_CLIENTS = 2
# "Well under a second" for a call while the slow clients hold their connections.
PROMPT_SECONDS = 1.0
# How long the call without the proxy is given before it counts as stalled.
STALLED_SECONDS = 3.0


def slow_request(token: str, *, stops_in: str) -> bytes:
    """A real call's request, cut short: after one byte of the body, or halfway through headers."""
    body = json.dumps({"session_id": "slow", "customer_id": "CUS-1", "tool": "get_order"})
    head = (
        "POST /api/v1/calls HTTP/1.1\r\n"
        f"Host: {SERVER_NAME}\r\n"
        "X-Forwarded-Proto: https\r\n"
        f"Authorization: Token {token}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    if stops_in == "body":
        return (head + body[:1]).encode()
    return head[: head.index("Authorization")].encode()


@contextmanager
def slow_clients(
    connect: Callable[[], socket.socket], request: bytes, count: int
) -> Iterator[None]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = connect()
            sockets.append(sock)
            sock.sendall(request)
        # Time for the server to take each of them up, as an attacker would leave it.
        time.sleep(0.5)
        yield
    finally:
        for sock in sockets:
            sock.close()


def get_order_seconds(client: AgentClient, order_id: str, customer: str) -> float:
    # A session of its own each time: the same call repeated in one session is a loop.
    session = f"timed-{uuid.uuid4().hex}"
    started = time.perf_counter()
    result = client.call("get_order", {"order_id": order_id}, session=session, customer=customer)
    elapsed = time.perf_counter() - started
    assert result["ok"], result
    return elapsed


@pytest.mark.parametrize("stops_in", ["body", "headers"])
def test_behind_nginx_a_call_answers_at_once_while_slow_clients_hold_connections(
    site_app: App, site_proxy: Proxy, proxy_client: AgentClient, stops_in: str
) -> None:
    order_id = site_app.site.database.order_create(customer_id="CUS-910")
    get_order_seconds(proxy_client, order_id, "CUS-910")
    tls = site_proxy.tls_context()

    def connect() -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", site_proxy.https_port), timeout=10)
        return tls.wrap_socket(raw, server_hostname=SERVER_NAME)

    request = slow_request(site_app.site.token, stops_in=stops_in)
    with slow_clients(connect, request, site_app.workers + EXTRA_SLOW_CLIENTS):
        seconds = [get_order_seconds(proxy_client, order_id, "CUS-910") for _ in range(5)]

    print(f"behind nginx, slow clients stopping in the {stops_in}: {_ms(seconds)}")
    assert max(seconds) < PROMPT_SECONDS


def test_without_nginx_slow_clients_stall_gunicorn(site_app: App) -> None:
    # The hole nginx closes, shown on the same gunicorn: what an agent host would meet if it
    # reached gunicorn directly.
    client = site_app.client()
    order_id = site_app.site.database.order_create(customer_id="CUS-911")
    get_order_seconds(client, order_id, "CUS-911")

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", site_app.port), timeout=10)

    envelope = {"session_id": "stalled", "customer_id": "CUS-911", "tool": "get_order"}
    envelope["arguments"] = json.dumps({"order_id": order_id})
    request = slow_request(site_app.site.token, stops_in="body")
    with (
        slow_clients(connect, request, site_app.workers + EXTRA_SLOW_CLIENTS),
        pytest.raises(requests.Timeout),
    ):
        started = time.perf_counter()
        client.http.post(
            f"{site_app.url}/api/v1/calls",
            data=json.dumps(envelope),
            headers=client.headers(),
            timeout=STALLED_SECONDS,
        )

    print(f"gunicorn alone: no answer within {time.perf_counter() - started:.1f} s")
    _wait_for_gunicorn(client, order_id, "CUS-911")


def _wait_for_gunicorn(client: AgentClient, order_id: str, customer: str) -> None:
    """Once the slow clients are gone gunicorn answers again, for the tests that follow."""
    deadline = time.monotonic() + 60
    while True:
        try:
            get_order_seconds(client, order_id, customer)
            return
        except requests.RequestException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _ms(seconds: list[float]) -> str:
    return ", ".join(f"{s * 1000:.0f} ms" for s in seconds)
