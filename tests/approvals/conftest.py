"""A receiver of webhooks on 127.0.0.1 (stdlib http.server in a thread), and held confirmations."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dispatch.models import Agent, Confirmation
from dispatch.services import call_dispatch


@dataclass(frozen=True)
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """What it received, in order; it answers each request with the next of `answers` (then 200),
    after `delay` seconds."""

    url: str
    received: list[ReceivedRequest] = field(default_factory=list)
    answers: deque[int] = field(default_factory=deque)
    delay: float = 0.0

    def wait_for(self, count: int, timeout: float = 30.0) -> list[ReceivedRequest]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.received)


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            receiver.received.append(ReceivedRequest(self.path, dict(self.headers.items()), body))
            time.sleep(receiver.delay)
            status = receiver.answers.popleft() if receiver.answers else 200
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/toolgate/events"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def hold_refund(
    agent: Agent, amount_cents: int = 6000, *, order_id: str = "ORD-1001", session: str = "s-1"
) -> Confirmation:
    """A refund of ORD-1001 (CUS-1, BRL) that the agent's policy holds for a reviewer."""
    arguments = {
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "BRL",
        "reason": "damaged",
    }
    result = call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="refund_order",
        arguments=json.dumps(arguments),
    )
    assert result.code == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result.data["confirmation_id"])
