"""Two checkouts of Toolgate against each other: a call's time through the store, interleaved.

Benchmark (b) judges the API against a bare endpoint within one run. To tell whether a change to
the store made a call faster, two trees must be measured on the same machine at the same moments:
on this machine the speed drifts by more than the change between runs a minute apart. This runs
each tree's own code in a process of its own (this file's worker, started in the tree), each on a
database of its own (created, migrated and seeded as benchmark (b) seeds its own:
bench/api/server.py), and hands them turns of a few dozen calls, the first alternating:
`call_dispatch` in-process on PostgreSQL, each turn a `get_order` then an executed refund of one
of 64 customers, every customer's calls in sessions of their own. No HTTP, no gunicorn: what is
measured is the pipeline and the store, round trips included, as each tree has them.

The figures are each tree's p50 (with the quartiles) of each kind, and the second tree's p50 over
the first's, turn by turn: their median and range.

Run: `.venv/bin/python -m bench.trees BASE_TREE OTHER_TREE [--rounds 30] [--calls 25]`, where a
tree is a checkout with its `.venv` (`git worktree add ../base <commit>`, then link or make its
`.venv`). Needs PostgreSQL at `--pg-url` as a superuser.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KINDS = ("read", "refund")


def worker() -> None:
    """`python -m bench.trees _worker`: the tree's own pipeline, a turn per line of stdin."""
    import django

    django.setup()
    from dispatch.models import Agent
    from dispatch.services import call_dispatch

    agent = Agent.objects.select_related("current_policy").get(name="bench-agent")
    numbers = itertools.count(1)
    print("ready", flush=True)
    for line in sys.stdin:
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(int(line)):
            number = next(numbers)
            customer = number % 64
            # A session of a customer's 31 turns at most: within the seeded step budget of 50.
            session = f"s{customer}-{number // 2000}"
            order = f"ORD-{100_000 + customer * 8 + (number // 64) % 8}"
            refund = {"order_id": order, "amount_cents": 100 + number, "currency": "BRL"}
            for kind, tool, arguments in (
                ("read", "get_order", {"order_id": order}),
                ("refund", "refund_order", {**refund, "reason": "damaged"}),
            ):
                started = time.perf_counter()
                result = call_dispatch(
                    agent=agent,
                    session_id=session,
                    customer_id=f"CUS-{customer + 1}",
                    tool=tool,
                    arguments=json.dumps(arguments),
                )
                times[kind].append(time.perf_counter() - started)
                if not result.ok:
                    raise SystemExit(f"{tool}: {result.code} {result.message}")
        print(json.dumps(times), flush=True)


def _start(tree: Path, database: str, pg_url: str) -> subprocess.Popen[str]:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{database}"')
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_DATABASE_URL": f"{pg_url}/{database}",
        "DATABASE_SERVER_SIDE_BINDING": "1",
        "PYTHONPATH": str(tree),
        "PYTHONWARNINGS": "ignore",
    }
    python = str(tree / ".venv" / "bin" / "python")
    migrate = [python, "-m", "django", "migrate", "--no-input", "-v", "0"]
    subprocess.run(migrate, cwd=tree, env=env, check=True)
    seed = [python, "-m", "bench.api", "_seed"]
    subprocess.run(seed, cwd=tree, env=env, check=True, capture_output=True)
    process = subprocess.Popen(
        # This file's worker, on the tree's code (PYTHONPATH): a tree older than it works too.
        [python, str(Path(__file__).resolve()), "_worker"],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit(f"{tree}: the worker did not start")
    return process


def _turn(process: subprocess.Popen[str], calls: int) -> dict[str, list[float]]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"{calls}\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    if not answer:
        raise SystemExit("a worker stopped")
    return dict(json.loads(answer))


def _p50(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.trees", description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two checkouts, each with its .venv")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=25, help="turns of each kind per round")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    trees = [tree.resolve() for tree in options.trees]
    processes = [_start(tree, f"bench_tree_{n}", options.pg_url) for n, tree in enumerate(trees)]
    pooled: list[dict[str, list[float]]] = [{kind: [] for kind in KINDS} for _ in trees]
    ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for number in range(options.rounds + 2):
            order = [0, 1] if number % 2 == 0 else [1, 0]
            turns: dict[int, dict[str, list[float]]] = {}
            for index in order:
                turns[index] = _turn(processes[index], options.calls)
            if number < 2:
                continue  # warm-up: caches, prepared statements, the first sessions
            for index, times in turns.items():
                for kind in KINDS:
                    pooled[index][kind].extend(times[kind])
            for kind in KINDS:
                ratios[kind].append(_p50(turns[1][kind]) / _p50(turns[0][kind]))
    finally:
        for process in processes:
            if process.stdin is not None:
                process.stdin.close()
            process.wait()
    figures = {
        "trees": [str(tree) for tree in trees],
        "rounds": options.rounds,
        "calls": options.calls,
        "p50_ms": {
            str(tree): {kind: _p50(pooled[n][kind]) for kind in KINDS}
            for n, tree in enumerate(trees)
        },
        "ratio": {
            kind: {
                "median": statistics.median(ratios[kind]),
                "min": min(ratios[kind]),
                "max": max(ratios[kind]),
            }
            for kind in KINDS
        },
    }
    if options.json:
        print(json.dumps(figures, indent=2))
        return figures
    for n, tree in enumerate(trees):
        for kind in KINDS:
            values = sorted(pooled[n][kind])
            quarter = len(values) // 4
            print(
                f"{tree}  {kind:6}  p50 {_p50(values):.3f} ms "
                f"({values[quarter] * 1000:.3f}-{values[-quarter - 1] * 1000:.3f})"
            )
    for kind in KINDS:
        ratio = figures["ratio"][kind]
        print(
            f"{kind}: second over first, turn by turn: {ratio['median']:.2f} "
            f"({ratio['min']:.2f}-{ratio['max']:.2f})"
        )
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        worker()
    else:
        main()
