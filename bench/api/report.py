"""What benchmark (b) reports: the phases summed up per target, judged against the targets, printed.

Targets: the api's throughput at least 0.7 of the bare endpoint's, and its p50 at most 1 ms above,
judged at 1 connection (at 8, both are saturated and a p50 is mostly queueing).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from bench.api.mix import BAD_KINDS, EXPECT, session_calls
from bench.core import python_build

TARGET_RATIO = 0.85
TARGET_P50_DELTA_MS = 0.8
# A refund does more than any other call (its reservation, the ledger): its own line, paired.
TARGET_REFUND_P50_DELTA_MS = 1.5
# PostgreSQL's CPU per api request over bare's.
TARGET_DATABASE_CPU_RATIO = 2.0


# --- the figures -----------------------------------------------------------------------------


def merge_by_kind(parts: Iterator[Mapping[str, list[int]]]) -> dict[str, list[int]]:
    """Latencies by kind of call, from several reports or phases, into one."""
    merged: dict[str, list[int]] = {}
    for part in parts:
        for kind, values in part.items():
            merged.setdefault(kind, []).extend(values)
    return merged


def _percentile(ordered: Sequence[int], q: float) -> float:
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] / 1000.0


def _cpu_figures(cpu: Mapping[str, float], requests: int) -> dict[str, float]:
    """Cores busy on average over the measured windows, and CPU time per request."""
    window = cpu["window_s"] or 1.0
    per_request = 1e6 / max(requests, 1)
    busy = cpu["machine_busy_s"]
    ours = cpu["server_s"] + cpu["database_s"] + cpu["client_s"]
    return {
        "server_cores": cpu["server_s"] / window,
        "database_cores": cpu["database_s"] / window,
        "client_cores": cpu["client_s"] / window,
        "machine_busy_cores": busy / window,
        "other_cores": max(0.0, busy - ours) / window,
        "server_us_per_request": cpu["server_s"] * per_request,
        "database_us_per_request": cpu["database_s"] * per_request,
        "client_us_per_request": cpu["client_s"] * per_request,
    }


def summarise(target: str, phases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    ordered = sorted(value for phase in phases for value in phase["latencies_us"])
    seconds = sum(phase["seconds"] for phase in phases)
    outcomes: Counter[tuple[str, str]] = Counter()
    cpu: Counter[str] = Counter()
    for phase in phases:
        outcomes.update(phase["outcomes"])
        cpu.update(phase["cpu"])
    requests = len(ordered)
    by_kind = merge_by_kind(phase["by_kind_us"] for phase in phases)
    unexpected = sum(
        count
        for (kind, outcome), count in outcomes.items()
        if outcome != (EXPECT[kind] if target == "api" else "bare")
    )
    return {
        "requests": requests,
        "seconds": seconds,
        "calls_per_s": requests / seconds if seconds else 0.0,
        "p50_ms": _percentile(ordered, 0.50),
        "p90_ms": _percentile(ordered, 0.90),
        "p99_ms": _percentile(ordered, 0.99),
        "max_ms": ordered[-1] / 1000.0 if ordered else math.nan,
        "mean_ms": sum(ordered) / requests / 1000.0 if requests else math.nan,
        "p50_ms_by_kind": {
            kind: _percentile(sorted(values), 0.50) for kind, values in sorted(by_kind.items())
        },
        "errors": sum(phase["errors"] for phase in phases),
        "first_error": next((p["first_error"] for p in phases if p["first_error"]), ""),
        "unexpected_outcomes": unexpected,
        "outcomes": {
            f"{kind}: {outcome}": count for (kind, outcome), count in sorted(outcomes.items())
        },
        "cpu": _cpu_figures(cpu, requests),
    }


def _refund_delta(phase: Mapping[str, Any]) -> float:
    """A refund's p50 over bare's p50 in the same phase (bare does the same for every call)."""
    if not phase:
        return math.nan
    refund = phase["api"]["p50_ms_by_kind"].get("refund")
    return math.nan if refund is None else float(refund - phase["bare"]["p50_ms"])


def _cpu_per_request(figures: Mapping[str, Any]) -> float:
    cpu = figures["cpu"]
    return float(cpu["server_us_per_request"] + cpu["database_us_per_request"])


def _deltas_by_round(
    bare: Sequence[Mapping[str, Any]], api: Sequence[Mapping[str, Any]]
) -> list[float]:
    """The p50 added in each round, from the round's phase of each target."""
    return [
        _percentile(sorted(api_phase["latencies_us"]), 0.5)
        - _percentile(sorted(bare_phase["latencies_us"]), 0.5)
        for bare_phase, api_phase in zip(bare, api, strict=True)
    ]


