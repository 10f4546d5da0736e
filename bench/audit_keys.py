"""The keyed audit chain's cost: each call with its link's MAC against the same call without it.

The audit key (docs/audit.md) adds to each call one HMAC-SHA256 of its link's hash and a column
of 68 characters to its audit record's INSERT; to `verify_audit`, one HMAC per link. Measured in
one run, alternating:

- per link, in-process: `link_hash` of a refund's audit record alone, then with `audit_mac`;
- per call, end to end on PostgreSQL (a database of its own, migrated here): `call_dispatch` of
  `get_order` and of a refund below the auto-approve amount, through the ORM store, with the MAC
  and with the store's `audit_mac` replaced by one that returns "" (what a record cost before);
- per link verified: `verify_chain` over the calls' records with the keys and without.

Each side runs in rounds that alternate; the figure is the median round, with the rounds' range.

Run: `.venv/bin/python -m bench.audit_keys [--calls N] [--rounds R] [--pg-url URL]
[--database NAME] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest.mock import patch

from bench.analytics import _drop, _recreate

KEY = "bench:bench-only-audit-key-never-used-in-production"
SESSION = 20


def _rounds(sides: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each side's figure per round, the sides alternating within every round."""
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, side in sides.items():
            figures[name].append(side())
    return figures


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def _per_link(rounds: int, links: int) -> dict[str, list[float]]:
    from datetime import UTC, datetime

    from dispatch.audit_keys import audit_mac
    from dispatch.pipeline.audit_chain import GENESIS, link_hash

    fields = {
        "call_id": "5f0c3b1e9d2a4c7b8e6f1a2b3c4d5e6f",
        "at": datetime(2026, 12, 6, 5, 0, tzinfo=UTC),
        "agent_id": 1,
        "session_id": "s-1",
        "customer_id": "CUS-1",
        "step": 3,
        "tool": "refund_order",
        "raw_arguments": '{"order_id": "ORD-1001", "amount_cents": 2590, "currency": "BRL", '
        '"reason": "damaged"}',
        "arguments": {
            "order_id": "ORD-1001",
            "amount_cents": 2590,
            "currency": "BRL",
            "reason": "damaged",
        },
        "key": "k-1",
        "ok": True,
        "code": "OK",
        "message": "Refunded 25.90 BRL on ORD-1001.",
        "replayed": False,
        "confirmation_id": "",
        "policy_version": 1,
        "duration_ms": 1.25,
        "channel": "api",
    }

    def without() -> float:
        start = time.perf_counter()
        for seq in range(1, links + 1):
            link_hash(chain="audit:1:s-1", seq=seq, previous=GENESIS, fields=fields)
        return (time.perf_counter() - start) / links * 1e6

    def keyed() -> float:
        start = time.perf_counter()
        for seq in range(1, links + 1):
            audit_mac(link_hash(chain="audit:1:s-1", seq=seq, previous=GENESIS, fields=fields))
        return (time.perf_counter() - start) / links * 1e6

    def mac_alone() -> float:
        linked = link_hash(chain="audit:1:s-1", seq=1, previous=GENESIS, fields=fields)
        start = time.perf_counter()
        for _ in range(links):
            audit_mac(linked)
        return (time.perf_counter() - start) / links * 1e6

    return _rounds({"without": without, "with": keyed, "mac": mac_alone}, rounds)


