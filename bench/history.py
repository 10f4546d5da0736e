"""Benchmark (b) with a big history: the API on a database that already holds months of calls.

Two databases are built once each, as templates that later runs copy (`CREATE DATABASE ...
TEMPLATE`, which copies files, not rows): *empty*, migrated and seeded as benchmark (b) seeds its
own (bench/api/server.py), and *big*, the same plus a history filled in SQL: by default 10 M audit
records and 1 M idempotency records, from 20 agents' sessions of 20 calls each spread over the
last 30 days (a session's calls a few seconds apart, its customers among 5,000), with columns of
realistic size: arguments as a model sends them, a key on every write, a message, a call id and a
chain hash. Their chain links are not valid: nothing here verifies them. The audit records'
indexes and constraints are dropped while it fills, made again afterwards, and the tables
vacuumed and analysed, as autovacuum would have them in production.

A run copies both templates, migrates the copies (a migration since the build applies there), and
serves each from its own gunicorn (bench.settings, as (b) does). Rounds take the two in turns,
the first alternating: at `--concurrency` connections (throughput), then at 1 (latency without
queueing), each with the mix of benchmark (b) (bench/api/mix.py) against the API only. The figures
are the big database's over the empty one's, round by round: their median and range.

Target: big at most 1.2x empty, in throughput (empty's over big's) and in p50 at 1 connection.

Run: `.venv/bin/python -m bench.history [--history 10000000,1000000] [--rounds 5] [--rebuild]`.
Needs what benchmark (b) needs (PostgreSQL at `--pg-url` as a superuser, Redis for the
throttle); building the big template takes a while, with its progress printed (`--history` with
smaller numbers builds a smaller one, under its own name).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.api.phase import Plan, run_phase
from bench.api.report import summarise
from bench.api.server import (
    Server,
    drop_database,
    migrate,
    prepare,
    start_gunicorn,
    wait_ready,
)

TARGET_RATIO = 1.2
HISTORY_AGENTS = 20
CALLS_PER_SESSION = 20
HISTORY_CUSTOMERS = 5000
HISTORY_DAYS = 30
# Rows a statement inserts: each commits, and its rate is printed.
FILL_CHUNK = 500_000

# One history call: its place i (1..N) makes its session, time, tool, outcome and texts. The
# session of place i is (i - 1) / 20; its agent and customer follow from the session; its calls
# are a few seconds apart, the sessions spread evenly over the 30 days. Every other call writes
# (a refund, with a key); some are refused, as a model's calls are.
_AUDIT_FILL = """
INSERT INTO dispatch_auditrecord
    (call_id, at, agent_id, session_id, customer_id, step, tool, raw_arguments, arguments, key,
    ok, code, message, replayed, confirmation_id, policy_version, duration_ms, channel, chain_seq,
    chain_hash)
SELECT
    md5('call' || i),
    now() - make_interval(days => {days})
        + ((s::float8 / {sessions}) * {days} * 86400 + seq * 7) * interval '1 second',
    ({agent_ids})[s %% {agents} + 1],
    'hist-' || s,
    'CUS-H' || lpad((s %% {customers})::text, 5, '0'),
    seq,
    CASE WHEN write THEN 'refund_order' ELSE 'get_order' END,
    CASE WHEN write THEN
        '{{"order_id": "ORD-' || (100000 + i %% 900000) || '", "amount_cents": '
        || (i %% 9000 + 100) || ', "currency": "BRL", "reason": "damaged on arrival"}}'
    ELSE '{{"order_id": "ORD-' || (100000 + i %% 900000) || '"}}' END,
    CASE WHEN write THEN jsonb_build_object('order_id', 'ORD-' || (100000 + i %% 900000),
        'amount_cents', i %% 9000 + 100, 'currency', 'BRL', 'reason', 'damaged on arrival')
    ELSE jsonb_build_object('order_id', 'ORD-' || (100000 + i %% 900000)) END,
    CASE WHEN write THEN md5('key' || i) || md5('yek' || i) ELSE '' END,
    NOT refused,
    CASE WHEN refused THEN 'INVALID_ARGUMENTS' ELSE 'OK' END,
    CASE WHEN refused THEN 'amount_cents: 25.9 is not an integer (send an integer in minor units)'
        WHEN write THEN 'Refund executed.' ELSE 'Order found.' END,
    false, '', 1, 3.5 + (i %% 50) / 10.0, 'api', seq,
    md5('link' || i) || md5('knil' || i)