def _paired(phases: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    paired: dict[str, Any] = {
        "bare": summarise("bare", phases["bare_paired"]),
        "api": summarise("api", phases["api_paired"]),
    }
    for figures in paired.values():
        # The phase's CPU is both targets' together: per request of one, it would mislead.
        del figures["cpu"]
    paired["p50_delta_ms"] = paired["api"]["p50_ms"] - paired["bare"]["p50_ms"]
    paired["p50_delta_ms_by_round"] = _deltas_by_round(phases["bare_paired"], phases["api_paired"])
    return paired


def _setup(
    options: argparse.Namespace, server_version: str, load_before: Sequence[float]
) -> dict[str, Any]:
    return {
        "gunicorn": f"{options.workers} {options.worker_class} workers"
        + (f" x {options.threads} threads" if options.worker_class == "gthread" else ""),
        "concurrency": options.concurrency,
        "client_processes": options.client_processes,
        "rounds": options.rounds,
        "seconds_per_round": options.duration,
        "latency_seconds_per_round": options.latency,
        "paired_seconds_per_round": options.paired,
        "warmup_s": options.warmup,
        "database": f"{server_version}, CONN_MAX_AGE 600, database {options.database}"
        + (
            ", client-side binding, nothing prepared"
            if options.client_side_binding
            else ", server-side binding, prepared statements"
        ),
        "python": python_build(),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
        "load_average_before": [round(value, 2) for value in load_before],
        "load_average_after": [round(value, 2) for value in os.getloadavg()],
    }


def _mix_per_session(seed: int) -> dict[str, int]:
    kinds = Counter(kind for kind, _ in session_calls(seed, "mix", 0))
    return {
        **{kind: n for kind, n in kinds.items() if kind not in BAD_KINDS},
        "bad (in turn)": sum(n for kind, n in kinds.items() if kind in BAD_KINDS),
    }


def result_of(
    options: argparse.Namespace,
    *,
    phases: Mapping[str, Sequence[Mapping[str, Any]]],
    sent: Mapping[str, int],
    counts: Mapping[str, int],
    server_version: str,
    load_before: Sequence[float],
    statements: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run's figures, as `main` returns them and `--json` prints them."""
    bare, api = summarise("bare", phases["bare"]), summarise("api", phases["api"])
    ratio = api["calls_per_s"] / bare["calls_per_s"] if bare["calls_per_s"] else math.nan
    loaded_delta = api["p50_ms"] - bare["p50_ms"]
    single: dict[str, Any] = {}
    if options.latency > 0:
        single = {
            "bare": summarise("bare", phases["bare_1"]),
            "api": summarise("api", phases["api_1"]),
        }
    delta = single["api"]["p50_ms"] - single["bare"]["p50_ms"] if single else loaded_delta
    paired = _paired(phases) if options.paired > 0 else {}
    cpu_ratio = _cpu_per_request(bare) / _cpu_per_request(api)
    database_cpu_ratio = (
        api["cpu"]["database_us_per_request"] / bare["cpu"]["database_us_per_request"]
        if bare["cpu"]["database_us_per_request"]
        else math.nan
    )
    refund_delta = _refund_delta(paired or single)
    return {
        "benchmark": "api",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "setup": _setup(options, server_version, load_before),
        "mix_per_session": _mix_per_session(options.seed),
        "bare": bare,
        "api": api,
        "ratio": ratio,
        # Bare's CPU per request (gunicorn + PostgreSQL) over the api's: the throughput ratio
        # on a machine that runs nothing else, where both are CPU-bound.
        "cpu_ratio": cpu_ratio,
        # The same for the gunicorn workers alone: the ratio when PostgreSQL has CPUs of its own.
        "app_cpu_ratio": bare["cpu"]["server_us_per_request"] / api["cpu"]["server_us_per_request"],
        # PostgreSQL's CPU per api request over bare's.
        "database_cpu_ratio": database_cpu_ratio,
        # A refund's p50 over bare's, paired where the run has a paired phase.
        "refund_p50_delta_ms": refund_delta,
        "p50_delta_ms_loaded": loaded_delta,
        "single_connection": single,
        "p50_delta_ms": delta,
        # Round by round (each round's bare and api phases run back to back): how far the
        # machine's drift moves the figure within one run.
        "p50_delta_ms_by_round": _deltas_by_round(phases["bare_1"], phases["api_1"]),
        "paired": paired,
        "targets": {
            "ratio_at_least": TARGET_RATIO,
            "p50_delta_at_most_ms": TARGET_P50_DELTA_MS,
            "p50_delta_measured_at": "1 connection" if single else f"{options.concurrency}",
            "refund_p50_delta_at_most_ms": TARGET_REFUND_P50_DELTA_MS,
            "database_cpu_ratio_at_most": TARGET_DATABASE_CPU_RATIO,
            "ratio_met": ratio >= TARGET_RATIO,
            "p50_met": delta <= TARGET_P50_DELTA_MS,
            "refund_p50_met": refund_delta <= TARGET_REFUND_P50_DELTA_MS,
            "database_cpu_met": database_cpu_ratio <= TARGET_DATABASE_CPU_RATIO,
            "met": ratio >= TARGET_RATIO
            and delta <= TARGET_P50_DELTA_MS
            and refund_delta <= TARGET_REFUND_P50_DELTA_MS
            and database_cpu_ratio <= TARGET_DATABASE_CPU_RATIO,
        },
        # The statements that took most of PostgreSQL's time, over every phase (--statements).
        "statements": list(statements) if statements is not None else None,
        "checks": {
            **counts,
            "api_requests_sent": sent["api"],
            "bare_requests_sent": sent["bare"],
        },
    }


# --- printing --------------------------------------------------------------------------------


def _row(label: str, figures: Mapping[str, Any]) -> str:
    return (
        f"  {label:30}{figures['requests']:>9,}{figures['calls_per_s']:>9,.0f}"
        f"{figures['p50_ms']:>8.2f}{figures['p90_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
        f"{figures['errors'] + figures['unexpected_outcomes']:>8}"
    )


def _table_lines(result: Mapping[str, Any]) -> list[str]:
    """The setup, and a row per target at the fixed concurrency and at 1 connection."""
    setup, single = result["setup"], result["single_connection"]
    load = ", ".join(f"{value:.2f}" for value in setup["load_average_before"])
    load_after = ", ".join(f"{value:.2f}" for value in setup["load_average_after"])
    concurrency = setup["concurrency"]
    lines = [
        f"(b) API under gunicorn: {setup['gunicorn']}; {setup['rounds']} round(s) of "
        f"{setup['seconds_per_round']:g} s per target at {concurrency} keep-alive connections"
        + (f", then {setup['latency_seconds_per_round']:g} s at 1" if single else "")
        + f" ({result['date']})",
        f"  {setup['database']}; Python {setup['python']}, {setup['machine']}; "
        f"load average before {load}, after {load_after}",
        f"  {'':30}{'requests':>9}{'calls/s':>9}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
        f"{'errors':>8}",
        _row(f"bare endpoint, {concurrency} conns", result["bare"]),
        _row(f"POST /api/v1/calls, {concurrency} conns", result["api"]),
    ]
    if single:
        lines += [
            _row("bare endpoint, 1 conn", single["bare"]),
            _row("POST /api/v1/calls, 1 conn", single["api"]),
        ]
    return lines


def _target_lines(result: Mapping[str, Any]) -> list[str]:
    """The throughput ratio and the p50 added, against their targets."""
    targets = result["targets"]
    lines = [
        f"  throughput ratio api/bare: {result['ratio']:.2f} (target >= {TARGET_RATIO}: "
        f"{'met' if targets['ratio_met'] else 'NOT met'}); CPU per request, bare/api: "
        f"{result['cpu_ratio']:.2f} (gunicorn + postgres), {result['app_cpu_ratio']:.2f} "
        "(gunicorn alone)",
        f"  p50 added by the api: {result['p50_delta_ms']:+.2f} ms at "
        f"{targets['p50_delta_measured_at']} (target <= {TARGET_P50_DELTA_MS} ms: "
        f"{'met' if targets['p50_met'] else 'NOT met'}); {result['p50_delta_ms_loaded']:+.2f} ms "
        f"at {result['setup']['concurrency']} connections, where p50 is mostly queueing",
        f"  a refund's p50 added: {result['refund_p50_delta_ms']:+.2f} ms "
        f"{'paired' if result['paired'] else 'at 1 connection'} (target <= "
        f"{TARGET_REFUND_P50_DELTA_MS} ms: {'met' if targets['refund_p50_met'] else 'NOT met'}); "
        f"PostgreSQL's CPU per request, api/bare: {result['database_cpu_ratio']:.2f}x (target "
        f"<= {TARGET_DATABASE_CPU_RATIO:.0f}x: "
        f"{'met' if targets['database_cpu_met'] else 'NOT met'})",
    ]
    if result["p50_delta_ms_by_round"]:
        lines.append(
            "  p50 added round by round at 1 connection: "
            + ", ".join(f"{value:+.2f}" for value in result["p50_delta_ms_by_round"])
            + " ms"
        )
    return lines


def _paired_lines(paired: Mapping[str, Any]) -> list[str]:
    if not paired:
        return []
    return [
        _row("bare endpoint, paired", paired["bare"]),
        _row("POST /api/v1/calls, paired", paired["api"]),
        f"  p50 added, paired (one connection sends each session to both, in turn): "
        f"{paired['p50_delta_ms']:+.2f} ms; round by round: "
        + ", ".join(f"{value:+.2f}" for value in paired["p50_delta_ms_by_round"])
        + " ms",
    ]


def _by_kind_lines(single: Mapping[str, Any]) -> list[str]:
    if not single:
        return []
    # Every kind of call against the bare endpoint's p50 (it does the same for each): where
    # the mix's p50 falls depends on how the kinds' latencies interleave.
    base = single["bare"]["p50_ms"]
    by_kind = single["api"]["p50_ms_by_kind"]
    return [
        "  p50 added by kind at 1 connection: "
        + ", ".join(f"{kind} {value - base:+.2f}" for kind, value in by_kind.items())
    ]


def _cpu_lines(result: Mapping[str, Any]) -> list[str]:
    lines = []
    for label in ("bare", "api"):
        cpu = result[label]["cpu"]
        lines.append(
            f"  CPU {label:4}: gunicorn {cpu['server_cores']:.2f} cores "
            f"({cpu['server_us_per_request']:.0f} us/req), postgres {cpu['database_cores']:.2f} "
            f"({cpu['database_us_per_request']:.0f} us/req), client {cpu['client_cores']:.2f} "
            f"({cpu['client_us_per_request']:.0f} us/req), other processes "
            f"{cpu['other_cores']:.2f}"
        )
    return lines


def _statement_lines(result: Mapping[str, Any]) -> list[str]:
    statements = result.get("statements")
    if statements is None:
        return []
    requests = result["checks"]["api_requests_sent"] + result["checks"]["bare_requests_sent"]
    lines = [
        "  where PostgreSQL's time goes (pg_stat_statements, every phase; per request of either "
        f"target, {requests:,} in all):",
        "      calls/req  mean us  WAL B/call  statement",
    ]
    for row in statements:
        lines.append(
            f"      {row['calls'] / max(requests, 1):9.2f} {row['mean_us']:8.1f} "
            f"{row['wal_bytes_per_call']:11.0f}  {row['statement']}"
        )
    return lines


def _check_lines(result: Mapping[str, Any]) -> list[str]:
    """The api's outcomes, the database's counts, and any phase with errors or surprises."""
    checks, single, paired = result["checks"], result["single_connection"], result["paired"]
    lines = [
        "  api outcomes: "
        + ", ".join(f"{name} {count}" for name, count in result["api"]["outcomes"].items()),
        f"  checks: {checks['audit_records']} audit records for {checks['api_requests_sent']} "
        f"api requests; {checks['bare_rows']} bare rows for {checks['bare_requests_sent']} "
        f"bare requests; {checks['refunds']} refunds; orders whose ledger does not add up: "
        f"{checks['orders_whose_ledger_does_not_add_up']}",
    ]
    everything = [("bare", result["bare"]), ("api", result["api"])]
    if single:
        everything += [("bare, 1 conn", single["bare"]), ("api, 1 conn", single["api"])]
    if paired:
        everything += [("bare, paired", paired["bare"]), ("api, paired", paired["api"])]
    unexpected = sum(figures["unexpected_outcomes"] for _, figures in everything)
    lines.append(f"  answers whose code is not the one their kind must get: {unexpected}")
    for label, figures in everything:
        if figures["errors"] or figures["unexpected_outcomes"]:
            lines.append(
                f"  {label}: {figures['errors']} transport errors ({figures['first_error']}), "
                f"{figures['unexpected_outcomes']} answers with an unexpected outcome"
            )
    return lines


def render(result: Mapping[str, Any]) -> str:
    lines = [
        *_table_lines(result),
        *_target_lines(result),
        *_paired_lines(result["paired"]),
        *_by_kind_lines(result["single_connection"]),
        *_cpu_lines(result),
        *_statement_lines(result),
        *_check_lines(result),
    ]
    return "\n".join(lines)
