"""The mix of benchmark (b): every session's 20 calls, the same in every run, and what each gets.

Sessions are numbered; session `number` is one conversation of customer `number % 64`, so the
load process, the seeding and the report agree on it without talking to each other. A run never
sends two sessions of the same number (each phase starts where the one before stopped).

A refund runs without a human only while it does not repeat an executed one (same order, same
amount) from another session (dispatch/pipeline/allowance.py). So a session's six refund amounts
are its own: session `number` refunds 1.00 BRL plus `6 * (number // 64)` to `5` cents, which no
other session of its customer does; within the session they are distinct, so that no refund is a
replay of another. What the customer was refunded in all stays below the agent's auto-approve
amount, which is above the seeded orders' totals (bench/api/server.py).
"""

from __future__ import annotations

import json
import random
from typing import Any

CUSTOMERS = 64
ORDERS_PER_CUSTOMER = 8
FIRST_REFUND_CENTS = 100

SESSION_CALLS = 20
SESSION_MIX = (("get_order", 10), ("refund", 6), ("replay", 1), ("bad", 3))
SESSION_REFUNDS = dict(SESSION_MIX)["refund"]
BAD_KINDS = (
    "invalid_json",
    "float_amount",
    "wrong_currency",
    "invented_order",
    "extra_field",
    "unknown_tool",
)
EXPECT = {
    "get_order": "OK",
    "refund": "OK",
    "replay": "OK (replayed)",
    "invalid_json": "INVALID_JSON",
    "float_amount": "INVALID_ARGUMENTS",
    "wrong_currency": "CURRENCY_MISMATCH",
    "invented_order": "ORDER_NOT_FOUND",
    "extra_field": "INVALID_ARGUMENTS",
    "unknown_tool": "UNKNOWN_TOOL",
}


def customer_id(number: int) -> str:
    return f"CUS-{number + 1}"


def order_ids(customer: int) -> list[str]:
    first = 100_000 + customer * ORDERS_PER_CUSTOMER
    return [f"ORD-{first + n}" for n in range(ORDERS_PER_CUSTOMER)]


def _args(**values: Any) -> str:
    return json.dumps(values)


def _session_kinds(rng: random.Random, number: int) -> list[str]:
    """The session's 20 kinds of call: the bad ones in turn, shuffled, the replay after a refund."""
    kinds = [kind for kind, times in SESSION_MIX for _ in range(times)]
    bad_turn = number * 3
    for position, kind in enumerate(kinds):
        if kind == "bad":
            kinds[position] = BAD_KINDS[bad_turn % len(BAD_KINDS)]
            bad_turn += 1
    rng.shuffle(kinds)
    replay, first = kinds.index("replay"), kinds.index("refund")
    if first > replay:
        kinds[first], kinds[replay] = kinds[replay], kinds[first]
    return kinds


def session_calls(seed: int, tag: str, number: int) -> list[tuple[str, bytes]]:
    """Session `number` of the mix: 20 (kind, request body) pairs, the same for every run."""
    rng = random.Random(seed * 1_000_003 + number)
    customer = number % CUSTOMERS
    orders = order_ids(customer)
    kinds = _session_kinds(rng, number)
    lookups = rng.sample(orders, len(orders))
    # The customer's sessions take turns at their amounts (see the docstring).
    first = FIRST_REFUND_CENTS + SESSION_REFUNDS * (number // CUSTOMERS)
    amounts = rng.sample(range(first, first + SESSION_REFUNDS), SESSION_REFUNDS)
    refunds: list[str] = []
    session_id = f"bench-{tag}-{number}"
    calls: list[tuple[str, bytes]] = []
    looked_up = 0
    for kind in kinds:
        order_id = rng.choice(orders)
        tool = "refund_order"
        if kind == "get_order":
            tool, arguments = "get_order", _args(order_id=lookups[looked_up % len(lookups)])
            looked_up += 1
        elif kind == "refund":
            arguments = _args(
                order_id=order_id, amount_cents=amounts.pop(), currency="BRL", reason="damaged"
            )
            refunds.append(arguments)
        elif kind == "replay":
            arguments = rng.choice(refunds)
        elif kind == "invalid_json":
            arguments = '{"order_id": "' + order_id + '", "amount_cents": 12'
        elif kind == "float_amount":
            arguments = _args(
                order_id=order_id, amount_cents=25.9, currency="BRL", reason="damaged"
            )
        elif kind == "wrong_currency":
            arguments = _args(order_id=order_id, amount_cents=990, currency="USD", reason="damaged")
        elif kind == "invented_order":
            tool, arguments = "get_order", _args(order_id=f"ORD-9{number:08d}")
        elif kind == "extra_field":
            tool, arguments = "get_order", _args(order_id=order_id, include="history")
        elif kind == "unknown_tool":
            tool, arguments = "teleport_order", _args(order_id=order_id)
        else:  # pragma: no cover - the mix above is closed
            raise AssertionError(kind)
        body = {
            "session_id": session_id,
            "customer_id": customer_id(customer),
            "tool": tool,
            "arguments": arguments,
        }
        calls.append((kind, json.dumps(body, separators=(",", ":")).encode()))
    return calls
