"""Benchmark (d): the policy what-if at 200,000 audit records, and the agents beside four of them.

A database of its own (`toolgate_bench_what_if` by default, dropped and created by each run,
migrated with `bench.settings`, production's) holds 30 days of synthetic audit records by COPY:
200,000 by default, of which 116,000 refunds of three agents (the one asked about sends half) for
2,000 customers in two currencies, seven in ten executed without a human, nearly a quarter held
(each with its confirmation: executed, rejected, expired, invalidated, failed, unknown or still
pending, with the decision's and the execution's times), one in twenty refused, and a few
repeating an earlier refund from another conversation. gunicorn serves it as docs/deploy.md
does: the agents on 3 sync workers, the managers on 2 of their own at nice 10, with
TOOLGATE_MANAGER_SLOTS (1 by default).

One load process sends an agent's `get_order` 50 times a second on schedule (`--rate`; 0 sends
each as soon as the last is answered, which keeps about a core busy on its own and so measures
the machine's saturation more than the agents' wait) on one keep-alive connection for the whole
run (new sessions as it goes, within the step budget and the repeat limit), and stamps every
answer. Meanwhile rounds of phases, each round beginning with the next one in turn:

- alone: nothing else; the agents' p50 and p99 in it are the baseline;
- apart: four managers each ask `GET /api/v1/metrics/what-if` for the 30 days with a draft, on
  their own processes, again as soon as answered (after Retry-After when the slots are taken);
- shared (`--no-shared` leaves it out): the same on the agents' workers, to see what the managers'
  own processes are for;

then one manager asks the what-if a few times in a row, the agents paused: its time.

Targets: the what-if within 2 s, and the agents' p99 while four what-ifs run at most 2x their p99
alone. Each is judged on the median of the rounds' figures (the machine's speed drifts; rounds
interleave), with the range of the rounds beside it.

Run: `.venv/bin/python -m bench.what_if [--records 200000] [--rounds 6] [--seconds 8]
[--slots 1] [--json]`. Needs PostgreSQL at 127.0.0.1:5432 (`--pg-url`) and Redis, where the
throttle counts (`BENCH_CACHE_URL`, by default redis://127.0.0.1:6379/1).
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
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench.analytics import audit_copy
from bench.api.cpu import database_backends, machine_cpu, process_cpu
from bench.api.load import Connection
from bench.api.server import (
    ROOT,
    Server,
    create_database,
    drop_database,
    migrate,
    start_gunicorn,
    wait_ready,
)

TARGET_WHAT_IF_S = 2.0
TARGET_P99_RATIO = 2.0
MANAGERS = 4
DAYS = 30
REFUND_SHARE = 0.58
CUSTOMERS = 2_000
# The agent host's orders (get_order) and customers, apart from the history's.
HOST_CUSTOMERS, HOST_ORDERS = 8, 12
# What the draft changes: auto-approve below 100.00 instead of 50.00.
DRAFT = {"auto_approve_below_cents": "10000"}
# (status, share) of the held refunds' confirmations.
FATES = [
    ("executed", 60),
    ("rejected", 15),
    ("expired", 10),
    ("invalidated", 5),
    ("failed", 3),
    ("unknown", 2),
    ("pending", 5),
]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    options = _options(argv)
    pg_url = options.pg_url.rstrip("/")
    database_url = f"{pg_url}/{options.database}"
    load_before = os.getloadavg()
    server_version = create_database(pg_url, options.database)
    servers: list[Server] = []
    try:
        seeded = _prepare(database_url, options.records)
        log = Path(tempfile.gettempdir()) / f"bench-what-if-gunicorn-{os.getpid()}.log"
        env = {"TOOLGATE_MANAGER_SLOTS": str(options.slots)}
        for workers, nice in ((options.workers, 0), (2, 10)):
            # The agents' web processes, then the managers' own at a lower CPU priority.
            servers.append(
                start_gunicorn(
                    database_url,
                    workers=workers,
                    worker_class="sync",
                    threads=1,
                    log=log,
                    env=env,
                    stderr_to_log=True,
                    nice=nice,
                )
            )
        for each in servers:
            wait_ready(each, seeded["agent_token"])
        rounds = _run(servers, seeded, options)
    finally:
        for each in servers:
            each.stop()
        if not options.keep_database:
            drop_database(pg_url, options.database)
    result = _result(options, seeded, rounds, server_version, load_before)
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        _print(result)
    return result


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.what_if", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="audit records in 30 days")
    parser.add_argument("--rounds", type=int, default=6, help="each phase first in two of six")
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase")
    parser.add_argument("--what-ifs", type=int, default=3, help="what-ifs timed alone per round")
    parser.add_argument(
        "--rate", type=float, default=50.0, help="the agent's calls a second (0: back to back)"
    )
    parser.add_argument("--slots", type=int, default=1, help="TOOLGATE_MANAGER_SLOTS")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn's sync workers")
    parser.add_argument(
        "--no-shared",
        dest="shared",
        action="store_false",
        help="leave out the phase with the managers on the agents' workers",
    )
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench_what_if")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


# --- the rounds ------------------------------------------------------------------------------


def _run(
    servers: Sequence[Server], seeded: dict[str, Any], options: argparse.Namespace
) -> dict[str, Any]:
    agents_server, managers_server = servers
    agents = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.what_if",
            "_agents",
            str(agents_server.port),
            seeded["agent_token"],
            str(options.rate),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agents.stdout is not None and agents.stdin is not None
    if agents.stdout.readline().strip() != "ready":
        raise SystemExit("bench.what_if: the agents' load did not start")
    path = "/api/v1/metrics/what-if?" + urlencode({**seeded["range"], **DRAFT})

    def head(server: Server) -> bytes:
        return (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Token {seeded['manager_token']}\r\nAccept: application/json\r\n\r\n"
        ).encode()

    # Where four managers ask in each loaded phase: their own processes, the agents' workers.
    targets = {"apart": managers_server, "shared": agents_server}
    phases = ["alone", "apart", *(["shared"] if options.shared else [])]
    windows: dict[str, list[tuple[int, int]]] = {phase: [] for phase in phases}
    others: dict[str, list[float]] = {phase: [] for phase in [*phases, "what_if"]}
    managers: dict[str, list[dict[str, Any]]] = {phase: [] for phase in phases[1:]}
    what_if: list[dict[str, Any]] = []
    time.sleep(2.0)  # the agents' load warms up
    try:
        for number in range(options.rounds):
            # Each phase first in turn: the machine's drift hits them alike.
            for phase in phases[number % len(phases) :] + phases[: number % len(phases)]:
                backends = database_backends(options.pg_url.rstrip("/"), options.database)
                begin, cpu = time.monotonic_ns(), _Cpu.take(servers, backends, agents.pid)
                if phase == "alone":
                    time.sleep(options.seconds)
                else:
                    server = targets[phase]
                    asked = _managers(server.port, head(server), MANAGERS, options.seconds)
                    managers[phase].append(asked)
                windows[phase].append((begin, time.monotonic_ns()))
                others[phase].append(cpu.others_until(servers, backends, agents.pid))
            # The what-if's own time, with nothing beside it.
            _command(agents, "pause")
            backends = database_backends(options.pg_url.rstrip("/"), options.database)
            cpu = _Cpu.take(servers, backends, agents.pid)
            timed = _managers(
                managers_server.port, head(managers_server), 1, None, options.what_ifs
            )
            what_if.append(timed)
            others["what_if"].append(cpu.others_until(servers, backends, agents.pid))
            _command(agents, "resume")
    finally:
        agents.stdin.write("stop\n")
        agents.stdin.flush()
        out, _ = agents.communicate(timeout=60)
    stamped = json.loads(out.strip().splitlines()[-1])
    return {
        "phases": phases,
        "windows": windows,
        "agents": stamped,
        "what_if": what_if,
        "managers": managers,
        "others": others,
    }


@dataclass
class _Cpu:
    """CPU seconds so far: this run's processes (gunicorn's workers, the bench database's
    backends, the load processes) and the whole machine's, whose difference is what other work
    on the machine took, which moves every figure here."""

    ours: float
    machine: float
    at: float

    @classmethod
    def take(cls, servers: Sequence[Server], backends: Sequence[int], agents: int) -> _Cpu:
        workers = [pid for server in servers for pid in server.workers()]
        mine = os.times()
        ours = process_cpu([*workers, *backends, agents]) + mine.user + mine.system
        return cls(ours, machine_cpu()[0], time.monotonic())

    def others_until(
        self, servers: Sequence[Server], backends: Sequence[int], agents: int
    ) -> float:
        """The cores other work took on average since this sample."""
        now = _Cpu.take(servers, backends, agents)
        window = max(now.at - self.at, 1e-9)
        return max(0.0, (now.machine - self.machine) - (now.ours - self.ours)) / window


def _command(agents: subprocess.Popen[str], command: str) -> None:
    assert agents.stdin is not None and agents.stdout is not None
    agents.stdin.write(command + "\n")
    agents.stdin.flush()
    if agents.stdout.readline().strip() != command:
        raise SystemExit(f"bench.what_if: the agents' load did not {command}")


def _managers(
    port: int, head: bytes, managers: int, seconds: float | None, count: int = 0
) -> dict[str, Any]:
    """`managers` threads asking the what-if again as soon as answered (after Retry-After when
    busy), for `seconds`, or `count` times each."""
    answers: list[tuple[str, float]] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds if seconds is not None else None

    def ask() -> None:
        connection = Connection(port)
        asked = 0
        try:
            while (end is None and asked < count) or (end is not None and time.monotonic() < end):
                asked += 1
                started = time.perf_counter()
                status, body = connection.exchange(head)
                took = time.perf_counter() - started
                outcome = _outcome(status, body)
                with lock:
                    answers.append((outcome, took))
                if outcome == "managers_busy":
                    time.sleep(2.0 if end is None else min(2.0, max(0.0, end - time.monotonic())))
        finally:
            connection.close()

    threads = [threading.Thread(target=ask) for _ in range(managers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcomes = Counter(outcome for outcome, _ in answers)
    answered = sorted(took for outcome, took in answers if outcome == "ok")
    return {
        "outcomes": dict(outcomes),
        "ok_s": answered,
        "median_s": statistics.median(answered) if answered else None,
    }


def _outcome(status: int, body: bytes) -> str:
    if status == 200:
        return "ok"
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


def agents_main(port: int, token: str, rate: float) -> None:
    """`python -m bench.what_if _agents PORT TOKEN RATE`: one agent host's get_order, RATE calls a
    second on schedule (0: each as soon as the last was answered), paused and resumed on command
    (a line on standard input: pause, resume or stop, each acknowledged), then every answer's
    start (monotonic ns) and latency (us) as JSON."""
    running, stop = threading.Event(), threading.Event()
    idle = threading.Event()
    samples: list[tuple[int, int]] = []
    unexpected: Counter[str] = Counter()
    head = (
        f"POST /api/v1/calls HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Token {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json\r\n"
    ).encode()

    interval = int(1e9 / rate) if rate > 0 else 0

    def load() -> None:
        connection = Connection(port)
        session = 0
        due = time.monotonic_ns()
        try:
            while not stop.is_set():
                if not running.is_set():
                    idle.set()
                    running.wait(0.1)
                    continue
                idle.clear()
                session += 1
                customer = session % HOST_CUSTOMERS
                # Each order once a session: within the step budget and the repeat limit.
                for order in range(HOST_ORDERS):
                    body = json.dumps(
                        {
                            "session_id": f"bench-host-{os.getpid()}-{session}",
                            "customer_id": f"CUS-H{customer}",
                            "tool": "get_order",
                            "arguments": {"order_id": f"ORD-9{customer:02d}{order:03d}"},
                        }
                    ).encode()
                    request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
                    # On schedule, never in a burst to catch up: what an agent host sends.
                    due = max(due + interval, time.monotonic_ns())
                    time.sleep(max(0, due - time.monotonic_ns()) / 1e9)
                    started = time.monotonic_ns()
                    status, answer = connection.exchange(request)
                    samples.append((started, (time.monotonic_ns() - started) // 1000))
                    if status != 200 or b'"code":"OK"' not in answer:
                        unexpected[f"HTTP {status} {answer[:80]!r}"] += 1
                    if stop.is_set() or not running.is_set():
                        break
        finally:
            connection.close()
            idle.set()

    running.set()
    thread = threading.Thread(target=load)
    thread.start()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "pause":
            running.clear()
            idle.wait(30)
        elif command == "resume":
            running.set()
        else:
            break
        print(command, flush=True)
    stop.set()
    running.set()
    thread.join()
    print(json.dumps({"samples": samples, "unexpected": dict(unexpected)}))


# --- the figures -----------------------------------------------------------------------------


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def _latencies_ms(samples: list[list[int]], window: tuple[int, int]) -> list[float]:
    begin, end = window
    return [latency / 1000 for started, latency in samples if begin <= started < end]


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _result(
    options: argparse.Namespace,
    seeded: dict[str, Any],
    rounds: dict[str, Any],
    server_version: str,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    samples = rounds["agents"]["samples"]
    phases = rounds["phases"]
    per_round = []
    for number in range(options.rounds):
        agents = {}
        for phase in phases:
            latencies = _latencies_ms(samples, rounds["windows"][phase][number])
            agents[phase] = {
                "calls": len(latencies),
                "p50_ms": _percentile(latencies, 0.5),
                "p99_ms": _percentile(latencies, 0.99),
            }
        alone = agents["alone"]["p99_ms"]
        per_round.append(
            {
                "agents": agents,
                "p99_ratio": {phase: agents[phase]["p99_ms"] / alone for phase in phases[1:]},
                "what_if_s": rounds["what_if"][number]["median_s"],
                "managers": {
                    phase: rounds["managers"][phase][number]["outcomes"] for phase in phases[1:]
                },
                # Cores other work on the machine took meanwhile.
                "other_cores": {
                    phase: rounds["others"][phase][number] for phase in [*phases, "what_if"]
                },
            }
        )
    what_if = _spread([r["what_if_s"] for r in per_round if r["what_if_s"] is not None])
    ratios = {phase: _spread([r["p99_ratio"][phase] for r in per_round]) for phase in phases[1:]}
    return {
        "benchmark": "what_if",
        "records": seeded["records"],
        "refunds": seeded["refunds"],
        "judged": seeded["judged"],
        "slots": options.slots,
        "workers": options.workers,
        "rounds": per_round,
        "what_if_s": what_if,
        "p99_ratio": ratios,
        "agents_p99_ms": {
            phase: _spread([r["agents"][phase]["p99_ms"] for r in per_round]) for phase in phases
        },
        "agents_unexpected": rounds["agents"]["unexpected"],
        "targets": {
            "what_if_s": TARGET_WHAT_IF_S,
            "p99_ratio": TARGET_P99_RATIO,
            "what_if_met": what_if["median"] <= TARGET_WHAT_IF_S,
            # Judged as docs/deploy.md deploys it: the managers on their own processes.
            "p99_ratio_met": ratios["apart"]["median"] <= TARGET_P99_RATIO,
        },
        "server": server_version,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _print(result: dict[str, Any]) -> None:
    phases = list(result["agents_p99_ms"])
    print(
        f"(d) the what-if at {result['records']:,} audit records ({result['refunds']:,} refunds, "
        f"{result['judged']:,} of the agent asked about); the agents on {result['workers']} sync "
        f"workers, the managers on 2 of their own at nice 10, {result['slots']} slot(s)"
    )
    print(
        "round  what-if  agents p50/p99 ms: "
        + "  ".join(f"{phase:>11}" for phase in phases)
        + "  p99 ratio: "
        + " ".join(f"{phase:>6}" for phase in phases[1:])
        + "  other cores"
    )
    for number, figures in enumerate(result["rounds"]):
        agents = figures["agents"]
        what_if = figures["what_if_s"]
        print(
            f"{number:>5} {'-' if what_if is None else f'{what_if:.2f} s':>8}                    "
            + "  ".join(
                f"{agents[phase]['p50_ms']:>5.1f}/{agents[phase]['p99_ms']:<5.1f}"
                for phase in phases
            )
            + "             "
            + " ".join(f"{figures['p99_ratio'][phase]:>5.2f}x" for phase in phases[1:])
            + "  "
            + "/".join(f"{figures['other_cores'][phase]:.2f}" for phase in [*phases, "what_if"])
        )
    targets = result["targets"]
    what_if = result["what_if_s"]
    print(
        f"  what-if: {what_if['median']:.2f} s ({what_if['min']:.2f}-{what_if['max']:.2f}): "
        f"{'met' if targets['what_if_met'] else 'NOT met'} (within {TARGET_WHAT_IF_S:.0f} s)"
    )
    for phase, ratio in result["p99_ratio"].items():
        where = "their own processes" if phase == "apart" else "the agents' workers"
        met = "met" if targets["p99_ratio_met"] else "NOT met"
        judged = (
            f": {met} (at most {TARGET_P99_RATIO:.0f}x)" if phase == "apart" else " (beside it)"
        )
        print(
            f"  agents' p99 beside four what-ifs on {where}: {ratio['median']:.2f}x "
            f"({ratio['min']:.2f}-{ratio['max']:.2f}) of alone{judged}"
        )
    print(
        "  other cores: what other work on the machine took, by phase ("
        + ", ".join([*phases, "what-if"])
        + ")"
    )
    print(f"  four managers' answers: {[r['managers'] for r in result['rounds']]}")
    if result["agents_unexpected"]:
        print(f"  unexpected agent answers: {result['agents_unexpected']}")
    print(f"  load average before {tuple(round(x, 2) for x in result['load_average']['before'])}")


# --- the database ------------------------------------------------------------------------------


def _prepare(database_url: str, records: int) -> dict[str, Any]:
    """Migrate the bench database and fill it (in a process with Django set up on it)."""
    env = migrate(database_url)
    seeded = subprocess.run(
        [sys.executable, "-m", "bench.what_if", "_seed", str(records)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(seeded.stdout.strip().splitlines()[-1])
    return result


def seed_main(records: int) -> None:
    """`python -m bench.what_if _seed RECORDS`: the agents, the host's orders, a manager with a
    personal token, and 30 days of audit records with their held calls' confirmations."""
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.db import connection, transaction

    from approvals.reviewers import reviewer_token_create
    from dispatch.services import agent_create
    from orders.services import order_create

    with transaction.atomic():
        agents = [
            agent_create(
                name=f"bench-{name}",
                allowed_tools=["get_order", "refund_order"],
                max_amount_cents=50_000,
                auto_approve_below_cents=5_000,
                two_reviewers_from_cents=30_000,
            )[0].pk
            for name in ("asked", "b", "c")
        ]
        _, agent_token = agent_create(
            name="bench-host", allowed_tools=["get_order"], max_amount_cents=50_000
        )
        for customer in range(HOST_CUSTOMERS):
            for order in range(HOST_ORDERS):
                order_create(
                    order_id=f"ORD-9{customer:02d}{order:03d}",
                    customer_id=f"CUS-H{customer}",
                    total_cents=100_000,
                    currency="BRL",
                )
        manager = User.objects.create_user("bench-manager")
        manager.groups.add(Group.objects.get_or_create(name="managers")[0])
        manager_token = reviewer_token_create(user=manager)
    now = datetime.now(UTC)
    since = now - timedelta(days=DAYS)
    counts = _load_history(records, agents, since, now, random.Random(1234))
    with connection.cursor() as cursor:
        # Tables just filled by COPY have no statistics yet: the planner would guess.
        cursor.execute("ANALYZE")
    print(
        json.dumps(
            {
                "agent_token": agent_token,
                "manager_token": manager_token,
                "range": {"agent": agents[0], "since": since.isoformat(), "until": now.isoformat()},
                "records": records,
                **counts,
            }
        )
    )