FROM (
    SELECT i, (i - 1) / {per_session} AS s, (i - 1) %% {per_session} + 1 AS seq,
        i %% 2 = 0 AS write, i %% 7 = 0 AS refused
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
) AS place
"""

# The sessions of the history, as the calls above left them.
_SESSION_FILL = """
INSERT INTO dispatch_session (agent_id, session_id, customer_id, steps, created_at, last_call_at)
SELECT
    ({agent_ids})[s %% {agents} + 1],
    'hist-' || s,
    'CUS-H' || lpad((s %% {customers})::text, 5, '0'),
    {per_session},
    now() - make_interval(days => {days}) + (s::float8 / {sessions}) * {days} * interval '1 day',
    now() - make_interval(days => {days}) + (s::float8 / {sessions}) * {days} * interval '1 day'
        + {per_session} * 7 * interval '1 second'
FROM generate_series(%(first)s::bigint - 1, %(last)s::bigint - 1) AS s
"""

# The keys of the history's writes, the newest sessions' first (keys are kept a while, calls for
# good), each with the answer a replay gets.
_KEY_FILL = """
INSERT INTO dispatch_idempotencyrecord
    (key, agent_id, session_id, tool, status, attempts, result, confirmation_id,
    confirmation_expires_at, created_at, updated_at)
SELECT
    md5('key' || i) || md5('yek' || i),
    ({agent_ids})[s %% {agents} + 1],
    'hist-' || s, 'refund_order', 'completed', 1,
    jsonb_build_object('ok', true, 'tool', 'refund_order', 'code', 'OK',
        'message', 'Refund executed.', 'data', jsonb_build_object('refund_id', 'RF-' || i,
        'amount_cents', i %% 9000 + 100, 'currency', 'BRL'), 'retryable', false),
    '', NULL, at, at
