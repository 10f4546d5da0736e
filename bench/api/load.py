"""The load of benchmark (b): a separate process (`python -m bench.api _load`), stdlib only.

Raw sockets keep the client cheap. A fixed number of threads, each with one keep-alive HTTP/1.1
connection, send the mix's sessions in a closed loop (a request as soon as the previous answer
arrived), for a warm-up and then a measured window; each thread is also capped in requests. The
process prints "ready", waits for the parent's common start time, and prints its results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.api.mix import session_calls

API_PATH = "/api/v1/calls"
BARE_PATH = "/bench/bare"
TARGETS = {"bare": BARE_PATH, "api": API_PATH}
# A phase whose one connection sends every session to both targets in turn (see _load_thread).
PAIRED = "paired"


class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1, on a raw socket: the client stays cheap."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def open(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        sock = self.open()
        sock.sendall(request)
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before the response head")
            data += chunk
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = -1, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length < 0:
            raise ConnectionError("response without Content-Length")
        body = data[end + 4 :]
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed in the response body")
            body += chunk
        if close:
            self.close()
        return status, body


def request_head(path: str, port: int, token: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Token {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json\r\n"
    ).encode()


def outcome_of(body: bytes, target: str) -> str:
    """The result code of an answer, found without parsing JSON (the client must stay cheap)."""
    if target == "bare":
        return "bare" if b'"ok":true' in body else "unexpected bare answer"
    start = body.find(b'"code":"')
    if start < 0:
        return "no code"
    start += 8
    code = body[start : body.find(b'"', start)].decode()
    return f"{code} (replayed)" if b'"replayed":true' in body else code


@dataclass
class _ThreadResult:
    latencies_us: list[int]
    # The same latencies by kind of call (get_order, refund, ...).
    by_kind_us: dict[str, list[int]] = field(default_factory=dict)
    sent: int = 0
    errors: int = 0
    first_error: str = ""
    last_end_ns: int = 0
    # The number after the last session this thread began (the next phase starts above it).
    next_session: int = 0


def _load_thread(
    *,
    heads: Mapping[str, bytes],
    port: int,
    seed: int,
    tag: str,
    index: int,
    stride: int,
    window_ns: tuple[int, int],
    cap: int,
    outcomes: Mapping[str, Counter[tuple[str, str]]],
    out: Mapping[str, _ThreadResult],
) -> None:
    """Send the mix's sessions in order, each session to every target in `heads`.

    With two targets (a paired phase), each session goes to both, one after the other on the
    same connection (20 calls, about 0.1 s), the first of the two taking turns: drift in the
    machine's speed, which moves over seconds, then hits both targets alike. Whole sessions
    rather than single calls, so that what a request leaves to do after its answer (the
    worker's and the database's) falls mostly on a request to the same target.
    """
    begin, end = window_ns
    connection = Connection(port)
    number = index
    clock = time.monotonic_ns
    order = list(heads)
    try:
        while True:
            calls = session_calls(seed, tag, number)
            turn = number // stride % len(order)
            for result in out.values():
                result.next_session = number + 1
            number += stride
            for target in order[turn:] + order[:turn]:
                result, head = out[target], heads[target]
                for kind, body in calls:
                    request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
                    started = clock()
                    if started >= end or len(result.latencies_us) >= cap:
                        return
                    try:
                        status, answer = connection.exchange(request)
                    except (OSError, ValueError) as exc:
                        connection.close()
                        result.errors += 1
                        result.first_error = result.first_error or f"{type(exc).__name__}: {exc}"
                        continue
                    finished = clock()
                    result.sent += 1
                    if started >= begin:
                        latency = (finished - started) // 1000
                        result.latencies_us.append(latency)
                        result.by_kind_us.setdefault(kind, []).append(latency)
                        result.last_end_ns = finished
                        outcome = outcome_of(answer, target) if status == 200 else f"HTTP {status}"
                        outcomes[target][kind, outcome] += 1
    finally:
        connection.close()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _target_report(
    results: Sequence[_ThreadResult], outcomes: Sequence[Counter[tuple[str, str]]], begin: int
) -> dict[str, Any]:
    """What a load process's threads measured of one target, as JSON for the parent."""
    merged: Counter[tuple[str, str]] = Counter()
    for counter in outcomes:
        merged.update(counter)
    return {
        "latencies_us": [value for result in results for value in result.latencies_us],
        "by_kind_us": {
            kind: [value for result in results for value in result.by_kind_us.get(kind, [])]
            for kind in sorted({kind for result in results for kind in result.by_kind_us})
        },
        "sent": sum(result.sent for result in results),
        "errors": sum(result.errors for result in results),
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "last_end_ns": max((result.last_end_ns for result in results), default=begin),
        "next_session": max((result.next_session for result in results), default=0),
        "outcomes": [[kind, outcome, count] for (kind, outcome), count in merged.items()],
    }


def _load_options(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.api _load")
    parser.add_argument("--target", choices=[*sorted(TARGETS), PAIRED], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument(
        "--first-index", type=int, required=True, help="the first thread's session number"
    )
    parser.add_argument("--stride", type=int, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--cap", type=int, required=True, help="measured requests per thread")
    return parser.parse_args(argv)


def sleep_until(moment_ns: int) -> None:
    time.sleep(max(0.0, (moment_ns - time.monotonic_ns()) / 1e9))


def _load_threads(
    options: argparse.Namespace,
    heads: Mapping[str, bytes],
    window_ns: tuple[int, int],
    outcomes: Sequence[Mapping[str, Counter[tuple[str, str]]]],
    results: Sequence[Mapping[str, _ThreadResult]],
) -> list[threading.Thread]:
    return [
        threading.Thread(
            target=_load_thread,
            kwargs={
                "heads": heads,
                "port": options.port,
                "seed": options.seed,
                "tag": options.tag,
                "index": options.first_index + offset,
                "stride": options.stride,
                "window_ns": window_ns,
                "cap": options.cap,
                "outcomes": outcomes[offset],
                "out": results[offset],
            },
            daemon=True,
        )
        for offset in range(options.threads)
    ]


def load_main(argv: Sequence[str]) -> None:
    """`python -m bench.api _load ...`: one client process; prints its results as JSON."""
    options = _load_options(argv)
    targets = list(TARGETS) if options.target == PAIRED else [options.target]
    heads = {
        target: request_head(TARGETS[target], options.port, options.token) for target in targets
    }
    print("ready", flush=True)
    # The parent answers with the common start time (CLOCK_MONOTONIC, shared by processes).
    start_ns = int(sys.stdin.readline().split()[1])
    begin = start_ns + int(options.warmup * 1e9)
    end = begin + int(options.duration * 1e9)
    outcomes: list[dict[str, Counter[tuple[str, str]]]] = [
        {target: Counter() for target in targets} for _ in range(options.threads)
    ]
    results = [
        {target: _ThreadResult(latencies_us=[]) for target in targets}
        for _ in range(options.threads)
    ]
    threads = _load_threads(options, heads, (begin, end), outcomes, results)
    sleep_until(start_ns)
    for thread in threads:
        thread.start()
    sleep_until(begin)
    cpu_begin = _cpu_seconds()
    sleep_until(end)
    cpu_window = _cpu_seconds() - cpu_begin
    for thread in threads:
        thread.join()
    report: dict[str, Any] = {
        "window_begin_ns": begin,
        "cpu_seconds": cpu_window,
        "by_target": {
            target: _target_report(
                [result[target] for result in results],
                [counter[target] for counter in outcomes],
                begin,
            )
            for target in targets
        },
    }
    json.dump(report, sys.stdout)