def _load_history(
    records: int, agents: list[int], since: datetime, now: datetime, rng: random.Random
) -> dict[str, int]:

    from dispatch.models import Confirmation

    span = (now - since).total_seconds()
    moments = sorted(since + timedelta(seconds=rng.random() * span) for _ in range(records))
    statuses = [status for status, _ in FATES]
    weights = [share for _, share in FATES]
    audit = io.StringIO()
    held: list[Confirmation] = []
    refunds = judged = 0
    sent: list[tuple[str, str, int]] = []
    for n, at in enumerate(moments):
        call_id = f"{n:032x}"
        # The agent asked about sends half the traffic, the two others a quarter each.
        agent = agents[0] if rng.random() < 0.5 else rng.choice(agents[1:])
        customer = f"CUS-{rng.randrange(CUSTOMERS)}"
        code, confirmation_id = "OK", ""
        if rng.random() < REFUND_SHARE:
            refunds += 1
            judged += agent == agents[0]
            if sent and rng.random() < 0.03:
                # A repeat of an earlier refund from another conversation: a possible duplicate.
                customer, order, amount = rng.choice(sent[-500:])
            else:
                order = f"ORD-{rng.randrange(10**6)}"
                amount = int(rng.lognormvariate(7.6, 0.9)) // 10 * 10 + 10
            sent.append((customer, order, amount))
            tool = "refund_order"
            arguments = {
                "order_id": order,
                "amount_cents": amount,
                "currency": "BRL" if rng.random() < 0.8 else "USD",
                "reason": "damaged",
            }
            draw = rng.random()
            if amount > 50_000 or draw < 0.05:
                code = "POLICY_LIMIT"
            elif amount >= 5_000 or draw < 0.15:
                code, confirmation_id = "CONFIRMATION_REQUIRED", call_id
                held.append(_confirmation(call_id, agent, customer, at, arguments, now, rng))
                held[-1].status = rng.choices(statuses, weights)[0]
                _decide(held[-1], now, rng)
        else:
            tool, arguments = "get_order", {"order_id": f"ORD-{rng.randrange(10**6)}"}
        text = json.dumps(arguments)
        audit.write(
            "\t".join(
                [
                    call_id,
                    at.isoformat(),
                    str(agent),
                    f"s-{n}",
                    customer,
                    "1",
                    tool,
                    text.replace("\\", "\\\\"),
                    text.replace("\\", "\\\\"),
                    "",
                    "t" if code == "OK" else "f",
                    code,
                    "a message for the model",
                    "f",
                    confirmation_id,
                    "1",
                    "2.5",
                    "api",
                ]
            )
            + "\n"
        )
    audit_copy(audit.getvalue())
    Confirmation.objects.bulk_create(held, batch_size=2_000)
    return {"refunds": refunds, "judged": judged, "held": len(held)}


