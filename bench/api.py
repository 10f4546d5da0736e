"""Benchmark (b): `POST /api/v1/calls` under gunicorn on PostgreSQL, against a bare endpoint.

Both targets run in the same gunicorn (same workers, same settings, `bench.settings`) on a
database of their own (`toolgate_bench`, dropped and created by each run, migrated, seeded with
the project's services: 64 customers with 8 BRL orders each, and one agent whose policy allows
both order tools, executes refunds below 50.00 without a human, 50 steps a session, 3 repeats).

- **api**: `POST /api/v1/calls`, the whole pipeline: the step, the idempotency record, the
  business check, the effect (a refund really moves money: a ledger row and the order's
  refunded_cents) and one audit record; one transaction for every call that claims a refund's
  key, none for the others (dispatch.store.OrmState.call_scope).
- **bare**: `POST /bench/bare` (bench/urls.py), a DRF view with the same authentication (the same
  token lookup), permission and throttle classes, which parses the same JSON body and inserts
  one row with the ORM: what an API without Toolgate's pipeline costs.

The load is a separate process (`python -m bench.api _load`, stdlib only, raw sockets so that it
stays cheap): a fixed number of threads, each with one keep-alive HTTP/1.1 connection, sending a
request as soon as the previous answer arrived (a closed loop), for a warm-up and then a measured
window; each thread is also capped in requests. A round measures bare then api at the fixed
concurrency (8: throughput, and p50/p99 under saturation), then bare then api at 1 connection
(latency without queueing), then a paired phase at 1 connection: one connection sends each
session (20 calls, about 0.1 s) to both targets, one after the other, the first taking turns.
Rounds alternate the targets so that drift in the machine's speed hits both alike, and the
figures pool every round; the p50 added is also printed round by round, which shows how far the
machine's drift moves it within one run. The bare endpoint gets the very same bodies.

The CPU time of the gunicorn workers, of the PostgreSQL backends of the bench database, of the
client and of the whole machine is read from /proc over each measured window: per request, and
as the share of the machine that other processes took (other work on the machine skews a run).

The mix is fixed and seeded. Every session is one conversation of one customer (customers taken in
turn), sent in order by one thread, and holds 20 calls, shuffled (a replay after its refund):

    10  get_order of one of the customer's orders (none more than twice)     50%  OK
     6  refund_order of 1.00 to 48.99 BRL, distinct amounts                  30%  OK, executed
     1  an exact repeat of one of those refunds                               5%  OK, replayed
     3  bad calls, kinds taken in turn from the 6 below                      15%

    invalid_json     arguments cut off mid-object                    INVALID_JSON
    float_amount     amount_cents 25.9 instead of 2590               INVALID_ARGUMENTS
    wrong_currency   a refund in USD of an order in BRL              CURRENCY_MISMATCH
    invented_order   get_order of an order that does not exist       ORDER_NOT_FOUND
    extra_field      get_order with an argument it does not take     INVALID_ARGUMENTS
    unknown_tool     cancel_order                                    UNKNOWN_TOOL

A new session every 20 calls keeps every session within its step budget and repeat limit; the
client checks the code of every answer against the one its kind must get.

Targets: the api's throughput at least 0.7 of the bare endpoint's, and its p50 at most 1 ms above.
The p50 target is judged at 1 connection: at 8, both are saturated and a p50 is mostly queueing
(p50 ~ connections / throughput), so its delta only restates the throughput ratio, times 8. The
paired phase measures the same thing with drift cancelled over a tenth of a second instead of a
few seconds; it is printed beside the target's figure as a check on it, not instead of it.

Run: `.venv/bin/python -m bench.api [--duration S] [--rounds R] [--paired S] [--concurrency N]
[--json]`.
Needs PostgreSQL at 127.0.0.1:5432 (`--pg-url`) and Redis (`BENCH_CACHE_URL`, by default
redis://127.0.0.1:6379/1, where the throttle counts); sends load to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.core import python_build

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_MODULE = "bench.settings"

API_PATH = "/api/v1/calls"
BARE_PATH = "/bench/bare"
TARGETS = {"bare": BARE_PATH, "api": API_PATH}
# A phase whose one connection sends every session to both targets in turn (see _load_thread).
PAIRED = "paired"

TARGET_RATIO = 0.7
TARGET_P50_DELTA_MS = 1.0

CUSTOMERS = 64
ORDERS_PER_CUSTOMER = 8
ORDER_TOTAL_CENTS = 10**12
AUTO_APPROVE_BELOW_CENTS = 5_000
AGENT_NAME = "bench-agent"

SESSION_CALLS = 20
SESSION_MIX = (("get_order", 10), ("refund", 6), ("replay", 1), ("bad", 3))
BAD_KINDS = (
    "invalid_json",
    "float_amount",
    "wrong_currency",
    "invented_order",
    "extra_field",
    "unknown_tool",
)
EXPECT = {
    "get_order": "OK",
    "refund": "OK",
    "replay": "OK (replayed)",
    "invalid_json": "INVALID_JSON",
    "float_amount": "INVALID_ARGUMENTS",
    "wrong_currency": "CURRENCY_MISMATCH",
    "invented_order": "ORDER_NOT_FOUND",
    "extra_field": "INVALID_ARGUMENTS",
    "unknown_tool": "UNKNOWN_TOOL",
}


# --- the mix ---------------------------------------------------------------------------------


def customer_id(number: int) -> str:
    return f"CUS-{number + 1}"


def order_ids(customer: int) -> list[str]:
    first = 100_000 + customer * ORDERS_PER_CUSTOMER
    return [f"ORD-{first + n}" for n in range(ORDERS_PER_CUSTOMER)]


def _args(**values: Any) -> str:
    return json.dumps(values)


def session_calls(seed: int, tag: str, number: int) -> list[tuple[str, bytes]]:
    """Session `number` of the mix: 20 (kind, request body) pairs, the same for every run."""
    rng = random.Random(seed * 1_000_003 + number)
    customer = number % CUSTOMERS
    orders = order_ids(customer)
    kinds = [kind for kind, times in SESSION_MIX for _ in range(times)]
    bad_turn = number * 3
    for position, kind in enumerate(kinds):
        if kind == "bad":
            kinds[position] = BAD_KINDS[bad_turn % len(BAD_KINDS)]
            bad_turn += 1
    rng.shuffle(kinds)
    replay, first = kinds.index("replay"), kinds.index("refund")
    if first > replay:
        kinds[first], kinds[replay] = kinds[replay], kinds[first]
    lookups = rng.sample(orders, len(orders))
    amounts = rng.sample(range(100, AUTO_APPROVE_BELOW_CENTS - 100), 6)
    refunds: list[str] = []
    session_id = f"bench-{tag}-{number}"
    calls: list[tuple[str, bytes]] = []
    looked_up = 0
    for kind in kinds:
        order_id = rng.choice(orders)
        tool = "refund_order"
        if kind == "get_order":
            tool, arguments = "get_order", _args(order_id=lookups[looked_up % len(lookups)])
            looked_up += 1
        elif kind == "refund":
            arguments = _args(
                order_id=order_id, amount_cents=amounts.pop(), currency="BRL", reason="damaged"
            )
            refunds.append(arguments)
        elif kind == "replay":
            arguments = rng.choice(refunds)
        elif kind == "invalid_json":
            arguments = '{"order_id": "' + order_id + '", "amount_cents": 12'
        elif kind == "float_amount":
            arguments = _args(
                order_id=order_id, amount_cents=25.9, currency="BRL", reason="damaged"
            )
        elif kind == "wrong_currency":
            arguments = _args(order_id=order_id, amount_cents=990, currency="USD", reason="damaged")
        elif kind == "invented_order":
            tool, arguments = "get_order", _args(order_id=f"ORD-9{number:08d}")
        elif kind == "extra_field":
            tool, arguments = "get_order", _args(order_id=order_id, include="history")
        elif kind == "unknown_tool":
            tool, arguments = "cancel_order", _args(order_id=order_id)
        else:  # pragma: no cover - the mix above is closed
            raise AssertionError(kind)
        body = {
            "session_id": session_id,
            "customer_id": customer_id(customer),
            "tool": tool,
            "arguments": arguments,
        }
        calls.append((kind, json.dumps(body, separators=(",", ":")).encode()))
    return calls


# --- the load generator (a separate process; stdlib only) ------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1, on a raw socket: the client stays cheap."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def open(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        sock = self.open()
        sock.sendall(request)
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before the response head")
            data += chunk
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = -1, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length < 0:
            raise ConnectionError("response without Content-Length")
        body = data[end + 4 :]
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed in the response body")
            body += chunk
        if close:
            self.close()
        return status, body


def request_head(path: str, port: int, token: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Token {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json\r\n"
    ).encode()


def outcome_of(body: bytes, target: str) -> str:
    """The result code of an answer, found without parsing JSON (the client must stay cheap)."""
    if target == "bare":
        return "bare" if b'"ok":true' in body else "unexpected bare answer"
    start = body.find(b'"code":"')
    if start < 0:
        return "no code"
    start += 8
    code = body[start : body.find(b'"', start)].decode()
    return f"{code} (replayed)" if b'"replayed":true' in body else code


@dataclass
class _ThreadResult:
    latencies_us: list[int]
    # The same latencies by kind of call (get_order, refund, ...).
    by_kind_us: dict[str, list[int]] = field(default_factory=dict)
    sent: int = 0
    errors: int = 0
    first_error: str = ""
    last_end_ns: int = 0


def _load_thread(
    *,
    heads: Mapping[str, bytes],
    port: int,
    seed: int,
    tag: str,
    index: int,
    stride: int,
    window_ns: tuple[int, int],
    cap: int,
    outcomes: Mapping[str, Counter[tuple[str, str]]],
    out: Mapping[str, _ThreadResult],
) -> None:
    """Send the mix's sessions in order, each session to every target in `heads`.

    With two targets (a paired phase), each session goes to both, one after the other on the
    same connection (20 calls, about 0.1 s), the first of the two taking turns: drift in the
    machine's speed, which moves over seconds, then hits both targets alike. Whole sessions
    rather than single calls, so that what a request leaves to do after its answer (the
    worker's and the database's) falls mostly on a request to the same target.
    """
    begin, end = window_ns
    connection = Connection(port)
    number = index
    clock = time.monotonic_ns
    order = list(heads)
    try:
        while True:
            calls = session_calls(seed, tag, number)
            turn = number // stride % len(order)
            number += stride
            for target in order[turn:] + order[:turn]:
                result, head = out[target], heads[target]
                for kind, body in calls:
                    request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
                    started = clock()
                    if started >= end or len(result.latencies_us) >= cap:
                        return
                    try:
                        status, answer = connection.exchange(request)
                    except (OSError, ValueError) as exc:
                        connection.close()
                        result.errors += 1
                        result.first_error = result.first_error or f"{type(exc).__name__}: {exc}"
                        continue
                    finished = clock()
                    result.sent += 1
                    if started >= begin:
                        latency = (finished - started) // 1000
                        result.latencies_us.append(latency)
                        result.by_kind_us.setdefault(kind, []).append(latency)
                        result.last_end_ns = finished
                        outcome = outcome_of(answer, target) if status == 200 else f"HTTP {status}"
                        outcomes[target][kind, outcome] += 1
    finally:
        connection.close()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _target_report(
    results: Sequence[_ThreadResult], outcomes: Sequence[Counter[tuple[str, str]]], begin: int
) -> dict[str, Any]:
    """What a load process's threads measured of one target, as JSON for the parent."""
    merged: Counter[tuple[str, str]] = Counter()
    for counter in outcomes:
        merged.update(counter)
    return {
        "latencies_us": [value for result in results for value in result.latencies_us],
        "by_kind_us": {
            kind: [value for result in results for value in result.by_kind_us.get(kind, [])]
            for kind in sorted({kind for result in results for kind in result.by_kind_us})
        },
        "sent": sum(result.sent for result in results),
        "errors": sum(result.errors for result in results),
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "last_end_ns": max((result.last_end_ns for result in results), default=begin),
        "outcomes": [[kind, outcome, count] for (kind, outcome), count in merged.items()],
    }


