"""Held refunds to decide, the reviewers who decide them, and a receiver of webhooks on 127.0.0.1
(stdlib http.server in a thread)."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from analytics.permissions import MANAGERS_GROUP
from approvals.selectors import REVIEWERS_GROUP
from dispatch.models import Agent, Confirmation
from dispatch.pipeline.results import CallResult
from dispatch.services import call_dispatch
from orders.models import Order
from tests.conftest import MakeAgent
from tests.factories import OrderFactory

HeldRefund = Callable[..., Confirmation]


@pytest.fixture
def order(db: None) -> Order:
    return OrderFactory.create(order_id="ORD-3001", customer_id="CUS-7", total_cents=90_000)


@pytest.fixture
def holding_agent(make_agent: MakeAgent) -> Agent:
    # Refunds from 50.00 are held; from 200.00 two reviewers decide.
    return make_agent(auto_approve_below_cents=5_000, two_reviewers_from_cents=20_000)[0]


def refund_call(
    agent: Agent, amount_cents: int, *, session: str = "s-1", order_id: str = "ORD-3001"
) -> CallResult:
    return call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-7",
        tool="refund_order",
        arguments=json.dumps(
            {
                "order_id": order_id,
                "amount_cents": amount_cents,
                "currency": "BRL",
                "reason": "damaged",
            }
        ),
    )


@pytest.fixture
def held_refund(holding_agent: Agent, order: Order) -> HeldRefund:
    def hold(amount_cents: int = 6_000, **extra: Any) -> Confirmation:
        result = refund_call(holding_agent, amount_cents, **extra)
        assert result.code == "CONFIRMATION_REQUIRED", result.message
        return Confirmation.objects.get(pk=result.data["confirmation_id"])

    return hold


@pytest.fixture
def reviewers(db: None) -> list[User]:
    group, _ = Group.objects.get_or_create(name="reviewers")
    people = [User.objects.create_user(name, password="pw") for name in ("ana", "bruno", "carla")]
    for person in people:
        person.groups.add(group)
    return people


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


def refund_held_for(
    agent: Agent, amount_cents: int = 6000, *, order_id: str = "ORD-1001", session: str = "s-1"
) -> Confirmation:
    """A refund of ORD-1001 (CUS-1, BRL, the `orders` fixture's) held for a reviewer."""
    result = call_dispatch(
        agent=agent,
        session_id=session,
        customer_id="CUS-1",
        tool="refund_order",
        arguments=json.dumps(
            {
                "order_id": order_id,
                "amount_cents": amount_cents,
                "currency": "BRL",
                "reason": "damaged",
            }
        ),
    )
    assert result.code == "CONFIRMATION_REQUIRED", result
    return Confirmation.objects.get(pk=result.data["confirmation_id"])


Verify = Callable[..., bool]


@pytest.fixture(scope="module")
def documented_verify() -> Verify:
    """The few lines of docs/webhooks.md that a host uses to check a signature, run as written."""
    text = (Path(__file__).parents[2] / "docs" / "webhooks.md").read_text()
    match = re.search(r"```python\n(.*?def toolgate_signature_valid.*?)```", text, re.S)
    assert match is not None, "docs/webhooks.md has no python block defining the check"
    namespace: dict[str, Any] = {}
    exec(match.group(1), namespace)
    verify: Verify = namespace["toolgate_signature_valid"]
    return verify


# The reviewer pages' fixtures: users by role, and refunds of the tests' usual orders held by the
# real pipeline.

_sessions = itertools.count(1)

# What the queue says is held, in the installed domains' words: the refunds of orders, and the
# cancellations, order changes, returns, exchanges and address changes of the retail desk.
HELD_ACTIONS = "refunds, cancellations, order changes, returns, exchanges and address changes"

MakeUser = Callable[..., User]
HoldRefund = Callable[..., Confirmation]


@pytest.fixture
def make_user(db: None) -> MakeUser:
    """A user in the given groups (none by default), with the password `pw`."""

    def make(username: str, *groups: str, **fields: Any) -> User:
        user = User.objects.create_user(username, password="pw", **fields)
        for name in groups:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
        return user

    return make


@pytest.fixture
def reviewer(make_user: MakeUser) -> User:
    return make_user("rita", REVIEWERS_GROUP)


@pytest.fixture
def manager(make_user: MakeUser) -> User:
    return make_user("max", MANAGERS_GROUP, is_staff=True)


@pytest.fixture
def hold_refund(holding_agent: Agent, orders: dict[str, Order]) -> HoldRefund:
    """A refund of ORD-1001 (CUS-1, 120,00 BRL) or another order, held for a human."""

    def hold(
        amount_cents: int = 6_000,
        *,
        order_id: str = "ORD-1001",
        currency: str = "BRL",
        customer_id: str = "CUS-1",
        session_id: str | None = None,
        reason: str = "damaged",
    ) -> Confirmation:
        result = call_dispatch(
            agent=holding_agent,
            session_id=session_id or f"s-{next(_sessions)}",
            customer_id=customer_id,
            tool="refund_order",
            arguments={
                "order_id": order_id,
                "amount_cents": amount_cents,
                "currency": currency,
                "reason": reason,
            },
        )
        assert result.code == "CONFIRMATION_REQUIRED", result
        return Confirmation.objects.get(pk=result.data["confirmation_id"])

    return hold