def _confirmation(
    call_id: str,
    agent: int,
    customer: str,
    at: datetime,
    arguments: dict[str, Any],
    now: datetime,
    rng: random.Random,
) -> Any:
    from dispatch.models import Confirmation

    amount = int(arguments["amount_cents"])
    return Confirmation(
        id=call_id,
        key=f"{int(call_id, 16):064x}",
        tool="refund_order",
        arguments=arguments,
        arguments_hash="0" * 64,
        agent_id=agent,
        session_id=f"s-{int(call_id, 16)}",
        customer_id=customer,
        policy_version=1,
        reviewers_required=2 if amount >= 30_000 else 1,
        amount_cents=amount,
        created_at=at,
        expires_at=at + timedelta(hours=24),
    )


def _decide(held: Any, now: datetime, rng: random.Random) -> None:
    """The decision's and the execution's times its status needs: minutes to hours after the
    hold, before its expiry and before now; expired when its day is over, pending until then."""
    if held.status in {"pending", "expired"}:
        held.status = "expired" if held.expires_at <= now else "pending"
        # The periodic sweep marks it within a minute of its expiry.
        held.decided_at = (
            held.expires_at + timedelta(seconds=30) if held.status == "expired" else None
        )
        return
    waited = timedelta(minutes=min(rng.lognormvariate(3.0, 1.1), 23 * 60))
    held.decided_at = min(held.created_at + waited, now)
    if held.status in {"executed", "failed", "unknown"}:
        held.executing_since = held.decided_at
        held.finished_at = held.decided_at + timedelta(seconds=rng.uniform(0.2, 3))


if __name__ == "__main__":
    if sys.argv[1:2] == ["_agents"]:
        agents_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1:2] == ["_seed"]:
        seed_main(int(sys.argv[2]))
    else:
        main()
