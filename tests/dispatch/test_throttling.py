"""The agent throttle counts every request once, however many arrive at the same moment.

Threads stand in for web processes here: they run the throttle itself, against the embedded
default's per-process log and against Redis, as production has it. tests/dispatch/
test_throttle_processes.py does the same with real gunicorn workers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import RequestFactory
from pytest_django.fixtures import Settings
from rest_framework.request import Request
from rest_framework.views import APIView

from dispatch.authentication import AgentRateThrottle
from dispatch.models import Agent, AuditRecord
from dispatch.throttling import parse_rate
from tests.conftest import AgentClient, Ledger, MakeAgent

pytestmark = pytest.mark.django_db

THREADS = 40
REQUESTS_PER_THREAD = 5


@pytest.fixture(params=["per-process", "redis"])
def counted_in(request: pytest.FixtureRequest) -> str:
    """Each test runs on both logs: the embedded default's and Redis (skipped when absent)."""
    if request.param == "redis":
        request.getfixturevalue("redis_cache")
    return str(request.param)


def request_of(agent: Agent) -> Request:
    request = Request(RequestFactory().post("/api/v1/calls"))
    # What AgentTokenAuthentication sets; the stubs know only Django users.
    request.user = agent  # type: ignore[assignment]
    return request


def throttle(agent: Agent) -> tuple[bool, float | None]:
    """One request of the agent through a fresh throttle, as each request of DRF gets one."""
    gate = AgentRateThrottle()
    allowed = gate.allow_request(request_of(agent), APIView())
    return allowed, gate.wait()


def test_concurrent_requests_of_one_agent_never_pass_more_than_the_limit(
    counted_in: str, make_agent: MakeAgent, settings: Settings
) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "60/min"
    agent, _ = make_agent()
    start = threading.Barrier(THREADS)

    def send() -> list[tuple[bool, float | None]]:
        start.wait(timeout=30)
        return [throttle(agent) for _ in range(REQUESTS_PER_THREAD)]

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        batches = list(pool.map(lambda _: send(), range(THREADS)))
    answers = [answer for batch in batches for answer in batch]

    assert Counter(allowed for allowed, _ in answers) == {True: 60, False: 140}
    waits = [wait for allowed, wait in answers if not allowed]
    assert all(wait is not None and 0 < wait <= 60 for wait in waits), waits


def test_the_window_slides_and_a_place_frees_up_when_the_oldest_request_leaves_it(
    counted_in: str, make_agent: MakeAgent, settings: Settings
) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "2/s"
    agent, _ = make_agent()
    assert throttle(agent)[0]
    time.sleep(0.5)
    assert throttle(agent)[0]

    allowed, wait = throttle(agent)

    # The place of the first request frees up one second after it, not at a window's edge.
    assert not allowed
    assert wait is not None and 0 < wait <= 0.5
    time.sleep(wait + 0.05)
    assert throttle(agent)[0]
    # The second request is still within its second.
    assert not throttle(agent)[0]


def test_each_agent_has_its_own_count(
    counted_in: str, make_agent: MakeAgent, settings: Settings
) -> None:
    settings.TOOLGATE_AGENT_THROTTLE_RATE = "1/min"
    first, _ = make_agent()
    second, _ = make_agent()
    assert throttle(first)[0]

    allowed, _ = throttle(second)

    assert allowed
    assert not throttle(first)[0]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_rate_limiter_out_of_reach_is_a_503_in_the_error_shape_and_runs_nothing(
    api: AgentClient, ledger: Ledger, settings: Settings
) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{closed_port()}/0",
        }
    }

    response = api.post_call("get_order", {"order_id": "ORD-1001"})

    assert response.status_code == 503
    assert response.json() == {
        "error": {
            "status": 503,
            "code": "rate_limiter_unavailable",
            "message": "The rate limiter cannot be reached; send the request again in a moment.",
            "retryable": True,
        }
    }
    assert response.headers["Retry-After"] == "1"
    assert AuditRecord.objects.count() == 0


@pytest.mark.parametrize(
    ("rate", "parsed"),
    [("6000/min", (6000, 60)), ("10/s", (10, 1)), ("100/hour", (100, 3600)), ("5/day", (5, 86400))],
)
def test_it_reads_a_rate_as_drf_does(rate: str, parsed: tuple[int, int]) -> None:
    assert parse_rate(rate) == parsed


@pytest.mark.parametrize("rate", ["", "6000", "many/min", "0/min", "10/fortnight"])
def test_it_refuses_a_rate_it_cannot_read(rate: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="rate"):
        parse_rate(rate)
