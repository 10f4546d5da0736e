"""Benchmark (c): the manager's figures at ten thousand and at a million calls.

A database of its own (`toolgate_bench_analytics` by default, dropped and created by each run,
migrated) is loaded with synthetic audit records spread over the last 30 days (3 agents, both
order tools, the mix of codes a busy deployment sees, sessions of about ten calls) by COPY, and
held calls with their decisions; the rollups are then built by `rebuild_rollups`' own code, which
is also timed. At each size it measures, in-process through Django's test client (so the server
time, with middleware, authentication and JSON rendering), the median of repeated requests to
`GET /api/v1/metrics` over the 30 days, and to the dashboard `/analytics/` when it exists; and
`analytics.selectors.call_figures` alone. Targets: under 300 ms at a million, and at most 2x from
ten thousand to a million.

Run: `.venv/bin/python -m bench.analytics [--sizes 10000,1000000] [--repeat 15] [--json]`.
Needs PostgreSQL at 127.0.0.1:5432 (`--pg-url`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 300.0
# The 30 days the figures are asked for, on the API and on the dashboard.
QUERY = {"bucket": "day"}
DASHBOARD = {"range": "30d"}
TARGET_RATIO = 2.0

# (code, share of calls): what a busy deployment of two tools sees.
MIX = [
    ("OK", 0.70),
    ("INVALID_ARGUMENTS", 0.08),
    ("INVALID_JSON", 0.03),
    ("ORDER_NOT_FOUND", 0.05),
    ("CONFIRMATION_REQUIRED", 0.04),
    ("AMOUNT_EXCEEDS_REFUNDABLE", 0.03),
    ("CURRENCY_MISMATCH", 0.02),
    ("LOOP_DETECTED", 0.02),
    ("STEP_LIMIT", 0.01),
    ("UNKNOWN_TOOL", 0.02),
]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.analytics", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="audit records, ascending")
    parser.add_argument("--repeat", type=int, default=15, help="requests per figure")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench_analytics")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    options = parser.parse_args(argv)
    sizes = sorted(int(size) for size in options.sizes.split(","))

    _recreate(options.pg_url, options.database)
    env = {
        **os.environ,
        "DATABASE_URL": f"{options.pg_url}/{options.database}",
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
        "DEBUG": "False",
        "ALLOWED_HOSTS": "testserver",
        "CELERY_BROKER_URL": "",
    }
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True
        )
        measured = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.analytics",
                "_measure",
                "--sizes",
                ",".join(map(str, sizes)),
                "--repeat",
                str(options.repeat),
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        if not options.keep_database:
            _drop(options.pg_url, options.database)
    result: dict[str, Any] = json.loads(measured.stdout.strip().splitlines()[-1])
    first, last = result["sizes"][0], result["sizes"][-1]
    for figure in ("metrics_api_ms", "dashboard_ms", "call_figures_ms"):
        if first.get(figure) and last.get(figure):
            result.setdefault("ratios", {})[figure] = last[figure] / first[figure]
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        _print(result)
    return result


def _print(result: dict[str, Any]) -> None:
    print("(c) the manager's figures, server time, median of repeated requests")
    print(f"{'records':>10} {'metrics API':>12} {'dashboard':>10} {'figures':>9} {'rebuild':>9}")
    for size in result["sizes"]:
        dashboard = size.get("dashboard_ms")
        print(
            f"{size['records']:>10} {size['metrics_api_ms']:>10.1f}ms "
            f"{'-' if dashboard is None else f'{dashboard:.1f}ms':>10} "
            f"{size['call_figures_ms']:>7.1f}ms {size['rebuild_s']:>8.1f}s"
        )
    last = result["sizes"][-1]
    for figure, ratio in result.get("ratios", {}).items():
        met = ratio <= TARGET_RATIO and last[figure] < TARGET_MS
        print(
            f"  {figure}: {ratio:.2f}x from the first size to the last, {last[figure]:.1f} ms "
            f"at {last['records']}: {'met' if met else 'NOT met'} (at most {TARGET_RATIO}x, "
            f"under {TARGET_MS:.0f} ms)"
        )


def _recreate(pg_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
        admin.execute(f'CREATE DATABASE "{database}"')


def _drop(pg_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')


# In the measuring process, with Django set up on the bench database --------------------------


def _measure(sizes: list[int], repeat: int) -> dict[str, Any]:
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from analytics.fills import rollups_rebuild
    from analytics.selectors import call_figures
    from dispatch.services import agent_create

    agents = [
        agent_create(
            name=f"bench-{n}",
            allowed_tools=["get_order", "refund_order"],
            max_amount_cents=50_000,
        )[0].pk
        for n in range(3)
    ]
    manager = User.objects.create_user("bench-manager")
    manager.groups.add(Group.objects.get_or_create(name="managers")[0])
    client = Client()
    client.force_login(manager)
    now = datetime.now(UTC)
    since = now - timedelta(days=30)
    QUERY.update(since=since.isoformat(), until=now.isoformat())
    rng = random.Random(1234)
    loaded, out = 0, []
    for size in sizes:
        _load(size - loaded, agents, since, now, rng, offset=loaded)
        loaded = size
        started = time.perf_counter()
        # Every record loaded is in the past: nothing is still committing.
        rollups_rebuild(lag=timedelta(0))
        rebuild_s = time.perf_counter() - started
        api = _median_ms(lambda: client.get("/api/v1/metrics", QUERY), repeat)
        probe = client.get("/analytics/", DASHBOARD)
        dashboard = (
            _median_ms(lambda: client.get("/analytics/", DASHBOARD), repeat)
            if probe.status_code == 200
            else None
        )
        figures = _median_ms(
            lambda: call_figures(since=since, until=now, bucket=timedelta(days=1)), repeat
        )
        out.append(
            {
                "records": size,
                "metrics_api_ms": api,
                "dashboard_ms": dashboard,
                "call_figures_ms": figures,
                "rebuild_s": rebuild_s,
            }
        )
    return {"sizes": out}


def _median_ms(request: Any, repeat: int) -> float:
    request()  # warm
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = request()
        times.append((time.perf_counter() - started) * 1000)
        if getattr(response, "status_code", 200) != 200:
            raise RuntimeError(f"the request answered {response.status_code}")
    return statistics.median(times)


def _load(
    count: int, agents: list[int], since: datetime, now: datetime, rng: random.Random, offset: int
) -> None:

    codes = [code for code, _ in MIX]
    weights = [share for _, share in MIX]
    span = (now - since).total_seconds()
    buffer = io.StringIO()
    step, session = 0, ""
    for n in range(offset, offset + count):
        if step == 0 or rng.random() < 0.1:
            session, step = f"s-{n}", 0
            at = since + timedelta(seconds=rng.random() * span)
            agent = rng.choice(agents)
        step += 1
        at += timedelta(seconds=rng.random() * 20)
        code = rng.choices(codes, weights)[0]
        tool = "refund_order" if rng.random() < 0.4 else "get_order"
        ok = code == "OK"
        buffer.write(
            "\t".join(
                [
                    f"{n:032x}",
                    at.isoformat(),
                    str(agent),
                    session,
                    "CUS-1",
                    str(step),
                    tool,
                    '{"order_id": "ORD-1001"}',
                    "\\N",
                    "",
                    "t" if ok else "f",
                    code,
                    "Done." if ok else "a message for the model",
                    "t" if ok and rng.random() < 0.05 else "f",
                    "",
                    "1",
                    "2.5",
                    "api",
                ]
            )
            + "\n"
        )
    audit_copy(buffer.getvalue())
    _load_confirmations(count // 100, agents, since, now, rng, offset)


# The audit records' columns that benchmarks load by COPY, in the order of their lines' fields.
AUDIT_COLUMNS = (
    "call_id, at, agent_id, session_id, customer_id, step, tool, raw_arguments, arguments, "
    "key, ok, code, message, replayed, confirmation_id, policy_version, duration_ms, channel"
)


def audit_copy(lines: str) -> None:
    """Audit records by COPY: one line each, its fields in AUDIT_COLUMNS' order, tab-separated."""
    from django.db import connection

    statement = f"COPY dispatch_auditrecord ({AUDIT_COLUMNS}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        copy.write(lines)


