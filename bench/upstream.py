"""What the gate adds to an HTTP upstream's call: its p50 over calling the upstream directly, for
a read and a write, beside a hosted refund's over its own gateway, all in one run.

The payments stand-in (tests/upstreams/payments_server.py, state in memory, honouring
Idempotency-Key) runs in a process of its own on 127.0.0.1. Each round times seven kinds, in
alternating order, each on fresh arguments:

- upstream read: `Upstream.read("getPayment")` directly, and `get_payment` through
  `call_dispatch` (the whole pipeline: step, key, check, audit record);
- upstream write: `Upstream.write("createRefund")` directly, and `refund_payment` through
  `call_dispatch` (its check's GET, the reservation and key committed, the POST, the settlement);
- hosted refund: `OrmOrderBook.refund` directly, and `refund_order` through `call_dispatch`;
- commit: one row inserted and committed on the same database (one WAL flush).

`call_dispatch` in-process on PostgreSQL (no HTTP into Toolgate, no gunicorn), test settings.
The gated write makes two requests to the upstream (its check reads the payment) and commits
twice (its key and reservation before the upstream is called, its outcome after), where the
stand-in keeps its state in memory and a hosted refund's one commit is its direct call's too; so
its added time is also shown less its check's read and those two commits.

Each added figure is the difference of the two p50s (less the others named); its spread is the
25th to 75th percentile of the same difference taken round by round. The first tenth of the
rounds is left out (warm-up).

    .venv/bin/python -m bench.upstream [--rounds 300] [--pg-url postgres://postgres@127.0.0.1:5432/upstream_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-upstream-token"
CUSTOMERS = 64


def _database(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def _start_upstream(state: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.upstreams.payments_server",
            "--state",
            str(state),
            "--token",
            TOKEN,
            "--seed-payments",
            str(CUSTOMERS),
            "--in-memory",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().split()[1])
    return process, f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/upstream_bench")
    options = parser.parse_args()

    _database(options.pg_url)
    os.environ["DATABASE_URL"] = options.pg_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate.settings.test")
    with tempfile.TemporaryDirectory() as scratch:
        process, url = _start_upstream(Path(scratch) / "payments.json")
        os.environ["TOOLGATE_UPSTREAM_PAYMENTS_URL"] = url
        os.environ["TOOLGATE_UPSTREAM_PAYMENTS_TOKEN"] = TOKEN
        try:
            figures = _measure(options.rounds)
        finally:
            process.kill()
            process.wait()
    print(json.dumps(figures, indent=2))


def _measure(rounds: int) -> dict[str, Any]:
    import logging

    import django

    django.setup()
    logging.disable(logging.WARNING)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection, transaction

    from dispatch.registry import tool_registry
    from dispatch.services import agent_create, call_dispatch
    from orders.gateway import OrmOrderBook
    from orders.models import Order
    from tests.upstreams import payments as declarations
    from upstreams.http import Upstream
    from upstreams.registry import upstream_register

    upstream, _ = upstream_register(declarations, tool_registry)
    assert isinstance(upstream, Upstream)
    book = OrmOrderBook()
    agent, _ = agent_create(
        name="bench-upstream",
        allowed_tools=["get_payment", "refund_payment", "refund_order"],
        max_amount_cents=10**9,
        auto_approve_below_cents=10**9,
        step_budget=10**6,
        repeat_limit=10**6,
    )
    Order.objects.bulk_create(
        Order(
            order_id=f"ORD-{500_000 + n}",
            customer_id=f"cust-{n}",
            total_cents=10**12,
            currency="BRL",
        )
        for n in range(CUSTOMERS)
    )

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_commit (id bigserial PRIMARY KEY)")

    def commit() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_commit DEFAULT VALUES")

    def gated(tool: str, arguments: dict[str, Any], customer: str) -> Callable[[], None]:
        def run() -> None:
            result = call_dispatch(
                agent=agent,
                session_id=f"s-{customer}",
                customer_id=customer,
                tool=tool,
                arguments=arguments,
            )
            assert result.code == "OK", result.message

        return run

    times: dict[str, list[float]] = {}
    kinds = (
        "upstream read direct",
        "upstream read gated",
        "upstream write direct",
        "upstream write gated",
        "hosted refund direct",
        "hosted refund gated",
        "commit",
    )
    for kind in kinds:
        times[kind] = []
    for number in range(rounds):
        n = number % CUSTOMERS
        customer, payment, order = f"cust-{n}", f"PAY-{1000 + n}", f"ORD-{500_000 + n}"
        amount = 100 + number
        refund = {"amount_cents": amount, "currency": "BRL", "reason": "damaged"}
        body = {**refund, "client_reference": uuid.uuid4().hex}
        key = uuid.uuid4().hex
        runs: dict[str, Callable[[], Any]] = {
            "upstream read direct": partial(
                upstream.read, "getPayment", declarations.Payment, path={"payment_id": payment}
            ),
            "upstream read gated": gated("get_payment", {"payment_id": payment}, customer),
            "upstream write direct": partial(
                upstream.write,
                "createRefund",
                declarations.RefundMade,
                key=key,
                path={"payment_id": payment},
                body=body,
            ),
            "upstream write gated": gated(
                "refund_payment", {"payment_id": payment, **refund}, customer
            ),
            "hosted refund direct": partial(
                book.refund,
                customer_id=customer,
                order_id=order,
                amount_cents=amount + 1,
                currency="BRL",
                reason="damaged",
                key=uuid.uuid4().hex,
                approved_by=(),
            ),
            "hosted refund gated": gated("refund_order", {"order_id": order, **refund}, customer),
            "commit": commit,
        }
        # Alternate the order of each pair, so that neither always goes first.
        order_of = kinds if number % 2 else tuple(reversed(kinds))
        for kind in order_of:
            started = time.perf_counter()
            runs[kind]()
            times[kind].append((time.perf_counter() - started) * 1000.0)
    warm = {kind: values[len(values) // 10 :] for kind, values in times.items()}
    p50 = {kind: statistics.median(values) for kind, values in warm.items()}

    def added(gated: str, direct: str, *less: str) -> dict[str, Any]:
        rounds = [
            g - d - sum(warm[kind][at] for kind in less)
            for at, (g, d) in enumerate(zip(warm[gated], warm[direct], strict=True))
        ]
        quartiles = statistics.quantiles(rounds, n=4)
        return {
            "p50_ms": round(p50[gated] - p50[direct] - sum(p50[kind] for kind in less), 3),
            "spread_ms": [round(quartiles[0], 3), round(quartiles[2], 3)],
        }

    read = ("upstream read gated", "upstream read direct")
    write = ("upstream write gated", "upstream write direct")
    return {
        "rounds": rounds,
        "p50_ms": {kind: round(value, 3) for kind, value in p50.items()},
        "added": {
            "upstream read": added(*read),
            "upstream write": added(*write),
            "upstream write, less its check's read": added(*write, "upstream read direct"),
            "upstream write, less its check's read and two commits": added(
                *write, "upstream read direct", "commit", "commit"
            ),
            "hosted refund": added("hosted refund gated", "hosted refund direct"),
        },
    }


if __name__ == "__main__":
    main()
