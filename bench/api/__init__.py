"""Benchmark (b): `POST /api/v1/calls` under gunicorn on PostgreSQL, against a bare endpoint.

Both targets run in the same gunicorn (same workers, same settings, `bench.settings`) on a
database of their own (`toolgate_bench`, dropped and created by each run, migrated, seeded with
the project's services: 64 customers with 8 BRL orders each, and one agent whose policy allows
both order tools, 50 steps a session and 3 repeats, and executes without a human every refund the
mix sends: its auto-approve amount is above the orders' totals together).

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
     6  refund_order of a few BRL, amounts no other session of the customer  30%  OK, executed
        sends (a refund that repeats another session's is held as a duplicate)
     1  an exact repeat of one of those refunds                               5%  OK, replayed
     3  bad calls, kinds taken in turn from the 6 below                      15%

    invalid_json     arguments cut off mid-object                    INVALID_JSON
    float_amount     amount_cents 25.9 instead of 2590               INVALID_ARGUMENTS
    wrong_currency   a refund in USD of an order in BRL              CURRENCY_MISMATCH
    invented_order   get_order of an order that does not exist       ORDER_NOT_FOUND
    extra_field      get_order with an argument it does not take     INVALID_ARGUMENTS
    unknown_tool     teleport_order                                  UNKNOWN_TOOL

A new session every 20 calls keeps every session within its step budget and repeat limit; the
client checks the code of every answer against the one its kind must get.

Targets: the api's throughput at least 0.7 of the bare endpoint's, and its p50 at most 1 ms above.
The p50 target is judged at 1 connection: at 8, both are saturated and a p50 is mostly queueing
(p50 ~ connections / throughput), so its delta only restates the throughput ratio, times 8. The
paired phase measures the same thing with drift cancelled over a tenth of a second instead of a
few seconds; it is printed beside the target's figure as a check on it, not instead of it.

The modules, by job: mix (the sessions and the code each call must get), load (the load
process), server (the bench database and gunicorn), cpu (the /proc sampler), phase (a measured
phase, and the rounds), report (the figures, the targets, the printout).

Run: `.venv/bin/python -m bench.api [--duration S] [--rounds R] [--paired S] [--concurrency N]
[--json]`.
Needs PostgreSQL at 127.0.0.1:5432 (`--pg-url`) and Redis (`BENCH_CACHE_URL`, by default
redis://127.0.0.1:6379/1, where the throttle counts); sends load to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.api.phase import run_rounds
from bench.api.report import render, result_of
from bench.api.server import (
    create_database,
    database_counts,
    drop_database,
    prepare,
    start_gunicorn,
    statements_read,
    statements_reset,
    wait_ready,
)


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
        port=options.port,
    )
    try:
        wait_ready(server, token)
        counting = options.statements and statements_reset(pg_url, options.database)
        phases, sent = run_rounds(server, token, options, (pg_url, options.database))
        statements = statements_read(pg_url, options.database) if counting else None
    finally:
        server.stop()
    if log.exists() and not log.read_text().strip():
        log.unlink()  # kept only when gunicorn had something to say
    counts = database_counts(pg_url, options.database)
    if not options.keep_database:
        drop_database(pg_url, options.database)
    return result_of(
        options,
        phases=phases,
        sent=sent,
        counts=counts,
        server_version=server_version,
        load_before=load_before,
        statements=statements,
    )


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
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
    parser.add_argument(
        "--port", type=int, default=0, help="gunicorn's port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument(
        "--client-side-binding",
        action="store_true",
        help="what if: Django's default, parameters bound by psycopg and no statement prepared",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="where PostgreSQL's time goes: the statements that took most of it (the server "
        "must load pg_stat_statements; docs/benchmarks.md says how)",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="print nothing, return the results")
    options = parser.parse_args(argv)
    options.rounds = max(1, options.rounds)
    options.concurrency = max(1, options.concurrency)
    return options


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    options = _options(argv)
    result = measure(options)
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        print(render(result))
    return result
