"""Real Celery workers for the tests: `celery -A toolgate worker` processes on Redis, against the
test's PostgreSQL database, and a Redis of a test's own that it may stop and start again.

A test sends its tasks to Redis for real (not in-process), on the database TOOLGATE_TEST_REDIS_URL
names (or its own Redis). Redis gives a task that was never acknowledged to another worker once its
visibility timeout has passed: a few seconds here, an hour by default
(CELERY_VISIBILITY_TIMEOUT_SECONDS).

The fixtures (`own_redis`, `broker`, `start_worker`) are the whole suite's (tests/conftest.py).
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.db import connection

from tests.services import unavailable
from toolgate.celery import app as celery_app

# The tasks this process sends, imported before the Celery app is finalized: a shared task imported
# after that is not always registered in it (NotRegistered on sending, the approval left waiting).
importlib.import_module("approvals.tasks")

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "celery"
VISIBILITY_TIMEOUT_SECONDS = 2


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


StartWorker = Callable[..., Worker]


def database_url() -> str:
    """The test database, which the worker process must use too."""
    if connection.vendor != "postgresql":
        unavailable(
            "needs PostgreSQL: a worker process sees the test's rows only in a database server "
            "(run the suite with DATABASE_URL=postgres://...)"
        )
    config = connection.settings_dict
    credentials = quote(str(config["USER"] or ""))
    if config["PASSWORD"]:
        credentials += ":" + quote(str(config["PASSWORD"]))
    host = config["HOST"] or "127.0.0.1"
    return f"postgres://{credentials}@{host}:{config['PORT'] or 5432}/{quote(config['NAME'])}"


@dataclass
class RedisServer:
    """A Redis of the test's own, on a free port, which the test may stop and start again."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, "the test's Redis to start", timeout=15)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)

    def _answers(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_connect_timeout=0.5) as client:
                return bool(client.ping())
        except redis.ConnectionError:
            return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        unavailable("needs redis-server on the PATH")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = RedisServer(port, tmp_path)
    server.start()
    yield server
    server.stop()


def _use_broker(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Tasks this process enqueues go to Redis for the test, not in-process; an empty queue."""
    # Celery reads CELERY_BROKER_URL from the environment before its own configuration (CI
    # exports one): the test's broker must win there too.
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    with redis.Redis.from_url(url) as client:
        # What an earlier run that was cut short left behind.
        client.delete(QUEUE, "unacked", "unacked_index")
    saved = {key: celery_app.conf[key] for key in ("broker_url", "task_always_eager")}
    _forget_connections()
    celery_app.conf.update(broker_url=url, task_always_eager=False)
    yield url
    _forget_connections()
    celery_app.conf.update(saved)


def _forget_connections() -> None:
    """Drop the app's connections and its producers', so that the next broker URL is used: the
    app's close() forgets the first but not the second."""
    celery_app.close()
    amqp = celery_app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@pytest.fixture
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The machine's Redis (TOOLGATE_TEST_REDIS_URL), or the test's own where it asks for one."""
    if "own_redis" in request.fixturenames:
        url = request.getfixturevalue("own_redis").url
    else:
        url = request.getfixturevalue("redis_url")
    yield from _use_broker(url, monkeypatch)


@pytest.fixture
def start_worker(broker: str, transactional_db: None, tmp_path: Path) -> Iterator[StartWorker]:
    """Starts `celery -A toolgate worker`, one process (the solo pool), on the test's database
    and broker; returns once it is ready. Every worker it started is killed at the end."""
    url = database_url()
    workers: list[Worker] = []

    def start(*, beat: bool = False, **settings: str) -> Worker:
        """A worker; with `beat`, the periodic tasks run in it too; `settings` are more of its
        environment."""
        log = tmp_path / f"worker-{len(workers)}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
            # Plain http to the test's webhook receiver on 127.0.0.1.
            "DEBUG": "true",
            "TOOLGATE_WEBHOOK_ALLOW_PRIVATE": "true",
            "TOOLGATE_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
            "DATABASE_URL": url,
            "CELERY_BROKER_URL": broker,
            "CELERY_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT_SECONDS),
            **settings,
        }
        command = [
            *(sys.executable, "-m", "celery", "-A", "toolgate", "worker"),
            *("--pool", "solo", "-Q", QUEUE, "--loglevel", "INFO"),
            *("--hostname", f"test-{uuid.uuid4().hex[:8]}@%h"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *(("--beat", "--schedule", str(tmp_path / f"beat-{len(workers)}")) if beat else ()),
        ]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(process, log)
        workers.append(worker)
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker did not start:\n{worker.output()}")
            time.sleep(0.1)
        return worker

    yield start
    for worker in workers:
        worker.kill()


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")
