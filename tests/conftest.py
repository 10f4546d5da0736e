"""Shared pytest fixtures for the whole suite.

The API is tested as an agent host uses it: real HTTP against pytest-django's live server, with
a token from `agent_create`. `ledger` reads the refund ledger, the side effect that matters.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from io import StringIO
from typing import Any, Protocol

import pytest
import redis
import requests
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Sum
from django.test import Client, RequestFactory
from hypothesis import settings as hypothesis_settings
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from dispatch.models import Agent, Confirmation
from dispatch.services import agent_create
from dispatch.store.allowance import allowance_connections_close_all
from dispatch.store.guards import CONFIRMATION_LIFECYCLE_TRIGGER as _LIFECYCLE
from dispatch.throttling import local_request_log
from orders.models import Order, Refund
from tests.factories import OrderFactory
from tests.workers import broker, own_redis, start_worker  # noqa: F401  (the suite's fixtures)
from toolgate_client import Toolgate

# Speed is measured in bench/, not asserted here: on a busy two-core machine one example can take
# longer than Hypothesis' default deadline of 200 ms without anything being wrong.
hypothesis_settings.register_profile("toolgate", deadline=None)
hypothesis_settings.load_profile("toolgate")

# A policy under which a refund of 1000 runs at once, 5000 or more is held, 20000 needs two.
DEFAULT_POLICY: dict[str, Any] = {
    "allowed_tools": ["get_order", "refund_order"],
    "max_amount_cents": 50_000,
    "auto_approve_below_cents": 5_000,
    "two_reviewers_from_cents": 20_000,
    "step_budget": 20,
    "repeat_limit": 3,
    "confirmation_ttl_seconds": 3600,
}

_agent_names = itertools.count(1)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # The throttle counts requests in this process, or in the cache when that is Redis: one
    # test's requests must not count in the next.
    local_request_log.clear()
    cache.clear()
    yield
    local_request_log.clear()
    cache.clear()


class LoginClient(Client):
    """Django's test client, whose login() gives axes the request it counts attempts by."""

    def login(self, **credentials: Any) -> bool:
        # Axes refuses to authenticate without a request; the test client's login() passes none,
        # so it gets one from the address the client's own requests come from.
        credentials.setdefault("request", RequestFactory().post(settings.LOGIN_URL))
        return super().login(**credentials)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    yield
    # The reservations' own connections would keep the test database from being dropped.
    allowance_connections_close_all()


@pytest.fixture(autouse=True)
def _forget_reserved_money(request: pytest.FixtureRequest, django_db_blocker: Any) -> None:
    """On PostgreSQL a reservation under an agent's daily cap commits on a connection of its own
    (dispatch/store/allowance.py), outside the transaction a test rolls back: each test starts
    with none. They are deleted before
    the test rather than after it, when the test's own transaction, not rolled back yet, may hold
    some of their rows (a decision moves held money on the test's connection). Truncated: a
    reservation is never deleted (its protocol's trigger refuses it)."""
    uses_db = request.node.get_closest_marker("django_db") or any(
        name in request.fixturenames for name in ("db", "transactional_db", "live_server")
    )
    if not uses_db or connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock():
        side = connections[DEFAULT_DB_ALIAS].copy()
        try:
            with side.cursor() as cursor:
                cursor.execute("TRUNCATE dispatch_movement")
        finally:
            side.close()


def confirmation_rewrite(confirmation_id: str, **fields: Any) -> None:
    """Test set-up only: change what a confirmation's lifecycle keeps (when it was held, what the
    host said, a status no path reaches from where it is), as the tables' owner can, with the
    lifecycle's trigger off for the statement."""
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic(), connection.cursor() as cursor:
        if postgresql:
            # An ALTER waits for no deferred check of the rows this transaction wrote.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE dispatch_confirmation DISABLE TRIGGER {_LIFECYCLE}")
        Confirmation.objects.filter(pk=confirmation_id).update(**fields)
        if postgresql:
            cursor.execute(f"ALTER TABLE dispatch_confirmation ENABLE TRIGGER {_LIFECYCLE}")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


@pytest.fixture
def client() -> Client:
    """pytest-django's client, with a login() that works with axes (see LoginClient)."""
    return LoginClient()


def require_service(available: bool, reason: str) -> None:
    """Skip a test whose service (PostgreSQL, Redis, a server) is missing on this machine, or fail
    it where TOOLGATE_REQUIRE_SERVICES=1 (CI, which starts them all): there it must run."""
    if available:
        return
    if os.environ.get("TOOLGATE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (TOOLGATE_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis database the tests may write to, after checking that it answers."""
    url = os.environ.get("TOOLGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/4")
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2) as client:
            client.ping()
        available = True
    except redis.RedisError:
        available = False
    require_service(available, f"needs Redis at {url} (TOOLGATE_TEST_REDIS_URL)")
    return url


@pytest.fixture
def redis_cache(redis_url: str, settings: Settings) -> str:
    """The default cache on Redis, as production has it; returns its key prefix, one per test so
    that tests never see each other's keys (they expire on their own)."""
    prefix = f"test-{uuid.uuid4().hex}"
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": prefix,
        }
    }
    return prefix


MakeAgent = Callable[..., tuple[Agent, str]]