def load_main(argv: Sequence[str]) -> None:
    """`python -m bench.api _load ...`: one client process; prints its results as JSON."""
    parser = argparse.ArgumentParser(prog="bench.api _load")
    parser.add_argument("--target", choices=[*sorted(TARGETS), PAIRED], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--first-index", type=int, required=True)
    parser.add_argument("--stride", type=int, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--cap", type=int, required=True, help="measured requests per thread")
    options = parser.parse_args(argv)
    targets = list(TARGETS) if options.target == PAIRED else [options.target]
    heads = {
        target: request_head(TARGETS[target], options.port, options.token) for target in targets
    }
    print("ready", flush=True)
    # The parent answers with the common start time (CLOCK_MONOTONIC, shared by processes).
    start_ns = int(sys.stdin.readline().split()[1])
    begin = start_ns + int(options.warmup * 1e9)
    end = begin + int(options.duration * 1e9)
    outcomes: list[dict[str, Counter[tuple[str, str]]]] = []
    results: list[dict[str, _ThreadResult]] = []
    threads = []
    for offset in range(options.threads):
        outcomes.append({target: Counter() for target in targets})
        results.append({target: _ThreadResult(latencies_us=[]) for target in targets})
        threads.append(
            threading.Thread(
                target=_load_thread,
                kwargs={
                    "heads": heads,
                    "port": options.port,
                    "seed": options.seed,
                    "tag": options.tag,
                    "index": options.first_index + offset,
                    "stride": options.stride,
                    "window_ns": (begin, end),
                    "cap": options.cap,
                    "outcomes": outcomes[-1],
                    "out": results[-1],
                },
                daemon=True,
            )
        )
    time.sleep(max(0.0, (start_ns - time.monotonic_ns()) / 1e9))
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, (begin - time.monotonic_ns()) / 1e9))
    cpu_begin = _cpu_seconds()
    time.sleep(max(0.0, (end - time.monotonic_ns()) / 1e9))
    cpu_window = _cpu_seconds() - cpu_begin
    for thread in threads:
        thread.join()
    report: dict[str, Any] = {
        "window_begin_ns": begin,
        "cpu_seconds": cpu_window,
        "by_target": {
            target: _target_report(
                [result[target] for result in results],
                [counter[target] for counter in outcomes],
                begin,
            )
            for target in targets
        },
    }
    json.dump(report, sys.stdout)


