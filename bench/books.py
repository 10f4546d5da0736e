"""Benchmark (f): the books' reconciler (books/reconciler.py), its run over what changed and its
full sweep.

A bench database of its own is migrated and filled in set-based SQL: `--orders` orders (1 M by
default) of 100,000 customers, half of them refunded once without a human (its ledger row and
its money's movement, spread over 30 days), one refund in ten of those held, approved by a
reviewer and executed instead (its confirmation, vote, approval event, ledger row under its
execution key, and its money moved with a reviewer), and retail orders paid and partly refunded.

Then, as beat would:

- the baseline: a run over what changed when nothing did (its fixed cost: one statement per
  check, each reading the rows above its marks);
- a run after 10,000 calls' worth of new rows (`--calls`): as many refunds with their movements,
  one in ten held and executed with its events; its cost over the baseline's is the cost per
  10,000 calls;
- the full sweep over everything, each check's time printed.

Every run must find no breach: the figures are those of a clean system's books.

Run: `.venv/bin/python -m bench.books [--orders 1000000] [--calls 10000] [--pg-url URL]`
(PostgreSQL as a superuser; the filling prints its progress; a few minutes at 1 M orders).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.api.server import _django_env, create_database, drop_database, migrate

CUSTOMERS = 100_000
# One refund in this many is held and executed after a reviewer's approval.
HELD_EVERY = 10

_EXECUTION_KEY = "encode(sha256(convert_to('confirmation:' || {id}, 'UTF8')), 'hex')"


def _fill_statements(first: int, last: int, agent: int, reviewer: int, retail: bool) -> list[str]:
    """The rows of orders first..last: each even order refunded once (1,000 cents), one refund in
    HELD_EVERY through a confirmation; with `retail`, a retail order paid and half refunded per
    order in ten."""
    refunded = f"i BETWEEN {first} AND {last} AND i % 2 = 0"
    held = f"(i / 2) % {HELD_EVERY} = 0"
    at = "now() - make_interval(secs => (i::bigint * 7919 % 2592000))"
    execution_key = _EXECUTION_KEY.format(id="'C' || i")
    key = f"CASE WHEN {held} THEN {execution_key} ELSE md5('k' || i) END"
    statements = [
        f"""
        INSERT INTO orders_order (order_id, customer_id, total_cents, currency, refunded_cents,
            created_at)
        SELECT 'ORD-' || i, 'CUS-' || (i % {CUSTOMERS}), 12000, 'BRL',
            CASE WHEN i % 2 = 0 THEN 1000 ELSE 0 END, {at} - interval '1 day'
        FROM generate_series({first}, {last}) AS i
        """,
        f"""
        INSERT INTO orders_refund (order_id, idempotency_key, amount_cents, currency, reason,
            approval, approved_by, refunded_cents_after, created_at)
        SELECT o.id, {key}, 1000, 'BRL', 'damaged',
            CASE WHEN {held} THEN 'reviewer' ELSE 'policy' END,
            CASE WHEN {held} THEN 'bench-reviewer' ELSE '' END, 1000, {at}
        FROM generate_series({first}, {last}) AS i JOIN orders_order o ON o.order_id = 'ORD-' || i
        WHERE {refunded}
        """,
        f"""
        INSERT INTO dispatch_movement (key, agent_id, session_id, customer_id, currency, tool,
            subject, amount_cents, approval, at, day, released_at, expires_at, confirmation_id)
        SELECT {key}, {agent}, 's-' || i, 'CUS-' || (i % {CUSTOMERS}), 'BRL', 'refund_order',
            'ORD-' || i, 1000, CASE WHEN {held} THEN 'reviewer' ELSE 'policy' END, {at},
            ({at})::date, NULL, NULL, CASE WHEN {held} THEN 'C' || i ELSE '' END
        FROM generate_series({first}, {last}) AS i WHERE {refunded}
        """,
        f"""
        INSERT INTO dispatch_confirmation (id, key, tool, arguments, arguments_hash, agent_id,
            session_id, customer_id, policy_version, reviewers_required, amount_cents, currency,
            status, hold_reason, host_context, decision_reason, decision_code, created_at,
            expires_at, decided_at, finished_at, duplicate_of, event_seq, event_head)
        SELECT 'C' || i, md5('call' || i), 'refund_order',
            jsonb_build_object('order_id', 'ORD-' || i, 'amount_cents', 1000, 'currency', 'BRL',
                'reason', 'damaged'),
            md5('args' || i), {agent}, 's-' || i, 'CUS-' || (i % {CUSTOMERS}), 1, 1, 1000, 'BRL',
            'executed', '{{}}'::jsonb, '', '', '', {at} - interval '10 minutes', {at},
            {at} - interval '5 minutes', {at}, '', 3, ''
        FROM generate_series({first}, {last}) AS i WHERE {refunded} AND {held}
        """,
        f"""
        INSERT INTO approvals_vote (confirmation_id, reviewer_id, at)
        SELECT 'C' || i, {reviewer}, {at} - interval '5 minutes'
        FROM generate_series({first}, {last}) AS i WHERE {refunded} AND {held}
        """,
        f"""
        INSERT INTO approvals_confirmationevent (confirmation_id, at, kind, actor_id, actor_label,
            message, data, chain_hash)
        SELECT 'C' || i, {at} - make_interval(mins => (6 - step)::int), kind, NULL, 'bench', '',
            CASE WHEN kind = 'approved' THEN '{{"sum_cents": 1000}}'::jsonb ELSE '{{}}' END, ''
        FROM generate_series({first}, {last}) AS i,
            unnest(ARRAY['voted', 'approved', 'executed']) WITH ORDINALITY AS e(kind, step)
        WHERE {refunded} AND {held}
        """,
    ]
    if retail:
        statements += [
            f"""
            INSERT INTO retail_retailorder (order_id, user_id, user_position, address1, address2,
                city, state, country, zip, status, fulfillments, cancel_reason,
                exchange_payment_method_id, return_payment_method_id)
            SELECT '#B' || i, (SELECT min(id) FROM retail_retailuser), i, '1 Road', '', 'City',
                'ST', 'USA', '10000', 'delivered', '[]'::jsonb, '', '', ''
            FROM generate_series({first}, {last}) AS i WHERE i % 10 = 0
            """,
            f"""
            INSERT INTO retail_payment (order_id, position, transaction_type, amount_cents,
                payment_method_id)
            SELECT o.id, p.position, p.kind, p.cents, 'gift_card_1'
            FROM generate_series({first}, {last}) AS i
                JOIN retail_retailorder o ON o.order_id = '#B' || i,
                (VALUES (0, 'payment', 5000), (1, 'refund', 2500)) AS p(position, kind, cents)
            WHERE i % 10 = 0
            """,
        ]
    return statements


def _setup(database_url: str) -> None:
    os.environ.update(_django_env(database_url))
    import django

    django.setup()


def _seed() -> tuple[int, int]:
    """The agent and its policy, a reviewer with no limit, a retail user: through the services."""
    from django.contrib.auth.models import User

    from dispatch.services import agent_create
    from retail.models import RetailUser

    agent = agent_create(
        name="bench-books",
        allowed_tools=["get_order", "refund_order"],
        max_amount_cents=50_000,
        auto_approve_below_cents=50_000,
    )[0]
    reviewer = User.objects.create_user("bench-reviewer", password="-")
    RetailUser.objects.create(
        user_id="bench_user", first_name="B", last_name="U", email="b@example.com",
        address1="1 Road", city="City", state="ST", country="USA", zip="10000",
    )  # fmt: skip
    # The bench's history goes back 30 days; the policy was there before it.
    from dispatch.models import Policy

    Policy.objects.filter(agent=agent).update(created_at="2000-01-01T00:00:00Z")
    return int(agent.pk), int(reviewer.pk)


def _fill(first: int, last: int, agent: int, reviewer: int, *, retail: bool) -> float:
    from django.db import connection, transaction

    began = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        # The bench writes what the services would, without their triggers' bookkeeping.
        cursor.execute("SET LOCAL session_replication_role = replica")
        for statement in _fill_statements(first, last, agent, reviewer, retail):
            cursor.execute(statement)
    return time.perf_counter() - began


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _timed_run(full: bool) -> dict[str, Any]:
    from books.reconciler import books_check

    each: dict[str, float] = {}

    def progress(invariant: str, found: int, seconds: float) -> None:
        each[invariant] = round(seconds * 1000, 1)

    began = time.perf_counter()
    checked = books_check(full=full, progress=progress)
    seconds = time.perf_counter() - began
    if checked.found:
        raise SystemExit(f"the bench's books are not clean: {checked.found[:3]}")
    return {"ms": round(seconds * 1000, 1), "checks_ms": each}


def measure(options: argparse.Namespace) -> dict[str, Any]:
    pg_url = options.pg_url.rstrip("/")
    drop_database(pg_url, options.database)
    server = create_database(pg_url, options.database)
    database_url = f"{pg_url}/{options.database}"
    migrate(database_url)
    _setup(database_url)
    agent, reviewer = _seed()
    orders, calls = options.orders, options.calls
    print(f"filling {orders:,} orders ...", file=sys.stderr)
    fill_seconds = 0.0
    chunk = 250_000
    for first in range(1, orders + 1, chunk):
        last = min(first + chunk - 1, orders)
        fill_seconds += _fill(first, last, agent, reviewer, retail=True)
        print(f"  {last:,} orders ({fill_seconds:.0f} s)", file=sys.stderr)
    _analyze()
    # Two runs over what changed stand the marks past every row (the first reads them all).
    _timed_run(full=False)
    _timed_run(full=False)
    baselines = [_timed_run(full=False) for _ in range(options.rounds)]
    # 10,000 calls: every other one a refund, as the history's: 2 x calls orders' numbers.
    first = orders + 1
    _fill(first, first + 2 * calls - 1, agent, reviewer, retail=False)
    changed = _timed_run(full=False)
    again = _timed_run(full=False)
    sweeps = [_timed_run(full=True) for _ in range(options.rounds)]
    baseline_ms = statistics.median(run["ms"] for run in baselines)
    sweep_ms = statistics.median(run["ms"] for run in sweeps)
    return {
        "server": server,
        "orders": orders,
        "calls": calls,
        "fill_seconds": round(fill_seconds, 1),
        "baseline_ms": baseline_ms,
        "baseline_checks_ms": baselines[len(baselines) // 2]["checks_ms"],
        "changed_ms": changed["ms"],
        "changed_again_ms": again["ms"],
        "per_calls_ms": round(changed["ms"] - baseline_ms, 1),
        "changed_checks_ms": changed["checks_ms"],
        "sweep_ms": sweep_ms,
        "sweep_checks_ms": sweeps[len(sweeps) // 2]["checks_ms"],
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"books: {result['orders']:,} orders (filled in {result['fill_seconds']} s), "
        f"{result['server']}",
        f"  run over what changed, nothing new (baseline): {result['baseline_ms']} ms",
        f"    by check: {result['baseline_checks_ms']}",
        f"  run after {result['calls']:,} calls: {result['changed_ms']} ms "
        f"({result['per_calls_ms']} ms over the baseline); the next run, reading them again: "
        f"{result['changed_again_ms']} ms",
        f"    by check: {result['changed_checks_ms']}",
        f"  full sweep: {result['sweep_ms'] / 1000:.2f} s",
        f"    by check: {result['sweep_checks_ms']}",
    ]
    return "\n".join(lines)


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.books", description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench_books")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    options = _options(argv)
    try:
        result = measure(options)
    finally:
        if not options.keep:
            from django.db import connections

            connections.close_all()
            drop_database(options.pg_url.rstrip("/"), options.database)
    print(json.dumps(result, indent=2) if options.json else render(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