@pytest.fixture
def make_agent(db: None) -> MakeAgent:
    """An agent with DEFAULT_POLICY, any field overridden; returns (agent, token)."""

    def make(name: str | None = None, **policy: Any) -> tuple[Agent, str]:
        return agent_create(
            name=name or f"agent-{next(_agent_names)}", **{**DEFAULT_POLICY, **policy}
        )

    return make


@dataclass
class AgentClient:
    """An agent host on real HTTP, through toolgate_client: `call()` is the client's own call (its
    result as a dict); `post_body()` and `post_call()` post what a well-behaved client never
    sends (hostile bodies, odd envelopes, other headers) and return the raw response."""

    base_url: str
    token: str | None
    http: requests.Session = field(default_factory=requests.Session)
    toolgate: Toolgate = field(init=False)

    def __post_init__(self) -> None:
        self.toolgate = Toolgate(
            self.base_url,
            self.token,
            session_id="s-1",
            customer_id="CUS-1",
            timeout=60,
            http=self.http,
        )

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Token {self.token}"
        headers.update(extra or {})
        return headers

    def post_body(
        self, body: bytes | str, *, headers: Mapping[str, str] | None = None
    ) -> requests.Response:
        return self.toolgate.request(
            "POST", "/api/v1/calls", data=body, headers=self.headers(headers)
        )

    def post_call(
        self,
        tool: str,
        arguments: Any,
        *,
        session: str = "s-1",
        customer: str = "CUS-1",
        context: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        envelope = {
            "session_id": session,
            "customer_id": customer,
            "tool": tool,
            "arguments": arguments,
        }
        if context is not None:
            envelope["context"] = context
        return self.post_body(json.dumps(envelope), headers=headers)

    def call(
        self,
        tool: str,
        arguments: Any,
        *,
        session: str = "s-1",
        customer: str = "CUS-1",
        context: str | None = None,
    ) -> dict[str, Any]:
        """A call that reaches the pipeline: always a result (an envelope error raises)."""
        result = self.toolgate.call(
            tool, arguments, session_id=session, customer_id=customer, context=context
        )
        return result.as_dict()

    def refund(
        self,
        amount_cents: Any = 1000,
        *,
        order_id: str = "ORD-1001",
        currency: str = "BRL",
        reason: str = "damaged",
        raw: bool = True,
        **envelope: str,
    ) -> dict[str, Any]:
        arguments = {
            "order_id": order_id,
            "amount_cents": amount_cents,
            "currency": currency,
            "reason": reason,
        }
        return self.call("refund_order", json.dumps(arguments) if raw else arguments, **envelope)

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.toolgate.request("GET", path, params=params, headers=self.headers())


ClientFor = Callable[[str | None], AgentClient]


@pytest.fixture
def client_for(live_server: LiveServer) -> Iterator[ClientFor]:
    """A client of the live server with the given token (None sends no Authorization)."""
    clients: list[AgentClient] = []

    def make(token: str | None) -> AgentClient:
        client = AgentClient(live_server.url, token)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.http.close()


@pytest.fixture
def agent(make_agent: MakeAgent) -> tuple[Agent, str]:
    return make_agent()


@pytest.fixture
def api(client_for: ClientFor, agent: tuple[Agent, str]) -> AgentClient:
    """The default agent's client."""
    return client_for(agent[1])


@pytest.fixture
def orders(db: None) -> dict[str, Order]:
    """ORD-1001 of CUS-1 (12000 BRL) and ORD-1002 of CUS-2 (4500 USD)."""
    return {
        "ORD-1001": OrderFactory.create(
            order_id="ORD-1001", customer_id="CUS-1", total_cents=12_000
        ),
        "ORD-1002": OrderFactory.create(
            order_id="ORD-1002", customer_id="CUS-2", total_cents=4_500, currency="USD"
        ),
    }


class Ledger:
    """The refund ledger of one order; every read also checks the invariant."""

    def state(self, order_id: str = "ORD-1001") -> tuple[int, int]:
        """(ledger rows, refunded_cents) of the order."""
        order = Order.objects.get(order_id=order_id)
        rows = Refund.objects.filter(order=order)
        total = rows.aggregate(total=Sum("amount_cents"))["total"] or 0
        assert total == order.refunded_cents <= order.total_cents
        return rows.count(), order.refunded_cents

    def rows(self) -> int:
        """Ledger rows of every order."""
        return Refund.objects.count()


@pytest.fixture
def ledger(db: None) -> Ledger:
    return Ledger()


class Run(Protocol):
    def __call__(self, name: str, *args: str, **options: Any) -> str: ...


@pytest.fixture
def run() -> Run:
    """Run a command; returns its standard output (its standard error is discarded)."""

    def call(name: str, *args: str, **options: Any) -> str:
        out = StringIO()
        call_command(name, *args, stdout=out, stderr=StringIO(), no_color=True, **options)
        return out.getvalue()

    return call


def printed_token(output: str) -> str:
    match = re.search(r"^Token: (\S+)$", output, re.M)
    assert match is not None, output
    return match.group(1)


# What the fault tests measured (calls, retries, kills, seconds to recover...), printed at the end
# of the run so that it shows in CI's log.
_figures: list[str] = []


class Figures(Protocol):
    def __call__(self, **values: Any) -> None: ...


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    def report(**values: Any) -> None:
        line = f"{request.node.nodeid}: " + ", ".join(f"{k}={v}" for k, v in values.items())
        _figures.append(line)
        print(f"\nfigures: {line}")

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.section("figures")
        for line in _figures:
            terminalreporter.write_line(line)