# --- setting up: database, seed, gunicorn ----------------------------------------------------


def _django_env(database_url: str, client_side_binding: bool = False) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "BENCH_DATABASE_URL": database_url,
        "DATABASE_SERVER_SIDE_BINDING": "0" if client_side_binding else "1",
        "PYTHONPATH": str(ROOT),
        # WhiteNoise warns that STATIC_ROOT does not exist: the API serves no static files.
        "PYTHONWARNINGS": "ignore:No directory at:UserWarning",
    }


def create_database(pg_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
        version = connection.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {version[0] if version else '?'}"


def drop_database(pg_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed_main() -> None:
    """`python -m bench.api _seed`: the orders and the agent, through the project's services."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    import django

    django.setup()
    from django.db import transaction

    from dispatch.services import agent_create
    from orders.services import order_create

    with transaction.atomic():
        for customer in range(CUSTOMERS):
            for order_id in order_ids(customer):
                order_create(
                    order_id=order_id,
                    customer_id=customer_id(customer),
                    total_cents=ORDER_TOTAL_CENTS,
                    currency="BRL",
                )
        _, token = agent_create(
            name=AGENT_NAME,
            allowed_tools=["get_order", "refund_order"],
            max_amount_cents=1_000_000,
            auto_approve_below_cents=AUTO_APPROVE_BELOW_CENTS,
            two_reviewers_from_cents=200_000,
            step_budget=50,
            repeat_limit=3,
        )
    print(json.dumps({"token": token}))


def prepare(database_url: str) -> str:
    """Migrate the bench database and seed it; returns the agent's token."""
    env = _django_env(database_url)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    seeded = subprocess.run(
        [sys.executable, "-m", "bench.api", "_seed"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return str(json.loads(seeded.stdout.strip().splitlines()[-1])["token"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def workers(self) -> list[int]:
        return [pid for pid, ppid in _processes() if ppid == self.process.pid]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gunicorn(
    database_url: str,
    *,
    workers: int,
    worker_class: str,
    threads: int,
    log: Path,
    client_side_binding: bool = False,
) -> Server:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "toolgate.wsgi:application",
        f"--bind=127.0.0.1:{port}",
        f"--workers={workers}",
        f"--worker-class={worker_class}",
        "--keep-alive=30",
        "--timeout=60",
        "--log-level=warning",
        f"--error-logfile={log}",
    ]
    if worker_class == "gthread":
        # (gunicorn turns sync workers into gthread ones when given threads.)
        command.append(f"--threads={threads}")
    process = subprocess.Popen(
        command, cwd=ROOT, env=_django_env(database_url, client_side_binding)
    )
    return Server(process, port, log)


def wait_ready(server: Server, token: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    request = (
        f"GET /api/v1/codes HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Token {token}\r\n\r\n"
    ).encode()
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"bench/api.py: gunicorn exited; see {server.log}")
        connection = Connection(server.port)
        try:
            status, _ = connection.exchange(request)
            if status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    raise SystemExit(f"bench/api.py: gunicorn did not answer within {timeout:.0f} s")


# --- CPU accounting from /proc ----------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> Iterator[tuple[int, int]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            yield int(entry), int(fields[1])


def _process_cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


def _database_backends(pg_url: str, name: str) -> list[int]:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", [name]
        ).fetchall()
    return [int(row[0]) for row in rows]


@dataclass
class CpuSample:
    server: float
    database: float
    machine_busy: float
    machine_all: float

    @classmethod
    def take(cls, server: Server, backends: Sequence[int]) -> CpuSample:
        busy, everything = _machine_cpu()
        return cls(_process_cpu(server.workers()), _process_cpu(backends), busy, everything)


# --- one measured phase -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    concurrency: int
    client_processes: int
    warmup: float
    duration: float
    cap: int
    seed: int


def run_phase(
    server: Server, token: str, target: str, tag: str, plan: Plan, pg: tuple[str, str]
) -> dict[str, Any]:
    processes = max(1, min(plan.client_processes, plan.concurrency))
    per_process = [
        plan.concurrency // processes + (n < plan.concurrency % processes) for n in range(processes)
    ]
    clients = []
    first = 0
    for threads in per_process:
        command = [
            sys.executable,
            "-m",
            "bench.api",
            "_load",
            f"--target={target}",
            f"--port={server.port}",
            f"--token={token}",
            f"--seed={plan.seed}",
            f"--tag={tag}",
            f"--threads={threads}",
            f"--first-index={first}",
            f"--stride={plan.concurrency}",
            f"--warmup={plan.warmup}",
            f"--duration={plan.duration}",
            f"--cap={max(1, plan.cap // plan.concurrency)}",
        ]
        first += threads
        clients.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for client in clients:
        assert client.stdout is not None
        ready, _, _ = select.select([client.stdout], [], [], 60)
        if not ready or client.stdout.readline().strip() != "ready":
            raise SystemExit("bench/api.py: a load process did not start")
    start_ns = time.monotonic_ns() + 50_000_000
    for client in clients:
        assert client.stdin is not None
        client.stdin.write(f"go {start_ns}\n")
        client.stdin.flush()
    begin_ns = start_ns + int(plan.warmup * 1e9)
    end_ns = begin_ns + int(plan.duration * 1e9)
    time.sleep(max(0.0, (begin_ns - time.monotonic_ns()) / 1e9))
    backends = _database_backends(*pg)
    before = CpuSample.take(server, backends)
    time.sleep(max(0.0, (end_ns - time.monotonic_ns()) / 1e9))
    after = CpuSample.take(server, backends)
    reports = []
    for client in clients:
        out, _ = client.communicate(timeout=120)
        if client.returncode != 0:
            raise SystemExit(f"bench/api.py: a load process failed ({client.returncode})")
        reports.append(json.loads(out))
    cpu = {
        "window_s": (end_ns - begin_ns) / 1e9,
        "server_s": after.server - before.server,
        "database_s": after.database - before.database,
        "client_s": sum(report["cpu_seconds"] for report in reports),
        "machine_busy_s": after.machine_busy - before.machine_busy,
        "machine_all_s": after.machine_all - before.machine_all,
    }

    def measured(name: str) -> dict[str, Any]:
        parts = [report["by_target"][name] for report in reports]
        outcomes: Counter[tuple[str, str]] = Counter()
        for part in parts:
            for kind, outcome, count in part["outcomes"]:
                outcomes[kind, outcome] += count
        last = max(part["last_end_ns"] for part in parts)
        return {
            "latencies_us": [value for part in parts for value in part["latencies_us"]],
            "by_kind_us": _merge_by_kind(part["by_kind_us"] for part in parts),
            "seconds": max(last - begin_ns, 1) / 1e9,
            "sent": sum(part["sent"] for part in parts),
            "errors": sum(part["errors"] for part in parts),
            "first_error": next((p["first_error"] for p in parts if p["first_error"]), ""),
            "outcomes": outcomes,
            # A paired phase's CPU is both targets' together.
            "cpu": cpu,
        }

    if target == PAIRED:
        return {name: measured(name) for name in TARGETS}
    return measured(target)


def _merge_by_kind(parts: Iterator[Mapping[str, list[int]]]) -> dict[str, list[int]]:
    """Latencies by kind of call, from several reports or phases, into one."""
    merged: dict[str, list[int]] = {}
    for part in parts:
        for kind, values in part.items():
            merged.setdefault(kind, []).extend(values)
    return merged


def _percentile(ordered: Sequence[int], q: float) -> float:
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] / 1000.0


def summarise(target: str, phases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    ordered = sorted(value for phase in phases for value in phase["latencies_us"])
    seconds = sum(phase["seconds"] for phase in phases)
    outcomes: Counter[tuple[str, str]] = Counter()
    cpu: Counter[str] = Counter()
    for phase in phases:
        outcomes.update(phase["outcomes"])
        cpu.update(phase["cpu"])
    requests = len(ordered)
    by_kind = _merge_by_kind(phase["by_kind_us"] for phase in phases)
    unexpected = sum(
        count
        for (kind, outcome), count in outcomes.items()
        if outcome != (EXPECT[kind] if target == "api" else "bare")
    )
    window = cpu["window_s"] or 1.0
    per_request = 1e6 / max(requests, 1)
    busy = cpu["machine_busy_s"]
    ours = cpu["server_s"] + cpu["database_s"] + cpu["client_s"]
    return {
        "requests": requests,
        "seconds": seconds,
        "calls_per_s": requests / seconds if seconds else 0.0,
        "p50_ms": _percentile(ordered, 0.50),
        "p90_ms": _percentile(ordered, 0.90),
        "p99_ms": _percentile(ordered, 0.99),
        "max_ms": ordered[-1] / 1000.0 if ordered else math.nan,
        "mean_ms": sum(ordered) / requests / 1000.0 if requests else math.nan,
        "p50_ms_by_kind": {
            kind: _percentile(sorted(values), 0.50) for kind, values in sorted(by_kind.items())
        },
        "errors": sum(phase["errors"] for phase in phases),
        "first_error": next((p["first_error"] for p in phases if p["first_error"]), ""),
        "unexpected_outcomes": unexpected,
        "outcomes": {
            f"{kind}: {outcome}": count for (kind, outcome), count in sorted(outcomes.items())
        },
        "cpu": {
            # Cores busy on average over the measured windows, and CPU time per request.
            "server_cores": cpu["server_s"] / window,
            "database_cores": cpu["database_s"] / window,
            "client_cores": cpu["client_s"] / window,
            "machine_busy_cores": busy / window,
            "other_cores": max(0.0, busy - ours) / window,
            "server_us_per_request": cpu["server_s"] * per_request,
            "database_us_per_request": cpu["database_s"] * per_request,
            "client_us_per_request": cpu["client_s"] * per_request,
        },
    }


def database_counts(pg_url: str, name: str) -> dict[str, int]:
    import psycopg

    tables = {
        "audit_records": "dispatch_auditrecord",
        "refunds": "orders_refund",
        "bare_rows": "bench_barecall",
        "sessions": "dispatch_session",
    }
    counts: dict[str, int] = {}
    with psycopg.connect(f"{pg_url}/{name}", autocommit=True) as connection:
        for label, table in tables.items():
            row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
            counts[label] = int(row[0]) if row else 0
        row = connection.execute(
            "SELECT count(*) FROM orders_order o WHERE o.refunded_cents <> "
            "(SELECT coalesce(sum(amount_cents), 0) FROM orders_refund r WHERE r.order_id = o.id)"
        ).fetchone()
        counts["orders_whose_ledger_does_not_add_up"] = int(row[0]) if row else 0
    return counts


def _cpu_per_request(figures: Mapping[str, Any]) -> float:
    cpu = figures["cpu"]
    return float(cpu["server_us_per_request"] + cpu["database_us_per_request"])


def _deltas_by_round(
    bare: Sequence[Mapping[str, Any]], api: Sequence[Mapping[str, Any]]
) -> list[float]:
    """The p50 added in each round, from the round's phase of each target."""
    return [
        _percentile(sorted(api_phase["latencies_us"]), 0.5)
        - _percentile(sorted(bare_phase["latencies_us"]), 0.5)
        for bare_phase, api_phase in zip(bare, api, strict=True)
    ]


def measure(options: argparse.Namespace) -> dict[str, Any]:
    pg_url = options.pg_url.rstrip("/")
    database_url = f"{pg_url}/{options.database}"
    load_before = os.getloadavg()
    server_version = create_database(pg_url, options.database)
    token = prepare(database_url)
    log = Path(tempfile.gettempdir()) / f"bench-api-gunicorn-{os.getpid()}.log"
    server = start_gunicorn(
        database_url,
        workers=options.workers,
        worker_class=options.worker_class,
        threads=options.threads,
        log=log,
        client_side_binding=options.client_side_binding,
    )
    # Throughput at the fixed concurrency, and latency at one connection (no queueing).
    phases: dict[str, list[dict[str, Any]]] = {
        "bare": [],
        "api": [],
        "bare_1": [],
        "api_1": [],
        "bare_paired": [],
        "api_paired": [],
    }
    sent = {"bare": 0, "api": 0}
    try:
        wait_ready(server, token)
        for number in range(options.rounds):
            loaded = Plan(
                concurrency=options.concurrency,
                client_processes=options.client_processes,
                warmup=options.warmup if number == 0 else min(options.warmup, 1.0),
                duration=options.duration,
                cap=options.max_requests,
                seed=options.seed,
            )
            one = replace(
                loaded, concurrency=1, client_processes=1, warmup=0.5, duration=options.latency
            )
            schedule = [("bare", "bare", loaded), ("api", "api", loaded)]
            if options.latency > 0:
                schedule += [("bare_1", "bare", one), ("api_1", "api", one)]
            if options.paired > 0:
                schedule.append(("paired", PAIRED, replace(one, duration=options.paired)))
            for name, target, plan in schedule:
                phase = run_phase(
                    server, token, target, f"{name}-{number}", plan, (pg_url, options.database)
                )
                for each, measured in phase.items() if target == PAIRED else [(target, phase)]:
                    sent[each] += measured["sent"]
                    phases[f"{each}_paired" if target == PAIRED else name].append(measured)
    finally:
        server.stop()
    if log.exists() and not log.read_text().strip():
        log.unlink()  # kept only when gunicorn had something to say
    counts = database_counts(pg_url, options.database)
    if not options.keep_database:
        drop_database(pg_url, options.database)
    bare, api = summarise("bare", phases["bare"]), summarise("api", phases["api"])
    ratio = api["calls_per_s"] / bare["calls_per_s"] if bare["calls_per_s"] else math.nan
    loaded_delta = api["p50_ms"] - bare["p50_ms"]
    single: dict[str, Any] = {}
    if options.latency > 0:
        single = {
            "bare": summarise("bare", phases["bare_1"]),
            "api": summarise("api", phases["api_1"]),
        }
    delta = single["api"]["p50_ms"] - single["bare"]["p50_ms"] if single else loaded_delta
    paired: dict[str, Any] = {}
    if options.paired > 0:
        paired = {
            "bare": summarise("bare", phases["bare_paired"]),
            "api": summarise("api", phases["api_paired"]),
        }
        for figures in paired.values():
            # The phase's CPU is both targets' together: per request of one, it would mislead.
            del figures["cpu"]
        paired["p50_delta_ms"] = paired["api"]["p50_ms"] - paired["bare"]["p50_ms"]
        paired["p50_delta_ms_by_round"] = _deltas_by_round(
            phases["bare_paired"], phases["api_paired"]
        )
    cpu_ratio = _cpu_per_request(bare) / _cpu_per_request(api)
    kinds = Counter(kind for kind, _ in session_calls(options.seed, "mix", 0))
    return {
        "benchmark": "api",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "setup": {
            "gunicorn": f"{options.workers} {options.worker_class} workers"
            + (f" x {options.threads} threads" if options.worker_class == "gthread" else ""),
            "concurrency": options.concurrency,
            "client_processes": options.client_processes,
            "rounds": options.rounds,
            "seconds_per_round": options.duration,
            "latency_seconds_per_round": options.latency,
            "paired_seconds_per_round": options.paired,
            "warmup_s": options.warmup,
            "database": f"{server_version}, CONN_MAX_AGE 600, database {options.database}"
            + (
                ", client-side binding, nothing prepared"
                if options.client_side_binding
                else ", server-side binding, prepared statements"
            ),
            "python": python_build(),
            "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
            "load_average_before": [round(value, 2) for value in load_before],
            "load_average_after": [round(value, 2) for value in os.getloadavg()],
        },
        "mix_per_session": {
            **{kind: n for kind, n in kinds.items() if kind not in BAD_KINDS},
            "bad (in turn)": sum(n for kind, n in kinds.items() if kind in BAD_KINDS),
        },
        "bare": bare,
        "api": api,
        "ratio": ratio,
        # Bare's CPU per request (gunicorn + PostgreSQL) over the api's: the throughput ratio
        # on a machine that runs nothing else, where both are CPU-bound.
        "cpu_ratio": cpu_ratio,
        # The same for the gunicorn workers alone: the ratio when PostgreSQL has CPUs of its own.
        "app_cpu_ratio": bare["cpu"]["server_us_per_request"] / api["cpu"]["server_us_per_request"],
        "p50_delta_ms_loaded": loaded_delta,
        "single_connection": single,
        "p50_delta_ms": delta,
        # Round by round (each round's bare and api phases run back to back): how far the
        # machine's drift moves the figure within one run.
        "p50_delta_ms_by_round": _deltas_by_round(phases["bare_1"], phases["api_1"]),
        "paired": paired,
        "targets": {
            "ratio_at_least": TARGET_RATIO,
            "p50_delta_at_most_ms": TARGET_P50_DELTA_MS,
            "p50_delta_measured_at": "1 connection" if single else f"{options.concurrency}",
            "ratio_met": ratio >= TARGET_RATIO,
            "p50_met": delta <= TARGET_P50_DELTA_MS,
            "met": ratio >= TARGET_RATIO and delta <= TARGET_P50_DELTA_MS,
        },
        "checks": {
            **counts,
            "api_requests_sent": sent["api"],
            "bare_requests_sent": sent["bare"],
        },
    }


def _row(label: str, figures: Mapping[str, Any]) -> str:
    return (
        f"  {label:30}{figures['requests']:>9,}{figures['calls_per_s']:>9,.0f}"
        f"{figures['p50_ms']:>8.2f}{figures['p90_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
        f"{figures['errors'] + figures['unexpected_outcomes']:>8}"
    )


def render(result: Mapping[str, Any]) -> str:
    setup, bare, api, targets = (
        result["setup"],
        result["bare"],
        result["api"],
        result["targets"],
    )
    single = result["single_connection"]
    load = ", ".join(f"{value:.2f}" for value in setup["load_average_before"])
    load_after = ", ".join(f"{value:.2f}" for value in setup["load_average_after"])
    concurrency = setup["concurrency"]
    lines = [
        f"(b) API under gunicorn: {setup['gunicorn']}; {setup['rounds']} round(s) of "
        f"{setup['seconds_per_round']:g} s per target at {concurrency} keep-alive connections"
        + (f", then {setup['latency_seconds_per_round']:g} s at 1" if single else "")
        + f" ({result['date']})",
        f"  {setup['database']}; Python {setup['python']}, {setup['machine']}; "
        f"load average before {load}, after {load_after}",
        f"  {'':30}{'requests':>9}{'calls/s':>9}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
        f"{'errors':>8}",
        _row(f"bare endpoint, {concurrency} conns", bare),
        _row(f"POST /api/v1/calls, {concurrency} conns", api),
    ]
    if single:
        lines += [
            _row("bare endpoint, 1 conn", single["bare"]),
            _row("POST /api/v1/calls, 1 conn", single["api"]),
        ]
    lines.append(
        f"  throughput ratio api/bare: {result['ratio']:.2f} (target >= {TARGET_RATIO}: "
        f"{'met' if targets['ratio_met'] else 'NOT met'}); CPU per request, bare/api: "
        f"{result['cpu_ratio']:.2f} (gunicorn + postgres), {result['app_cpu_ratio']:.2f} "
        "(gunicorn alone)"
    )
    lines.append(
        f"  p50 added by the api: {result['p50_delta_ms']:+.2f} ms at "
        f"{targets['p50_delta_measured_at']} (target <= {TARGET_P50_DELTA_MS:.0f} ms: "
        f"{'met' if targets['p50_met'] else 'NOT met'}); {result['p50_delta_ms_loaded']:+.2f} ms "
        f"at {concurrency} connections, where p50 is mostly queueing"
    )
    if result["p50_delta_ms_by_round"]:
        lines.append(
            "  p50 added round by round at 1 connection: "
            + ", ".join(f"{value:+.2f}" for value in result["p50_delta_ms_by_round"])
            + " ms"
        )
    paired = result["paired"]
    if paired:
        lines += [
            _row("bare endpoint, paired", paired["bare"]),
            _row("POST /api/v1/calls, paired", paired["api"]),
            f"  p50 added, paired (one connection sends each session to both, in turn): "
            f"{paired['p50_delta_ms']:+.2f} ms; round by round: "
            + ", ".join(f"{value:+.2f}" for value in paired["p50_delta_ms_by_round"])
            + " ms",
        ]
    if single:
        # Every kind of call against the bare endpoint's p50 (it does the same for each): where
        # the mix's p50 falls depends on how the kinds' latencies interleave.
        base = single["bare"]["p50_ms"]
        by_kind = single["api"]["p50_ms_by_kind"]
        lines.append(
            "  p50 added by kind at 1 connection: "
            + ", ".join(f"{kind} {value - base:+.2f}" for kind, value in by_kind.items())
        )
    for label, figures in (("bare", bare), ("api", api)):
        cpu = figures["cpu"]
        lines.append(
            f"  CPU {label:4}: gunicorn {cpu['server_cores']:.2f} cores "
            f"({cpu['server_us_per_request']:.0f} us/req), postgres {cpu['database_cores']:.2f} "
            f"({cpu['database_us_per_request']:.0f} us/req), client {cpu['client_cores']:.2f} "
            f"({cpu['client_us_per_request']:.0f} us/req), other processes "
            f"{cpu['other_cores']:.2f}"
        )
    lines.append(
        "  api outcomes: " + ", ".join(f"{name} {count}" for name, count in api["outcomes"].items())
    )
    checks = result["checks"]
    lines.append(
        f"  checks: {checks['audit_records']} audit records for {checks['api_requests_sent']} "
        f"api requests; {checks['bare_rows']} bare rows for {checks['bare_requests_sent']} "
        f"bare requests; {checks['refunds']} refunds; orders whose ledger does not add up: "
        f"{checks['orders_whose_ledger_does_not_add_up']}"
    )
    everything = [("bare", bare), ("api", api)]
    if single:
        everything += [("bare, 1 conn", single["bare"]), ("api, 1 conn", single["api"])]
    if result["paired"]:
        everything += [("bare, paired", paired["bare"]), ("api, paired", paired["api"])]
    for label, figures in everything:
        if figures["errors"] or figures["unexpected_outcomes"]:
            lines.append(
                f"  {label}: {figures['errors']} transport errors ({figures['first_error']}), "
                f"{figures['unexpected_outcomes']} answers with an unexpected outcome"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.api", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each bare then api")
    parser.add_argument(
        "--latency", type=float, default=2.0, help="seconds per round at 1 connection (0: none)"
    )
    parser.add_argument(
        "--paired",
        type=float,
        default=8.0,
        help="seconds per round at 1 connection sending each session to both targets (0: none)",
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument(
        "--max-requests", type=int, default=100_000, help="cap of measured requests per phase"
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--worker-class", default="gthread", choices=["gthread", "sync"])
    parser.add_argument("--threads", type=int, default=4, help="threads per gthread worker")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument(
        "--client-side-binding",
        action="store_true",
        help="what if: Django's default, parameters bound by psycopg and no statement prepared",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="print nothing, return the results")
    options = parser.parse_args(argv)
    options.rounds = max(1, options.rounds)
    options.concurrency = max(1, options.concurrency)
    result = measure(options)
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        print(render(result))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["_load"]:
        load_main(sys.argv[2:])
    elif sys.argv[1:2] == ["_seed"]:
        seed_main()
    else:
        main(sys.argv[1:])
