"""The measured phases of benchmark (b): load processes started together, CPU sampled around them.

A round measures bare then api at the fixed concurrency, then bare then api at 1 connection,
then a paired phase at 1 connection; rounds alternate the targets' order so that drift in the
machine's speed hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.api.cpu import CpuSample, database_backends
from bench.api.load import PAIRED, TARGETS, sleep_until
from bench.api.report import merge_by_kind
from bench.api.server import ROOT, Server


@dataclass(frozen=True)
class Plan:
    concurrency: int
    client_processes: int
    warmup: float
    duration: float
    cap: int
    seed: int


def _start_clients(
    server: Server, token: str, target: str, tag: str, plan: Plan, first_session: int
) -> list[subprocess.Popen[str]]:
    processes = max(1, min(plan.client_processes, plan.concurrency))
    per_process = [
        plan.concurrency // processes + (n < plan.concurrency % processes) for n in range(processes)
    ]
    clients = []
    first = first_session
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
    return clients


def _start_together(clients: Sequence[subprocess.Popen[str]]) -> int:
    """Wait until every load process is ready, then give them one start time; returns it."""
    for client in clients:
        assert client.stdout is not None
        ready, _, _ = select.select([client.stdout], [], [], 60)
        if not ready or client.stdout.readline().strip() != "ready":
            raise SystemExit("bench.api: a load process did not start")
    start_ns = time.monotonic_ns() + 50_000_000
    for client in clients:
        assert client.stdin is not None
        client.stdin.write(f"go {start_ns}\n")
        client.stdin.flush()
    return start_ns


def _reports(clients: Sequence[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    reports = []
    for client in clients:
        out, _ = client.communicate(timeout=120)
        if client.returncode != 0:
            raise SystemExit(f"bench.api: a load process failed ({client.returncode})")
        reports.append(json.loads(out))
    return reports


def _measured(
    name: str, reports: Sequence[dict[str, Any]], begin_ns: int, cpu: dict[str, float]
) -> dict[str, Any]:
    """What every load process measured of target `name`, in one."""
    parts = [report["by_target"][name] for report in reports]
    outcomes: Counter[tuple[str, str]] = Counter()
    for part in parts:
        for kind, outcome, count in part["outcomes"]:
            outcomes[kind, outcome] += count
    last = max(part["last_end_ns"] for part in parts)
    return {
        "latencies_us": [value for part in parts for value in part["latencies_us"]],
        "by_kind_us": merge_by_kind(part["by_kind_us"] for part in parts),
        "seconds": max(last - begin_ns, 1) / 1e9,
        "sent": sum(part["sent"] for part in parts),
        "errors": sum(part["errors"] for part in parts),
        "first_error": next((p["first_error"] for p in parts if p["first_error"]), ""),
        "outcomes": outcomes,
        # A paired phase's CPU is both targets' together.
        "cpu": cpu,
        "next_session": max(report["by_target"][name]["next_session"] for report in reports),
    }


def run_phase(
    server: Server,
    token: str,
    target: str,
    tag: str,
    plan: Plan,
    pg: tuple[str, str],
    first_session: int = 0,
) -> dict[str, Any]:
    """One phase's figures; its sessions are numbered from `first_session` (see bench.api.mix)."""
    clients = _start_clients(server, token, target, tag, plan, first_session)
    start_ns = _start_together(clients)
    begin_ns = start_ns + int(plan.warmup * 1e9)
    end_ns = begin_ns + int(plan.duration * 1e9)
    sleep_until(begin_ns)
    backends = database_backends(*pg)
    before = CpuSample.take(server, backends)
    sleep_until(end_ns)
    after = CpuSample.take(server, backends)
    reports = _reports(clients)
    cpu = {
        "window_s": (end_ns - begin_ns) / 1e9,
        "server_s": after.server - before.server,
        "database_s": after.database - before.database,
        "client_s": sum(report["cpu_seconds"] for report in reports),
        "machine_busy_s": after.machine_busy - before.machine_busy,
        "machine_all_s": after.machine_all - before.machine_all,
    }
    if target == PAIRED:
        return {name: _measured(name, reports, begin_ns, cpu) for name in TARGETS}
    return _measured(target, reports, begin_ns, cpu)


def _schedule(options: argparse.Namespace, number: int) -> list[tuple[str, str, Plan]]:
    """Round `number`'s phases: (name, target, plan)."""
    # Throughput at the fixed concurrency, and latency at one connection (no queueing).
    loaded = Plan(
        concurrency=options.concurrency,
        client_processes=options.client_processes,
        warmup=options.warmup if number == 0 else min(options.warmup, 1.0),
        duration=options.duration,
        cap=options.max_requests,
        seed=options.seed,
    )
    one = replace(loaded, concurrency=1, client_processes=1, warmup=0.5, duration=options.latency)
    schedule = [("bare", "bare", loaded), ("api", "api", loaded)]
    if options.latency > 0:
        schedule += [("bare_1", "bare", one), ("api_1", "api", one)]
    if options.paired > 0:
        schedule.append(("paired", PAIRED, replace(one, duration=options.paired)))
    return schedule


def run_rounds(
    server: Server, token: str, options: argparse.Namespace, pg: tuple[str, str]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Every round's phases, by phase name, and the requests sent to each target."""
    phases: dict[str, list[dict[str, Any]]] = {
        "bare": [],
        "api": [],
        "bare_1": [],
        "api_1": [],
        "bare_paired": [],
        "api_paired": [],
    }
    sent = {"bare": 0, "api": 0}
    # Every phase numbers its sessions after the last one's: no two sessions of a run share an
    # amount of a refund of the same customer (see bench.api.mix).
    next_session = 0
    for number in range(options.rounds):
        for name, target, plan in _schedule(options, number):
            phase = run_phase(server, token, target, f"{name}-{number}", plan, pg, next_session)
            for each, measured in phase.items() if target == PAIRED else [(target, phase)]:
                sent[each] += measured["sent"]
                phases[f"{each}_paired" if target == PAIRED else name].append(measured)
                next_session = max(next_session, measured["next_session"])
    return phases, sent