FROM (
    SELECT i, (i - 1) / {per_session} AS s,
        now() - make_interval(days => {days})
            + (((i - 1) / {per_session})::float8 / {sessions}) * {days} * interval '1 day' AS at
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
) AS place
WHERE i %% 2 = 0
"""


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _connect(pg_url: str, name: str) -> Any:
    import psycopg

    return psycopg.connect(f"{pg_url}/{name}", autocommit=True)


def _template_info(pg_url: str, name: str) -> dict[str, Any] | None:
    with _connect(pg_url, "postgres") as connection:
        row = connection.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [name],
        ).fetchone()
    if row is None or not row[0]:
        return None
    try:
        info: dict[str, Any] = json.loads(row[0])
    except ValueError:
        return None
    return info


def _in_chunks(
    connection: Any, label: str, statement: str, total: int, chunk: int = FILL_CHUNK
) -> None:
    started = time.monotonic()
    for first in range(1, total + 1, chunk):
        last = min(total, first + chunk - 1)
        connection.execute(statement, {"first": first, "last": last})
        done = time.monotonic() - started
        rate = last / done if done else 0.0
        left = (total - last) / rate if rate else 0.0
        _say(f"  {label}: {last:,} of {total:,} ({rate:,.0f}/s, about {left:.0f} s left)")


def _fill(pg_url: str, name: str, audit_records: int, keys: int) -> None:
    """The history, in SQL: agents, sessions, audit records, keys; then the indexes, a vacuum."""
    # Each history call that writes has a key; keys are taken from the newest calls back, so
    # that the keys' places are the last 2 * keys of the calls.
    sessions = math.ceil(audit_records / CALLS_PER_SESSION)
    shape: dict[str, Any] = {
        "days": HISTORY_DAYS,
        "agents": HISTORY_AGENTS,
        "customers": HISTORY_CUSTOMERS,
        "per_session": CALLS_PER_SESSION,
        "sessions": sessions,
    }
    with _connect(pg_url, name) as connection:
        connection.execute("SET maintenance_work_mem = '1GB'")
        connection.execute("SET synchronous_commit = off")
        connection.execute(
            "INSERT INTO dispatch_agent (name, token_prefix, token_hash, is_active, created_at, "
            "webhook_url, webhook_secret) SELECT 'history-agent-' || n, 'tg_hist', "
            "md5('agent' || n) || md5('tnega' || n), true, now() - interval '60 days', '', '' "
            f"FROM generate_series(0, {HISTORY_AGENTS - 1}) AS n"
        )
        ids = connection.execute(
            "SELECT id FROM dispatch_agent WHERE name LIKE 'history-agent-%%' "
            "ORDER BY substr(name, 15)::int"
        ).fetchall()
        shape["agent_ids"] = "ARRAY[" + ", ".join(str(row[0]) for row in ids) + "]::bigint[]"
        # The audit records' indexes and constraints but its primary key, to be made again once
        # the rows are in (faster than keeping them up to date row by row).
        constraints = connection.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'dispatch_auditrecord'::regclass AND contype <> 'p'"
        ).fetchall()
        indexes = connection.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'dispatch_auditrecord' "
            "AND indexname NOT IN (SELECT conname FROM pg_constraint "
            "WHERE conrelid = 'dispatch_auditrecord'::regclass)"
        ).fetchall()
        for constraint, _ in constraints:
            connection.execute(f'ALTER TABLE dispatch_auditrecord DROP CONSTRAINT "{constraint}"')
        for index, _ in indexes:
            connection.execute(f'DROP INDEX "{index}"')

        _say(f"filling {sessions:,} sessions")
        _in_chunks(connection, "sessions", _SESSION_FILL.format(**shape), sessions)
        _say(f"filling {audit_records:,} audit records")
        _in_chunks(connection, "audit records", _AUDIT_FILL.format(**shape), audit_records)
        _say(f"filling {keys:,} idempotency records")
        first_place = max(1, audit_records - 2 * keys + 1)
        key_statement = _KEY_FILL.format(**shape).replace(
            "generate_series(%(first)s::bigint, %(last)s::bigint)",
            f"generate_series({first_place - 1} + %(first)s::bigint, "
            f"{first_place - 1} + %(last)s::bigint)",
        )
        _in_chunks(connection, "idempotency records (2 calls each)", key_statement, 2 * keys)

        for index, definition in indexes:
            _say(f"making index {index}")
            connection.execute(definition)
        for constraint, definition in constraints:
            _say(f"making constraint {constraint}")
            connection.execute(
                f'ALTER TABLE dispatch_auditrecord ADD CONSTRAINT "{constraint}" {definition}'
            )
        for table in ("dispatch_auditrecord", "dispatch_session", "dispatch_idempotencyrecord"):
            _say(f"vacuum and analyse {table}")
            connection.execute(f"VACUUM (ANALYZE) {table}")


def build_template(
    pg_url: str, name: str, audit_records: int, keys: int, rebuild: bool
) -> dict[str, Any]:
    """The template `name`, built unless one of the same size exists; returns what it holds."""
    wanted = {"audit_records": audit_records, "keys": keys}
    info = _template_info(pg_url, name)
    if info is not None and not rebuild and all(info.get(k) == v for k, v in wanted.items()):
        _say(f"template {name} reused ({audit_records:,} audit records, {keys:,} keys)")
        return info
    _say(f"building template {name} ({audit_records:,} audit records, {keys:,} keys)")
    started = time.monotonic()
    with _connect(pg_url, "postgres") as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    token = prepare(f"{pg_url}/{name}")
    if audit_records:
        _fill(pg_url, name, audit_records, keys)
    with _connect(pg_url, "postgres") as connection:
        size = connection.execute("SELECT pg_database_size(%s)", [name]).fetchone()
        info = {
            **wanted,
            "token": token,
            "bytes": int(size[0]) if size else 0,
            "build_s": round(time.monotonic() - started, 1),
        }
        # Where the next run finds its token and its size; a comment stays with the template.
        connection.execute(f"COMMENT ON DATABASE \"{name}\" IS '{json.dumps(info)}'")
    _say(f"template {name} built in {info['build_s']} s, {info['bytes'] / 2**30:.1f} GiB")
    return info


def copy_template(pg_url: str, template: str, name: str) -> None:
    _say(f"copying {template} to {name}")
    with _connect(pg_url, "postgres") as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        # FILE_COPY: the files as they are, rather than every page through the WAL.
        connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
    migrate(f"{pg_url}/{name}")


def _p50_ms(phase: dict[str, Any]) -> float:
    return float(summarise("api", [phase])["p50_ms"])


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def measure(options: argparse.Namespace) -> dict[str, Any]:
    pg_url = options.pg_url.rstrip("/")
    audit_records, keys = options.history
    prefix = options.prefix
    suffix = "" if (audit_records, keys) == (10_000_000, 1_000_000) else f"_{audit_records}"
    templates = {"empty": f"{prefix}_empty_tpl", "big": f"{prefix}_big_tpl{suffix}"}
    infos = {
        "empty": build_template(pg_url, templates["empty"], 0, 0, options.rebuild),
        "big": build_template(pg_url, templates["big"], audit_records, keys, options.rebuild),
    }
    databases = {which: f"{prefix}_{which}" for which in templates}
    for which in templates:
        copy_template(pg_url, templates[which], databases[which])

    servers: dict[str, Server] = {}
    logs = []
    try:
        for which, database in databases.items():
            log = Path(tempfile.gettempdir()) / f"bench-history-{which}-{os.getpid()}.log"
            logs.append(log)
            servers[which] = start_gunicorn(
                f"{pg_url}/{database}",
                workers=options.workers,
                worker_class="gthread",
                threads=options.threads,
                log=log,
            )
        for which, server in servers.items():
            wait_ready(server, infos[which]["token"])
        rounds = _rounds(options, servers, infos, pg_url, databases)
    finally:
        for server in servers.values():
            server.stop()
    for log in logs:
        if log.exists() and not log.read_text().strip():
            log.unlink()
    if not options.keep_database:
        for database in databases.values():
            drop_database(pg_url, database)
    return _result(options, infos, rounds)


def _rounds(
    options: argparse.Namespace,
    servers: dict[str, Server],
    infos: dict[str, dict[str, Any]],
    pg_url: str,
    databases: dict[str, str],
) -> list[dict[str, dict[str, Any]]]:
    loaded = Plan(
        concurrency=options.concurrency,
        client_processes=1,
        warmup=options.warmup,
        duration=options.duration,
        cap=100_000,
        seed=options.seed,
    )
    one = Plan(
        concurrency=1,
        client_processes=1,
        warmup=0.5,
        duration=options.latency,
        cap=100_000,
        seed=options.seed,
    )
    next_session = dict.fromkeys(servers, 0)
    if options.prewarm > 0:
        # A database in service is warm: its indexes' hot pages cached. A copy just made is not,
        # and the big one takes longer to warm; unmeasured load on each first.
        warm = Plan(
            concurrency=options.concurrency,
            client_processes=1,
            warmup=0.0,
            duration=options.prewarm,
            cap=1_000_000,
            seed=options.seed,
        )
        for which, server in servers.items():
            _say(f"warming {which} for {options.prewarm:.0f} s")
            pg = (pg_url, databases[which])
            warmed = run_phase(server, infos[which]["token"], "api", f"warm-{which}", warm, pg, 0)
            next_session[which] = warmed["next_session"]
    rounds = []
    for number in range(options.rounds):
        order = ["empty", "big"] if number % 2 == 0 else ["big", "empty"]
        figures: dict[str, dict[str, Any]] = {}
        for which in order:
            pg = (pg_url, databases[which])
            token = infos[which]["token"]
            tag = f"{which}-{number}"
            throughput = run_phase(
                servers[which], token, "api", f"loaded-{tag}", loaded, pg, next_session[which]
            )
            next_session[which] = throughput["next_session"]
            latency = run_phase(
                servers[which], token, "api", f"one-{tag}", one, pg, next_session[which]
            )
            next_session[which] = latency["next_session"]
            figures[which] = {
                "calls_per_s": len(throughput["latencies_us"]) / throughput["seconds"],
                # PostgreSQL's CPU per call, which other work on the machine moves less.
                "database_us": throughput["cpu"]["database_s"]
                * 1e6
                / max(1, len(throughput["latencies_us"])),
                "p50_ms": _p50_ms(latency),
                "p50_loaded_ms": _p50_ms(throughput),
                "errors": throughput["errors"] + latency["errors"],
                "unexpected": summarise("api", [throughput, latency])["unexpected_outcomes"],
            }
        _say(
            f"round {number + 1}: empty {figures['empty']['calls_per_s']:.0f}/s "
            f"p50 {figures['empty']['p50_ms']:.2f} ms; big {figures['big']['calls_per_s']:.0f}/s "
            f"p50 {figures['big']['p50_ms']:.2f} ms"
        )
        rounds.append(figures)
    return rounds


def _result(
    options: argparse.Namespace,
    infos: dict[str, dict[str, Any]],
    rounds: list[dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    throughput_ratio = [r["empty"]["calls_per_s"] / r["big"]["calls_per_s"] for r in rounds]
    p50_ratio = [r["big"]["p50_ms"] / r["empty"]["p50_ms"] for r in rounds]
    return {
        "history": {
            "audit_records": infos["big"]["audit_records"],
            "keys": infos["big"]["keys"],
            "bytes": infos["big"]["bytes"],
            "build_s": infos["big"]["build_s"],
        },
        "empty_bytes": infos["empty"]["bytes"],
        "rounds": rounds,
        "empty_calls_per_s": _spread([r["empty"]["calls_per_s"] for r in rounds]),
        "big_calls_per_s": _spread([r["big"]["calls_per_s"] for r in rounds]),
        "empty_p50_ms": _spread([r["empty"]["p50_ms"] for r in rounds]),
        "big_p50_ms": _spread([r["big"]["p50_ms"] for r in rounds]),
        "empty_database_us": _spread([r["empty"]["database_us"] for r in rounds]),
        "big_database_us": _spread([r["big"]["database_us"] for r in rounds]),
        "database_cpu_ratio": _spread(
            [r["big"]["database_us"] / r["empty"]["database_us"] for r in rounds]
        ),
        "throughput_ratio": _spread(throughput_ratio),
        "p50_ratio": _spread(p50_ratio),
        "errors": sum(r[w]["errors"] for r in rounds for w in r),
        "unexpected_outcomes": sum(r[w]["unexpected"] for r in rounds for w in r),
        "target": TARGET_RATIO,
        "met": statistics.median(throughput_ratio) <= TARGET_RATIO
        and statistics.median(p50_ratio) <= TARGET_RATIO,
        "load_average": os.getloadavg(),
        "concurrency": options.concurrency,
    }


def render(result: dict[str, Any]) -> str:
    history = result["history"]

    def line(label: str, figures: dict[str, float], unit: str) -> str:
        return (
            f"  {label:<34} {figures['median']:8.2f}{unit} "
            f"({figures['low']:.2f}-{figures['high']:.2f})"
        )

    lines = [
        f"History: {history['audit_records']:,} audit records, {history['keys']:,} idempotency "
        f"records, {history['bytes'] / 2**30:.1f} GiB (empty: "
        f"{result['empty_bytes'] / 2**20:.0f} MiB); built in {history['build_s']:.0f} s",
        f"{len(result['rounds'])} interleaved rounds, median (range):",
        line(
            f"empty, calls/s at {result['concurrency']} connections",
            result["empty_calls_per_s"],
            "",
        ),
        line(f"big, calls/s at {result['concurrency']} connections", result["big_calls_per_s"], ""),
        line("empty, p50 at 1 connection", result["empty_p50_ms"], " ms"),
        line("big, p50 at 1 connection", result["big_p50_ms"], " ms"),
        line("throughput, empty / big", result["throughput_ratio"], "x"),
        line("p50, big / empty", result["p50_ratio"], "x"),
        line("PostgreSQL CPU per call, empty", result["empty_database_us"], " us"),
        line("PostgreSQL CPU per call, big", result["big_database_us"], " us"),
        line("PostgreSQL CPU per call, big / empty", result["database_cpu_ratio"], "x"),
        f"Target: big at most {result['target']}x empty in both: "
        + ("met" if result["met"] else "NOT met"),
        f"Errors: {result['errors']}; unexpected codes: {result['unexpected_outcomes']}; "
        f"load average at the end: {', '.join(f'{v:.1f}' for v in result['load_average'])}",
    ]
    return "\n".join(lines)


def _history(text: str) -> tuple[int, int]:
    audit, _, keys = text.partition(",")
    return int(audit.replace("_", "")), int((keys or "0").replace("_", ""))


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.history", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--history",
        type=_history,
        default=(10_000_000, 1_000_000),
        help="audit records,idempotency records in the big database (default 10000000,1000000)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per loaded phase")
    parser.add_argument("--latency", type=float, default=4.0, help="seconds at 1 connection")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds a phase")
    parser.add_argument(
        "--prewarm", type=float, default=20.0, help="unmeasured seconds of load on each first"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument(
        "--prefix",
        default="toolgate_bench_history",
        help="the databases' names: PREFIX_empty_tpl, PREFIX_big_tpl, PREFIX_empty, PREFIX_big",
    )
    parser.add_argument("--rebuild", action="store_true", help="build the templates again")
    parser.add_argument("--build-only", action="store_true", help="build the templates, no run")
    parser.add_argument("--keep-database", action="store_true", help="keep the run's copies")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    options = _options(argv)
    if options.build_only:
        pg_url = options.pg_url.rstrip("/")
        audit_records, keys = options.history
        suffix = "" if (audit_records, keys) == (10_000_000, 1_000_000) else f"_{audit_records}"
        build_template(pg_url, f"{options.prefix}_empty_tpl", 0, 0, options.rebuild)
        build_template(
            pg_url, f"{options.prefix}_big_tpl{suffix}", audit_records, keys, options.rebuild
        )
        return
    result = measure(options)
    print(json.dumps(result, indent=2) if options.json else render(result))


if __name__ == "__main__":
    main(sys.argv[1:])
