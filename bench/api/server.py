"""The server side of benchmark (b): the bench database and the gunicorn that serves it.

The database (`toolgate_bench` by default) is dropped and created by each run, migrated with
`bench.settings` and seeded with the project's services; gunicorn runs `toolgate.wsgi` with the
same settings on 127.0.0.1. At the end, the database's rows are counted as a check on the load.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.api.load import Connection
from bench.api.mix import CUSTOMERS, ORDERS_PER_CUSTOMER, customer_id, order_ids

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MODULE = "bench.settings"

ORDER_TOTAL_CENTS = 10**12
# Above every seeded order's total together: whatever a run refunds a customer within the policy's
# window, no refund is held for the sum (dispatch/pipeline/allowance.py), so every refund of the
# mix executes and moves money, as the bench means to measure.
AUTO_APPROVE_BELOW_CENTS = CUSTOMERS * ORDERS_PER_CUSTOMER * ORDER_TOTAL_CENTS + 1
AGENT_NAME = "bench-agent"


# --- the database ----------------------------------------------------------------------------


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


def migrate(database_url: str) -> dict[str, str]:
    """Migrate the bench database; returns the environment its Django commands run in."""
    env = _django_env(database_url)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    return env


def prepare(database_url: str) -> str:
    """Migrate the bench database and seed it; returns the agent's token."""
    env = migrate(database_url)
    seeded = subprocess.run(
        [sys.executable, "-m", "bench.api", "_seed"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return str(json.loads(seeded.stdout.strip().splitlines()[-1])["token"])


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


# --- gunicorn --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _processes() -> Iterator[tuple[int, int]]:
    """(pid, parent's pid) of every process, from /proc."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            yield int(entry), int(fields[1])


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
    port: int = 0,
    nice: int = 0,
    env: dict[str, str] | None = None,
    stderr_to_log: bool = False,
) -> Server:
    """gunicorn on 127.0.0.1; `nice` lowers its CPU priority, `env` adds to its environment, and
    `stderr_to_log` sends what Django logs (a 503's line, say) to the log rather than here."""
    port = port or free_port()
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
    stderr = log.open("a") if stderr_to_log else None
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**_django_env(database_url, client_side_binding), **(env or {})},
        stderr=stderr,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    if stderr is not None:
        stderr.close()
    return Server(process, port, log)


def wait_ready(server: Server, token: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    request = (
        f"GET /api/v1/codes HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Token {token}\r\n\r\n"
    ).encode()
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"bench.api: gunicorn exited; see {server.log}")
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
    raise SystemExit(f"bench.api: gunicorn did not answer within {timeout:.0f} s")


# --- where PostgreSQL's time goes ------------------------------------------------------------


def statements_reset(pg_url: str, name: str) -> bool:
    """Start counting the bench database's statements afresh, if the server loads
    pg_stat_statements (shared_preload_libraries); False where it does not."""
    import psycopg

    with psycopg.connect(f"{pg_url}/{name}", autocommit=True) as connection:
        try:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            connection.execute(
                "SELECT pg_stat_statements_reset(0, "
                "(SELECT oid FROM pg_database WHERE datname = current_database()), 0)"
            )
        except psycopg.Error:
            return False
    return True


def statements_read(pg_url: str, name: str, limit: int = 12) -> list[dict[str, Any]]:
    """The bench database's statements that took the most of the server's time, with how often
    they ran, how long one took on average and the WAL it wrote."""
    import psycopg

    with psycopg.connect(f"{pg_url}/{name}", autocommit=True) as connection:
        rows = connection.execute(
            "SELECT calls, total_exec_time, wal_bytes, query FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT ILIKE '%%pg_stat_statements%%' "
            "ORDER BY total_exec_time DESC LIMIT %s",
            [limit],
        ).fetchall()
    return [
        {
            "calls": int(calls),
            "total_ms": float(total),
            "mean_us": float(total) * 1000 / calls if calls else 0.0,
            "wal_bytes_per_call": float(wal) / calls if calls else 0.0,
            "statement": " ".join(query.split())[:100],
        }
        for calls, total, wal, query in rows
    ]
