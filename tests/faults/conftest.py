"""Faults on real processes: gunicorn on the production settings against the test's PostgreSQL
database, agents sending refunds over HTTP until each gets a final answer, and what the ledger,
the audit and the confirmations must say afterwards (read through the ORM).

gunicorn is tests/deploy/site.py's; its database connections carry an application_name of their
own, so that a test terminates those and no other (never another database's on a shared server).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import connection
from django.db.models import Count, Sum

from dispatch.models import Agent, AuditRecord
from orders.models import Order, Refund
from tests.deploy.site import DIRECT_HEADERS, Cluster, Production, Service, SiteDatabase, free_port
from tests.services import unavailable
from tests.workers import database_url

# Seconds an agent keeps sending one call before the test fails: every call must get a final
# answer well within it.
CALL_DEADLINE_SECONDS = 90.0
# The fault tests' own settings for the web processes: the throttle out of the way of a burst, and
# a key whose run died (its worker killed, its connection cut) taken over after seconds, not
# minutes.
WEB_SETTINGS = {
    "AGENT_THROTTLE_RATE": "100000/min",
    "TOOLGATE_IDEMPOTENCY_TAKE_OVER_SECONDS": "3",
    "GUNICORN_TIMEOUT": "20",
}


@dataclass
class Web:
    """gunicorn's master and its sync workers, on the test's database."""

    service: Service
    port: int
    application_name: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_pids(self) -> list[int]:
        master = self.service.process.pid
        children = Path(f"/proc/{master}/task/{master}/children")
        return [int(pid) for pid in children.read_text().split()]

    def kill_a_worker(self, rank: int) -> int:
        """SIGKILL one worker (gunicorn's master starts another); returns its pid."""
        pids = self.worker_pids()
        pid = pids[rank % len(pids)]
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_for_workers(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < count:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"gunicorn has not started its workers again:\n{self.service.log_tail()}"
                )
            time.sleep(0.1)


StartWeb = Callable[..., Web]


@pytest.fixture(scope="session")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """collectstatic once: the production settings' pages name their files through its manifest
    (gunicorn's readiness is its login page)."""
    cluster = Cluster.from_environment()
    if cluster is None:
        unavailable("needs PostgreSQL: DATABASE_URL is not a postgres:// URL")
    directory = tmp_path_factory.mktemp("static")
    production = Production(
        database=SiteDatabase.for_cluster(cluster), directory=directory, https_port=free_port()
    )
    production.manage("collectstatic", "--noinput")
    return production.static_root


@pytest.fixture
def start_web(transactional_db: None, tmp_path: Path, static_root: Path) -> Iterator[StartWeb]:
    """Starts gunicorn with `workers` sync workers, its cache and broker on `redis_url`; each is
    stopped (SIGINT, gunicorn's quick shutdown) at the end."""
    cluster = Cluster.from_environment()
    if cluster is None or connection.vendor != "postgresql":
        unavailable("needs PostgreSQL: DATABASE_URL is not a postgres:// URL")
    name = str(connection.settings_dict["NAME"])
    user = cluster.user
    production = Production(
        database=SiteDatabase(cluster, name=name, owner=user, app=user, password=cluster.password),
        directory=tmp_path,
        https_port=free_port(),
    )
    started: list[Web] = []

    def start(*, workers: int, redis_url: str, **settings: str) -> Web:
        application_name = f"toolgate-faults-{uuid.uuid4().hex[:8]}"
        port = free_port()
        env = {
            **WEB_SETTINGS,
            "DATABASE_URL": f"{database_url()}?application_name={application_name}",
            "CACHE_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "STATIC_ROOT": str(static_root),
            **settings,
        }
        service = production.gunicorn(
            port=port, workers=workers, name=f"gunicorn-{len(started)}", env=env
        )
        web = Web(service, port, application_name)
        started.append(web)
        web.wait_for_workers(workers)
        return web

    yield start
    for web in started:
        web.service.stop(signal.SIGINT)


# Agents that send a call until it is answered ------------------------------------------------


@dataclass
class Tally:
    """What the agents saw, over every call of a test."""

    calls: int = 0
    requests: int = 0
    retries: int = 0
    final: Counter[str] = field(default_factory=Counter)
    retried_on: Counter[str] = field(default_factory=Counter)
    # Anything that is neither a final answer nor a retryable one: must stay empty.
    wrong: list[str] = field(default_factory=list)
    # Every call_id each key was answered with: one per key.
    call_ids: dict[str, set[str]] = field(default_factory=dict)
    slowest_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def final_result(response: requests.Response) -> dict[str, Any] | None:
    """The call's result if the answer is final (sending it again cannot change it), else None."""
    if response.status_code != 200:
        return None
    result: dict[str, Any] = response.json()
    if result["retryable"] or result["code"] == "INTERNAL_ERROR":
        return None
    if result["data"].get("outcome") == "unknown":
        return None
    return result


def retryable_refusal(response: requests.Response) -> str | None:
    """The error code of a structured, retryable refusal (the API's envelope), else None."""
    if not response.headers.get("Content-Type", "").startswith("application/json"):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    if response.status_code == 200:
        return f"200 {body.get('code')}"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("retryable") is True:
        return f"{response.status_code} {error.get('code')}"
    return None


@dataclass
class Agents:
    """Agent hosts on real HTTP: each call is sent with its Idempotency-Key until its answer is
    final; a connection error or a retryable answer is sent again, the same key and body."""

    url: str
    token: str
    tally: Tally = field(default_factory=Tally)

    def call(
        self, key: str, *, session: str, customer: str, tool: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = json.dumps(
            {
                "session_id": session,
                "customer_id": customer,
                "tool": tool,
                "arguments": json.dumps(arguments),
            }
        )
        headers = {
            **DIRECT_HEADERS,
            "Authorization": f"Token {self.token}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }
        started = time.monotonic()
        with self.tally.lock:
            self.tally.calls += 1
        with requests.Session() as http:
            while True:
                if time.monotonic() - started > CALL_DEADLINE_SECONDS:
                    pytest.fail(f"{key}: no final answer within {CALL_DEADLINE_SECONDS} s")
                try:
                    response = http.post(
                        f"{self.url}/api/v1/calls", data=body, headers=headers, timeout=30
                    )
                except requests.ConnectionError as error:
                    self._retry(f"connection error ({type(error.args[0]).__name__})")
                    continue
                result = final_result(response)
                if result is not None:
                    with self.tally.lock:
                        self.tally.requests += 1
                        self.tally.final[result["code"]] += 1
                        self.tally.call_ids.setdefault(key, set()).add(result["call_id"])
                        elapsed = time.monotonic() - started
                        self.tally.slowest_seconds = max(self.tally.slowest_seconds, elapsed)
                    return result
                refusal = retryable_refusal(response)
                if refusal is None:
                    with self.tally.lock:
                        self.tally.wrong.append(
                            f"{key}: {response.status_code} "
                            f"{response.headers.get('Content-Type')} {response.text[:300]!r}"
                        )
                    pytest.fail(f"neither final nor retryable: {self.tally.wrong[-1]}")
                self._retry(refusal)

    def _retry(self, why: str) -> None:
        with self.tally.lock:
            self.tally.requests += 1
            self.tally.retries += 1
            self.tally.retried_on[why] += 1
        time.sleep(0.1)


# What must hold afterwards, whatever failed --------------------------------------------------


def ledger_doubles(orders: list[Order], expected: Mapping[str, int]) -> dict[str, Any]:
    """Each order's refunds against the refunds the agents were answered: the ledger (the rows)
    adds up to the order's refunded amount, and no refund is there twice."""
    counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    for order_id, count, total in (
        Refund.objects.filter(order__in=orders)
        .values("order__order_id")
        .annotate(count=Count("id"), total=Sum("amount_cents"))
        .values_list("order__order_id", "count", "total")
    ):
        counts[order_id], totals[order_id] = int(count), int(total or 0)
    refunded = dict(
        Order.objects.filter(pk__in=[o.pk for o in orders]).values_list(
            "order_id", "refunded_cents"
        )
    )
    mismatched = {
        order_id: (totals.get(order_id, 0), cents)
        for order_id, cents in refunded.items()
        if totals.get(order_id, 0) != cents
    }
    doubles = sum(max(0, counts.get(o, 0) - count) for o, count in expected.items())
    missing = sum(max(0, count - counts.get(o, 0)) for o, count in expected.items())
    return {"doubles": doubles, "missing": missing, "ledger_mismatches": mismatched}


def audit_per_call(agent: Agent, call_ids: Mapping[str, set[str]]) -> dict[str, Any]:
    """One audit record per call: each answered call's record exists once, and the agent's
    records that were not replays are exactly one per call."""
    records = AuditRecord.objects.filter(agent=agent)
    first_runs = records.filter(replayed=False)
    answered = set().union(*call_ids.values()) if call_ids else set()
    found = set(records.filter(call_id__in=answered).values_list("call_id", flat=True))
    return {
        "audit_records": records.count(),
        "audit_first_runs": first_runs.count(),
        "answered_without_record": len(answered - found),
        "keys_answered_twice": sum(len(ids) > 1 for ids in call_ids.values()),
    }
