"""examples/webhook_receiver.py takes what Toolgate sends, stores a repeat once, and refuses a
replay under a fresh delivery id: the receiver side of docs/webhooks.md, on real HTTP."""

from __future__ import annotations

import importlib.util
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
import requests
from django.db import transaction
from pytest_django.fixtures import Settings

from approvals.models import WebhookDelivery
from approvals.webhooks import webhook_body, webhook_deliver, webhook_enqueue, webhook_signature
from dispatch.models import Agent
from dispatch.webhooks import agent_webhook_set
from tests.approvals.conftest import refund_held_for
from tests.conftest import MakeAgent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("orders")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "webhook_receiver.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_receiver", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def receiving(
    make_agent: MakeAgent, settings: Settings, tmp_path: Path
) -> Iterator[tuple[Agent, str, str, Path]]:
    """An agent whose webhook is the example, running; the agent, the URL, the secret and the
    example's database."""
    settings.DEBUG = True
    settings.TOOLGATE_WEBHOOK_ALLOW_PRIVATE = True
    agent, _ = make_agent()
    database = tmp_path / "events.sqlite3"
    # The secret is made when the URL is set; the receiver is started with it, on that port.
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_address[1]}/toolgate/events"
    secret = agent_webhook_set(agent=agent, url=url)
    assert secret is not None
    server.RequestHandlerClass = example().receiver(secret, str(database))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield agent, url, secret, database
    finally:
        server.shutdown()
        server.server_close()


def stored(database: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(database) as db:
        return db.execute("SELECT delivery_id, event FROM event ORDER BY delivery_id").fetchall()


def test_the_example_receiver_stores_an_event_once_and_refuses_a_replay_under_a_fresh_id(
    receiving: tuple[Agent, str, str, Path],
) -> None:
    agent, url, secret, database = receiving
    with transaction.atomic():
        webhook_enqueue(confirmation=refund_held_for(agent), event="approved")
    delivery = webhook_deliver(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery is not None and delivery.status == "delivered"
    # What Toolgate sent, sent again within the window: as it was, and under a fresh id.
    body = webhook_body(delivery)
    signature = webhook_signature(
        secret=secret, timestamp=int(time.time()), delivery_id=str(delivery.pk), body=body
    )

    def replay(delivery_id: str) -> requests.Response:
        headers = {
            "Content-Type": "application/json",
            "Toolgate-Signature": signature,
            "Toolgate-Delivery": delivery_id,
        }
        return requests.post(url, data=body, headers=headers, timeout=10)

    again = replay(str(delivery.pk))
    fresh = replay(str(delivery.pk + 1000))

    assert (again.status_code, again.json()) == (200, {"stored": False})
    assert (fresh.status_code, fresh.json()) == (401, {"stored": False})
    assert stored(database) == [(str(delivery.pk), "approved")]