def _load_confirmations(
    count: int, agents: list[int], since: datetime, now: datetime, rng: random.Random, offset: int
) -> None:
    """One held call in a hundred, most of them decided, each decision with its event."""
    from approvals.models import ConfirmationEvent
    from dispatch.models import Confirmation

    span = (now - since).total_seconds()
    statuses = ["executed", "rejected", "expired", "invalidated", "failed", "unknown", "pending"]
    held, events = [], []
    for n in range(offset, offset + count):
        created = since + timedelta(seconds=rng.random() * span)
        status = rng.choices(statuses, [60, 15, 10, 5, 3, 2, 5])[0]
        decided = None if status == "pending" else created + timedelta(minutes=rng.random() * 90)
        confirmation = Confirmation(
            id=f"{n:032x}",
            key=f"{n:064x}",
            tool="refund_order",
            arguments={"order_id": "ORD-1001", "amount_cents": 9000, "currency": "BRL"},
            arguments_hash="0" * 64,
            agent_id=rng.choice(agents),
            session_id=f"s-{n}",
            customer_id="CUS-1",
            policy_version=1,
            amount_cents=9000,
            status=status,
            created_at=created,
            expires_at=created + timedelta(hours=24),
            decided_at=decided,
        )
        held.append(confirmation)
        if decided is not None and status != "expired":
            kind = "rejected" if status == "rejected" else "approved"
            events.append(
                ConfirmationEvent(
                    confirmation=confirmation,
                    at=decided,
                    kind=kind,
                    actor_label=rng.choice(["ana", "bruno", "carla"]),
                )
            )
    Confirmation.objects.bulk_create(held, batch_size=2000)
    ConfirmationEvent.objects.bulk_create(events, batch_size=2000)
    from django.db import connection

    # A table just filled by COPY has no statistics yet: the planner would guess.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


if __name__ == "__main__":
    if sys.argv[1:2] == ["_measure"]:
        parser = argparse.ArgumentParser()
        parser.add_argument("_measure")
        parser.add_argument("--sizes", required=True)
        parser.add_argument("--repeat", type=int, required=True)
        args = parser.parse_args()
        print(json.dumps(_measure([int(s) for s in args.sizes.split(",")], args.repeat)))
    else:
        main()
