"""CPU time from /proc over a measured window: of the gunicorn workers, of the PostgreSQL backends
of the bench database, and of the whole machine (what other processes took skews a run)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.api.server import Server

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


def database_backends(pg_url: str, name: str) -> list[int]:
    import psycopg

    with psycopg.connect(f"{pg_url}/postgres", autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", [name]
        ).fetchall()
    return [int(row[0]) for row in rows]


@dataclass
class CpuSample:
    server: float
    database: float
    machine_busy: float
    machine_all: float

    @classmethod
    def take(cls, server: Server, backends: Sequence[int]) -> CpuSample:
        busy, everything = machine_cpu()
        return cls(process_cpu(server.workers()), process_cpu(backends), busy, everything)
