"""Failed authentications are throttled per client address, across web processes, and the
security events they leave are bounded; other addresses and known good tokens are still served.

Each test runs on the embedded default's per-process log and on Redis, as production has it.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings
from rest_framework.exceptions import AuthenticationFailed

from dispatch.auth_failures import address_key
from dispatch.authentication import AgentTokenAuthentication
from dispatch.errors import AuthenticationThrottled
from dispatch.models import SecurityEvent
from tests.conftest import MakeAgent

pytestmark = pytest.mark.django_db

LIMIT = 10
FLOOD = 40
ATTACKER = "203.0.113.7"
NEIGHBOUR = "198.51.100.20"


@pytest.fixture(params=["per-process", "redis"])
def counted_in(request: pytest.FixtureRequest, settings: Settings) -> str:
    """Each test runs on both logs: the embedded default's and Redis (skipped when absent)."""
    if request.param == "redis":
        request.getfixturevalue("redis_cache")
    settings.TOOLGATE_AUTH_FAILURE_RATE = f"{LIMIT}/min"
    return str(request.param)


def get_tools(token: str | None, address: str, **headers: str) -> Any:
    meta: dict[str, Any] = {"REMOTE_ADDR": address, **headers}
    if token is not None:
        meta["HTTP_AUTHORIZATION"] = f"Token {token}"
    return Client().get("/api/v1/tools", **meta)


def events() -> list[tuple[str | None, int, str]]:
    rows = SecurityEvent.objects.order_by("pk")
    return [(row.client_address, row.status, row.reason) for row in rows]


def test_a_flood_of_bad_tokens_gets_the_rate_in_401s_then_429s_and_bounded_events(
    counted_in: str,
) -> None:
    answers = [get_tools(f"tg_guess-{n}", ATTACKER) for n in range(FLOOD)]

    statuses = [answer.status_code for answer in answers]
    assert statuses == [401] * LIMIT + [429] * (FLOOD - LIMIT)
    throttled = answers[-1]
    assert throttled["Content-Type"] == "application/json"
    error = throttled.json()["error"]
    assert (error["status"], error["code"], error["retryable"]) == (
        429,
        "authentication_throttled",
        True,
    )
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert str(throttled["Retry-After"]) in error["message"]
    assert events() == [(ATTACKER, 401, "authentication_failed")] * LIMIT + [
        (ATTACKER, 429, "authentication_throttled")
    ]


def test_past_the_rate_an_unknown_token_is_not_looked_up(counted_in: str) -> None:
    for n in range(LIMIT):
        get_tools(f"tg_guess-{n}", ATTACKER)

    with CaptureQueriesContext(connection) as queries:
        answer = get_tools("tg_one-more-guess", ATTACKER)

    assert answer.status_code == 429
    assert not [q["sql"] for q in queries.captured_queries if "dispatch_agent" in q["sql"]]


def test_another_address_is_still_served(counted_in: str, make_agent: MakeAgent) -> None:
    _, token = make_agent()
    for n in range(FLOOD):
        get_tools(f"tg_guess-{n}", ATTACKER)

    wrong = get_tools("tg_guess-from-the-neighbour", NEIGHBOUR)
    right = get_tools(token, NEIGHBOUR)

    assert wrong.status_code == 401
    assert right.status_code == 200
    assert events()[-1] == (NEIGHBOUR, 401, "authentication_failed")


def test_a_token_seen_valid_passes_from_a_flooded_address_and_an_unseen_one_waits(
    counted_in: str, make_agent: MakeAgent
) -> None:
    _, working = make_agent()
    _, unused = make_agent()
    assert get_tools(working, ATTACKER).status_code == 200
    for n in range(FLOOD):
        get_tools(f"tg_guess-{n}", ATTACKER)

    known = get_tools(working, ATTACKER)
    unseen = get_tools(unused, ATTACKER)

    assert known.status_code == 200
    assert unseen.status_code == 429
    # Seen valid from anywhere counts: the unused token, once it works from elsewhere, passes.
    assert get_tools(unused, NEIGHBOUR).status_code == 200
    assert get_tools(unused, ATTACKER).status_code == 200


def test_a_known_token_whose_agent_is_disabled_counts_as_a_failure_again(
    counted_in: str, make_agent: MakeAgent
) -> None:
    agent, token = make_agent()
    assert get_tools(token, ATTACKER).status_code == 200
    agent.is_active = False
    agent.save(update_fields=["is_active"])

    answers = [get_tools(token, ATTACKER).status_code for _ in range(LIMIT + 5)]

    assert answers == [401] * LIMIT + [429] * 5


def test_requests_without_a_token_are_answered_401_but_their_events_are_bounded(
    counted_in: str,
) -> None:
    answers = [get_tools(None, ATTACKER).status_code for _ in range(FLOOD)]

    assert answers == [401] * FLOOD
    assert events() == [(ATTACKER, 401, "not_authenticated")] * LIMIT + [
        (ATTACKER, 429, "authentication_throttled")
    ]


def test_the_address_is_the_one_the_trusted_proxy_appended(
    counted_in: str, settings: Settings
) -> None:
    settings.TOOLGATE_TRUSTED_PROXY_COUNT = 1

    # Behind nginx every peer is 127.0.0.1; the client writes what it likes to the left.
    flood = [
        get_tools(
            f"tg_guess-{n}", "127.0.0.1", HTTP_X_FORWARDED_FOR=f"10.9.8.{n}, {ATTACKER}"
        ).status_code
        for n in range(LIMIT + 5)
    ]
    neighbour = get_tools("tg_guess", "127.0.0.1", HTTP_X_FORWARDED_FOR=NEIGHBOUR)

    assert flood == [401] * LIMIT + [429] * 5
    assert neighbour.status_code == 401
    assert {address for address, _, _ in events()} == {ATTACKER, NEIGHBOUR}


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("::ffff:203.0.113.7") == address_key("203.0.113.7") == "203.0.113.7"


def test_concurrent_bad_tokens_from_one_address_get_no_more_than_the_rate_in_401s(
    counted_in: str,
) -> None:
    threads = 20
    start = threading.Barrier(threads)

    def guess(n: int) -> str:
        start.wait()
        outcomes = []
        try:
            for k in range(4):
                try:
                    AgentTokenAuthentication().from_header(f"Token tg_{n}-{k}".encode(), ATTACKER)
                except AuthenticationFailed:
                    outcomes.append("401")
                except AuthenticationThrottled:
                    outcomes.append("429")
        finally:
            connections.close_all()
        return ",".join(outcomes)

    with ThreadPoolExecutor(threads) as pool:
        outcomes = Counter(o for row in pool.map(guess, range(threads)) for o in row.split(","))

    assert outcomes == {"401": LIMIT, "429": threads * 4 - LIMIT}


def test_a_rate_limiter_out_of_reach_leaves_authentication_as_it_was(
    settings: Settings, make_agent: MakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TOOLGATE_AUTH_FAILURE_RATE = f"{LIMIT}/min"
    _, token = make_agent()
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            # Nothing listens on port 1.
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }

    wrong = [get_tools(f"tg_guess-{n}", ATTACKER).status_code for n in range(LIMIT + 2)]
    right = AgentTokenAuthentication().from_header(f"Token {token}".encode(), ATTACKER)

    assert wrong == [401] * (LIMIT + 2)
    assert right is not None
    assert any("cannot be counted" in record.getMessage() for record in caplog.records)