def _per_call(rounds: int, calls: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from django.db import connection

    from dispatch.audit import audit_verify, chain_sources
    from dispatch.audit_keys import audit_mac
    from dispatch.pipeline.audit_chain import OWN_HEAD, Link, verify_chain
    from dispatch.services import agent_create, call_dispatch
    from dispatch.store import state
    from orders.models import Order

    agent, _ = agent_create(
        name="bench-keys",
        allowed_tools=["get_order", "refund_order"],
        max_amount_cents=10_000_000,
        auto_approve_below_cents=10_000_000_000,
    )
    sessions = iter(range(10**9))
    keyed_mac = audit_mac

    def run(mac: Callable[[str], str]) -> float:
        # Sessions of 20 calls (within the step budget), each on 10 orders of its customer: a
        # get_order and a refund of each, no call repeating another.
        work = []
        for _ in range(max(1, calls // SESSION)):
            number = next(sessions)
            orders = [
                Order.objects.create(
                    order_id=f"ORD-{number * 100 + n}",
                    customer_id=f"CUS-{number}",
                    total_cents=10**9,
                    currency="BRL",
                )
                for n in range(SESSION // 2)
            ]
            work.append((f"s-{number}", orders))
        with patch.object(state, "audit_mac", mac):
            return _timed(work)

    def _timed(work: list[tuple[str, list[Order]]]) -> float:
        start = time.perf_counter()
        for session, orders in work:
            for order in orders:
                for tool, arguments in (
                    ("get_order", {"order_id": order.order_id}),
                    (
                        "refund_order",
                        {
                            "order_id": order.order_id,
                            "amount_cents": 100,
                            "currency": "BRL",
                            "reason": "damaged",
                        },
                    ),
                ):
                    result = call_dispatch(
                        agent=agent,
                        session_id=session,
                        customer_id=order.customer_id,
                        tool=tool,
                        arguments=json.dumps(arguments),
                    )
                    assert result.ok, result.message
        return (time.perf_counter() - start) / (len(work) * SESSION) * 1e6

    run(keyed_mac)  # warm: the first round pays for the connection and the caches
    figures = _rounds(
        {"without": lambda: run(lambda _: ""), "with": lambda: run(keyed_mac)}, rounds
    )

    # The calls' records as verify_audit reads them; the ones written without a MAC left out.
    records = next(source for source in chain_sources() if source.name == "audit records")
    chains: dict[str, list[Link]] = {}
    for name, link in records.links():
        if (link.mac or "").startswith("bench:"):
            chains.setdefault(name, []).append(link)
    walked = sum(len(chain) for chain in chains.values())
    keys = {"bench": KEY.partition(":")[2].encode()}

    def verify(with_keys: bool) -> float:
        start = time.perf_counter()
        for name, links in chains.items():
            for item in verify_chain(name, links, OWN_HEAD, None, keys if with_keys else None):
                assert isinstance(item, Link), item
        return (time.perf_counter() - start) / walked * 1e6

    verified = _rounds(
        {"without": lambda: verify(False), "with": lambda: verify(True)}, max(rounds, 5)
    )
    # The command as it runs: the keyed links verify, the others are named.
    assert audit_verify().findings, "the links written without a MAC should be named"
    connection.close()
    return figures, verified


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.audit_keys", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls a round (default 400)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--links", type=int, default=20_000, help="links a round, in-process")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="toolgate_bench_audit_keys")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    options = parser.parse_args(argv)

    _recreate(options.pg_url, options.database)
    os.environ.update(
        {
            "DATABASE_URL": f"{options.pg_url}/{options.database}",
            "DJANGO_SETTINGS_MODULE": "toolgate.settings.local",
            "DEBUG": "False",
            "TOOLGATE_AUDIT_KEYS": KEY,
            "CELERY_BROKER_URL": "",
        }
    )
    import django
    from django.core.management import call_command

    django.setup()
    try:
        call_command("migrate", verbosity=0)
        per_link = _per_link(options.rounds, options.links)
        per_call, verified = _per_call(options.rounds, options.calls)
    finally:
        from django.db import connections

        connections.close_all()
        _drop(options.pg_url, options.database)

    result = {
        "link_us": {side: _summary(values) for side, values in per_link.items() if side != "mac"},
        "call_us": {side: _summary(values) for side, values in per_call.items()},
        "verify_us": {side: _summary(values) for side, values in verified.items()},
        "calls": options.calls,
        "rounds": options.rounds,
    }
    added = {
        name: statistics.median(
            keyed - plain for keyed, plain in zip(figures["with"], figures["without"], strict=True)
        )
        for name, figures in (("link", per_link), ("call", per_call), ("verify", verified))
    }
    result["added_us"] = added
    result["mac_us"] = _summary(per_link["mac"])
    if options.json:
        print(json.dumps(result, indent=2))
    elif not options.quiet:
        mac = result["mac_us"]
        print(
            f"the MAC alone (audit_mac): {mac['median']:.2f} µs "
            f"({mac['low']:.2f}-{mac['high']:.2f})"
        )
        for name, label in (
            ("link", "a link's hash, in-process"),
            ("call", "a call end to end (get_order and refunds, PostgreSQL)"),
            ("verify", "a link verified"),
        ):
            figures = result[f"{name}_us"]
            print(
                f"{label}: with the MAC {figures['with']['median']:.2f} µs "
                f"({figures['with']['low']:.2f}-{figures['with']['high']:.2f}), without "
                f"{figures['without']['median']:.2f} µs ({figures['without']['low']:.2f}-"
                f"{figures['without']['high']:.2f}); added {added[name]:+.2f} µs (paired median)"
            )
    return result


if __name__ == "__main__":
    main()
