"""What the driver and the server cost a statement here: the unit behind the API's figures.

Measures, on one psycopg connection as the API makes them (server-side binding, prepared
statements), each against the same baseline, one statement in its own round trip:

- a statement more sent in the same pipeline (as the call's opening sends its followers);
- the same statement sent as a pipeline of one (the pipeline's own cost);
- a transaction around it: the driver's BEGIN and the COMMIT, each a round trip of its own.

For each, the CPU of this process (the web worker's side), of the server's backend (read from
/proc: the server must run on this machine) and the wall time, per operation, as the median of
interleaved rounds.

    .venv/bin/python -m bench.roundtrip
    .venv/bin/python -m bench.roundtrip --pg-url postgres://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

Operation = Callable[[psycopg.Connection[Any], int], None]


def _one(connection: psycopg.Connection[Any], n: int) -> None:
    connection.execute("SELECT %s::int", [n]).fetchall()


def _pipeline_of_one(connection: psycopg.Connection[Any], n: int) -> None:
    with connection.pipeline():
        sent = connection.execute("SELECT %s::int", [n])
    sent.fetchall()


def _pipeline_of_two(connection: psycopg.Connection[Any], n: int) -> None:
    with connection.pipeline():
        first = connection.execute("SELECT %s::int", [n])
        second = connection.execute("SELECT %s::int", [n + 1])
    first.fetchall()
    second.fetchall()


def _in_a_transaction(connection: psycopg.Connection[Any], n: int) -> None:
    connection.autocommit = False
    connection.execute("SELECT %s::int", [n]).fetchall()
    connection.commit()
    connection.autocommit = True


OPERATIONS: dict[str, Operation] = {
    "one statement, one round trip (baseline)": _one,
    "a pipeline of one": _pipeline_of_one,
    "a pipeline of two": _pipeline_of_two,
    "BEGIN, the statement, COMMIT": _in_a_transaction,
}


def _backend_cpu(pid: int) -> float:
    """The server backend's CPU seconds so far (user + system), from /proc; NaN if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    connection: psycopg.Connection[Any], pid: int, operation: Operation, times: int
) -> dict[str, float]:
    for n in range(50):
        operation(connection, n)
    cpu, backend, wall = time.process_time(), _backend_cpu(pid), time.perf_counter()
    for n in range(times):
        operation(connection, n)
    return {
        "client_cpu_us": (time.process_time() - cpu) / times * 1e6,
        "server_cpu_us": (_backend_cpu(pid) - backend) / times * 1e6,
        "wall_us": (time.perf_counter() - wall) / times * 1e6,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.roundtrip", description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--times", type=int, default=2000, help="operations per round and kind")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="print nothing, return the results")
    options = parser.parse_args(argv)

    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in OPERATIONS}
    with psycopg.connect(options.pg_url, autocommit=True) as connection:
        pid = connection.info.backend_pid
        for number in range(options.rounds):
            if not options.quiet and not options.json:
                print(f"  round {number + 1} of {options.rounds}", flush=True)
            for name, operation in OPERATIONS.items():
                rounds[name].append(_measure(connection, pid, operation, options.times))

    figures = {name: _median(measured) for name, measured in rounds.items()}
    result = {"benchmark": "roundtrip", "rounds": options.rounds, "figures": figures}
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        _print(figures)
    return result


def _median(measured: list[dict[str, float]]) -> dict[str, Any]:
    walls = [figure["wall_us"] for figure in measured]
    median = {key: statistics.median(figure[key] for figure in measured) for key in measured[0]}
    return median | {"wall_us_range": [min(walls), max(walls)]}


def _print(figures: dict[str, dict[str, Any]]) -> None:
    base = next(iter(figures.values()))
    print("  per operation, median of rounds       client CPU   server CPU    wall (range)")
    for name, figure in figures.items():
        low, high = figure["wall_us_range"]
        print(
            f"  {name:38s} {figure['client_cpu_us']:7.0f} us {figure['server_cpu_us']:8.0f} us"
            f" {figure['wall_us']:7.0f} us ({low:.0f}-{high:.0f})"
        )
    print("  over the baseline:")
    for name, figure in list(figures.items())[1:]:
        print(
            f"  {name:38s} {figure['client_cpu_us'] - base['client_cpu_us']:+7.0f} us"
            f" {figure['server_cpu_us'] - base['server_cpu_us']:+8.0f} us"
            f" {figure['wall_us'] - base['wall_us']:+7.0f} us"
        )


if __name__ == "__main__":
    main()
